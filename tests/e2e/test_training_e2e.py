"""From `kubectl apply` to a finished training run through the operator, with a rank killed on the way.

The pods run as local processes (`process_kubelet`): real torch.distributed ranks on gloo, checkpoints on a
directory shared like a PVC, progress reported by rank 0 into the job's status. SIGKILL on rank 1 must make the
operator restart the whole gang, and the new gang must resume from the newest checkpoint and finish.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from zerotrain.operator.client.kube import Kube, path_of
from zerotrain.runtime.job.preemption import PEER_REQUEST

from .cluster import Cluster
from .conftest import Operator
from .process_kubelet import PodProcess, ProcessKubelet, is_alive
from .test_operator_e2e import JOBS, PLURAL, condition, job_manifest, wait_status

STEPS = 120
INTERVAL = 5
# A tiny GPT of examples/quickstart.yaml: ~25 ms a step on 2 cores, so the run lasts a few seconds and the
# fault lands mid-run. Steps 40 would end within a second of the first checkpoint, racing the kill.
TINY = {
    "entrypoint": "zerotrain.runtime.examples.gpt:build",
    "entrypointArgs": {"seq_len": 32, "batch_size": 4, "d_model": 32, "n_layers": 2, "n_heads": 2, "max_bytes": 100000},
    "replicas": 2,
    "nprocPerNode": 1,
    "zero": {"stage": 3, "unitModules": ["Block"]},
    "training": {"steps": STEPS, "seed": 0, "logEvery": 10},
    "checkpoint": {"claimName": "ckpt", "intervalSteps": INTERVAL, "keepLast": 2},
    "failurePolicy": {"backoffLimit": 2},
    "metrics": {"enabled": False},  # every pod runs on this host: per-rank metrics ports would collide
}
# The killed-rank test's steps are paced (every batch 0.5 s late, on every rank) so that the work a failure loses,
# some 19 steps after the newest checkpoint, is seconds long: the goodput ledger's `lost` is checked against it.
PACED_STEPS, PACED_INTERVAL, KILL_AFTER = 50, 20, 39
PACED = {
    **TINY,
    "entrypoint": "zerotrain.runtime.examples.slowed:build",
    "entrypointArgs": {**TINY["entrypointArgs"], "factor": 1.0, "data_seconds": 0.5},
    "training": {"steps": PACED_STEPS, "seed": 0, "logEvery": 1},
    "checkpoint": {"claimName": "ckpt", "intervalSteps": PACED_INTERVAL, "keepLast": 2},
}
PROGRESS = re.compile(r'"step": (\d+), .*?"elapsed_s": ([0-9.]+)')
RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")
START_S = 90.0  # two torch imports per pod (launcher, rank) on 2 shared cores
ROUND_STARTS = "starting the ranks again"  # a launcher's line as an in-place round begins (runtime.__main__)


def resumed_step(output: str) -> int:
    found = RESUMED.findall(output)
    assert len(found) == 1, f"expected one 'resumed from ... at step N' line, got {found}:\n{output[-3000:]}"
    return int(found[0][1])


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["InPlace", "Recreate"])
async def test_killed_rank_restarts_gang_which_resumes_and_finishes(
    cluster: Cluster, operator: Operator, kube: Kube, tmp_path: Path, strategy: str
) -> None:
    """Recreate: pod 1's container is killed (its launcher and rank), and every pod is created again. InPlace (the
    default): one rank of pod 1 is killed, its launcher lives, and both pods' launchers start their ranks again."""
    ns, name = cluster.namespace, "train"
    in_place = strategy == "InPlace"
    spec = {**PACED, "failurePolicy": {**PACED["failurePolicy"], "restartStrategy": strategy}}
    async with ProcessKubelet(cluster, name, tmp_path) as kubelet:
        await asyncio.to_thread(kube.request, "POST", path_of(JOBS, PLURAL, ns), job_manifest(name, ns, **spec))
        await wait_output(kubelet, f"{name}-worker-0", f'"step": {KILL_AFTER},', START_S)
        if in_place:
            await asyncio.to_thread(kubelet.kill_rank, f"{name}-worker-1")
        else:
            killed = await asyncio.to_thread(kubelet.kill, f"{name}-worker-1")
        killed_at = time.time()

        job = await wait_status(kube, ns, name, lambda s: s.get("restarts", {}).get("total") == 1)
        restarts = {"total": 1, "failures": 1, "byCause": {"Failed": 1}, "inPlace": int(in_place), "strategy": strategy}
        assert job["status"]["restarts"] == restarts, job["status"]
        # The new gang's first step, as soon as rank 0 prints it (its start includes skipping the 20 batches
        # already trained, each paced too).
        after = ROUND_STARTS if in_place else ""
        await wait_output(kubelet, f"{name}-worker-0", f'"step": {PACED_INTERVAL + 1},', START_S, gang=1, after=after)
        stepped_at = time.time()
        job = await wait_status(kube, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), START_S)
        first, second = kubelet.gang(0), kubelet.gang(1)
        # Checked before the harness's own teardown kills whatever is left.
        leftovers = [pid for p in first for pid, start in p.tree if is_alive(pid, start)]
        assert not kubelet.errors, kubelet.errors
    logs = "\n".join(f"--- {p.name} gang {p.gang} exit {p.exit_code}\n{p.output()[-3000:]}" for p in kubelet.pods)
    status: dict[str, Any] = job["status"]
    assert status["phase"] == "Succeeded", f"{status}\n{logs}"

    if in_place:  # the same launchers ran both rounds, and ended with the second
        assert len(first) == 2 and not second, logs
        assert all(p.exit_code == 0 and not p.deleted for p in first), logs
        assert all(ROUND_STARTS in p.output() for p in first), logs
        rounds = [p.output().split(ROUND_STARTS, 1) for p in sorted(first, key=lambda p: p.name)]
        olds, news = [r[0] for r in rounds], [r[1] for r in rounds]
    else:
        assert killed.exit_code == 128 + signal.SIGKILL, logs
        assert len(first) == 2 and len(second) == 2, logs
        assert not leftovers, f"processes of the first gang outlived its pods: {leftovers}"
        assert len(killed.tree) >= 2, "the launcher's rank process was not seen (and so not killed)"
        assert all(p.exit_code == 0 and not p.deleted for p in second), logs
        olds = [p.output() for p in sorted(first, key=lambda p: p.name)]
        news = [p.output() for p in second]

    steps = {resumed_step(out) for out in news}
    assert len(steps) == 1, f"the ranks resumed from different steps: {steps}"
    (resumed,) = steps
    assert resumed == PACED_INTERVAL, resumed
    assert not [out for out in olds if RESUMED.search(out)], "the first gang had nothing to resume from"
    # Rank 0 prints each checkpoint once committed; the first gang's last one is the newest the second could use.
    newest = max(int(n) for out in olds for n in re.findall(r'"checkpoint_step": (\d+)', out))
    assert resumed == newest, f"resumed from step {resumed}, but the newest checkpoint was step {newest}"

    assert status["step"] == PACED_STEPS
    assert status["lastCheckpoint"]["step"] == PACED_STEPS
    root = tmp_path / "pvc" / "ckpt"
    # runtime/checkpoints/checkpoint.py's layout: a fresh `step-N-<token>` directory per save.
    pattern = re.escape(str(root / f"step-{PACED_STEPS:08d}-")) + "[0-9a-f]{8}"
    assert re.fullmatch(pattern, status["lastCheckpoint"]["path"])
    # runtime/checkpoints/checkpoint.py's layout (not imported: it would load torch into the test process)
    kept = sorted(json.loads(m.read_text())["step"] for m in root.glob("step-*/COMMITTED"))
    assert kept == [2 * PACED_INTERVAL, PACED_STEPS], kept

    check_ledger(job, olds[0], killed_at, stepped_at)  # worker-0's first round: rank 0's
    # Healthy ranks, evenly paced: the straggler watch names no one (issue 49's no-false-alarm rule).
    assert not [p.name for p in kubelet.pods if "holds the gang back" in p.output()], logs


def check_ledger(job: dict[str, Any], first_rank0: str, killed_at: float, stepped_at: float) -> None:
    """status.goodput of the killed-rank run: its buckets sum to the job's wall time within 1%; `lost` is the
    steps the kill undid (those after the newest checkpoint) times the step time, within 10%; `restarting` runs
    from the kill to the new gang's first step."""
    ledger, status = job["status"]["goodput"], job["status"]
    seconds = ledger["seconds"]
    created = datetime.fromisoformat(job["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    ended = datetime.fromisoformat(status["completionTime"].replace("Z", "+00:00"))
    wall = (ended - created).total_seconds()
    assert abs(sum(seconds.values()) - ledger["wallSeconds"]) <= 0.01 * wall, ledger
    assert abs(ledger["wallSeconds"] - wall) <= max(0.01 * wall, 1.0), (ledger, wall)  # the API keeps whole seconds
    elapsed = {int(step): float(at) for step, at in PROGRESS.findall(first_rank0)}
    step_s = (elapsed[KILL_AFTER] - elapsed[PACED_INTERVAL]) / (KILL_AFTER - PACED_INTERVAL)
    lost = (KILL_AFTER - PACED_INTERVAL) * step_s
    assert abs(seconds["lost"] - lost) <= 0.1 * lost, (ledger, f"{lost:.2f} s expected: a step took {step_s:.3f} s")
    gap = stepped_at - step_s - killed_at  # to the beginning of the first step rank 0 printed the end of
    assert abs(seconds["restarting"] - gap) <= max(0.1 * gap, 1.0), (ledger, f"{gap:.2f} s from the kill to the step")
    # Not pending: the process kubelet starts a pod within a second of its creation, which the API keeps in whole
    # seconds, and a launcher's start read from /proc may be a second early: pending is often 0 here.
    assert seconds["starting"] > 0 and seconds["checkpointing"] > 0, ledger
    assert seconds["evaluating"] == 0, ledger
    # Everything else trained: the first gang's steps up to its checkpoint and the second gang's thirty.
    assert seconds["training"] >= (PACED_STEPS - (KILL_AFTER - PACED_INTERVAL)) * step_s * 0.9, ledger
    assert ledger["fractions"]["training"] == seconds["training"] / ledger["wallSeconds"], ledger


@pytest.mark.slow
async def test_a_preempted_pod_saves_its_step_and_the_next_gang_resumes_there(
    cluster: Cluster, operator: Operator, kube: Kube, tmp_path: Path
) -> None:
    ns, name = cluster.namespace, "preempt"
    # No checkpoint falls due before the end: whatever the second gang resumes from, SIGTERM saved. Long enough
    # (~15 s of steps) that the signal lands mid-run after the status shows step 10.
    steps = 600
    spec = {
        **TINY,
        "training": {**TINY["training"], "steps": steps},
        "checkpoint": {"claimName": "ckpt", "intervalSteps": 10_000, "keepLast": 2},
    }
    async with ProcessKubelet(cluster, name, tmp_path) as kubelet:
        await asyncio.to_thread(kube.request, "POST", path_of(JOBS, PLURAL, ns), job_manifest(name, ns, **spec))
        await wait_output(kubelet, f"{name}-worker-0", '"step": 10,', START_S)  # rank 0's progress, unlagged
        # Only pod 1 is signalled; pod 0's rank learns of it through the step's all-reduce and saves too.
        terminated = await asyncio.to_thread(kubelet.terminate, f"{name}-worker-1")
        job = await wait_status(kube, ns, name, lambda s: s.get("restarts", {}).get("total") == 1)
        # Pod 0 lives on (its ranks stopped for pod 1's signal): it is kept, and pod 1 alone is created again.
        kept = {"inPlace": 1, "strategy": "InPlace"}
        assert job["status"]["restarts"] == {"total": 1, "failures": 0, "byCause": {"Preempted": 1}, **kept}, job
        saved = job["status"]["lastCheckpoint"]
        job = await wait_status(kube, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), START_S)
        first, second = kubelet.gang(0), kubelet.gang(1)
        assert not kubelet.errors, kubelet.errors
    logs = "\n".join(f"--- {p.name} gang {p.gang} exit {p.exit_code}\n{p.output()[-2000:]}" for p in kubelet.pods)
    assert job["status"]["phase"] == "Succeeded", f"{job['status']}\n{logs}"
    assert terminated.exit_code == 0 and all(stopped_cleanly(p) for p in first), logs
    (resumed,) = {resumed_step(p.output()) for p in second}
    assert all(f"every rank stopped after step {resumed}, checkpoint" in p.output() for p in first), logs
    # The signalled pod's rank names the signal; pod 0's says it stopped for another rank's.
    outputs = {p.name: p.output() for p in first}
    assert f"SIGTERM; every rank stopped after step {resumed}" in outputs[f"{name}-worker-1"], logs
    assert f"{PEER_REQUEST}; every rank stopped after step {resumed}" in outputs[f"{name}-worker-0"], logs
    assert 10 <= resumed < steps and resumed == saved["step"], (resumed, saved, logs)
    assert job["status"]["step"] == steps


async def wait_output(
    kubelet: ProcessKubelet, pod: str, text: str, timeout: float, gang: int | None = None, after: str = ""
) -> None:
    """Until a container of `pod` (of gang `gang`, if given; any, when `after`) has printed `text` (after `after`,
    when given: the line a launcher prints as an in-place round begins)."""
    deadline = asyncio.get_running_loop().time() + timeout
    pods = lambda: kubelet.pods if gang is None or after else kubelet.gang(gang)  # noqa: E731
    seen = lambda out: after in out and text in out.split(after, 1)[1] if after else text in out  # noqa: E731
    while not any(p.name == pod and seen(p.output()) for p in pods()):
        late = asyncio.get_running_loop().time() >= deadline
        assert not late, f"{pod} did not print {text!r} in {timeout} s:\n" + "\n".join(
            f"--- {p.name} (gang {p.gang}, exit {p.exit_code})\n{p.output()[-2500:]}" for p in kubelet.pods
        )
        await asyncio.sleep(0.05)


def stopped_cleanly(pod: PodProcess) -> bool:
    """Exited 0, or had written its `preempted` termination message when the operator deleted its gang: this
    kubelet kills a deleted pod's processes at once (a real one sends SIGTERM first), so a loaded machine can catch
    a launcher that has reported but not yet exited."""
    log = pod.root / "termination-log"
    return pod.exit_code == 0 or (pod.deleted and log.is_file() and log.read_text().startswith("preempted:"))


@pytest.mark.slow
async def test_an_entry_point_the_pods_refuse_fails_the_job_with_their_line(
    cluster: Cluster, operator: Operator, kube: Kube, tmp_path: Path
) -> None:
    """The operator imports no torch, so admission cannot bind entrypointArgs; each pod's launcher does, before any
    rank starts, and the job's condition is its line: not a rank failure, no back-off spent."""
    ns, name = cluster.namespace, "refused"
    misspelt = {**TINY, "entrypointArgs": {**TINY["entrypointArgs"], "n_layer": 2}}  # build() takes n_layers
    async with ProcessKubelet(cluster, name, tmp_path) as kubelet:
        await asyncio.to_thread(kube.request, "POST", path_of(JOBS, PLURAL, ns), job_manifest(name, ns, **misspelt))
        job = await wait_status(kube, ns, name, lambda s: s.get("phase") == "Failed", START_S)
        assert not kubelet.errors, kubelet.errors
    failed = condition(job, "Failed")
    assert failed is not None and failed["reason"] == "InvalidConfig", job["status"]
    assert "refused the job before any rank started: spec.entrypointArgs: got" in failed["message"], failed
    assert "unexpected keyword argument 'n_layer'" in failed["message"], failed
    assert job["status"]["restarts"]["total"] == 0
    # A rank's stderr reaches the pod's log "[rankN]:"-prefixed: none started.
    assert kubelet.pods and not any("[rank" in p.output() for p in kubelet.pods), kubelet.pods[0].output()
    # The first refusal fails the job; a pod still checking then is stopped with it (on a real server, often).
    assert 2 in [p.exit_code for p in kubelet.pods], [(p.exit_code, p.deleted) for p in kubelet.pods]
