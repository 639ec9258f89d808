"""A gang's recovery from one killed rank, in place against recreated: the operator and a gang of 4 one-rank pods run
as in the e2e suite (the real operator, the process kubelet: each pod a local process tree, real gloo ranks, a
shared checkpoint claim). Once rank 0 printed step 15 (the newest checkpoint is step 10), one rank of pod 2 gets
SIGKILL (its launcher left running; the same fault for both), and the clock runs to the new gang's first step.

Each trial runs on a fresh KMock emulator (or, with ZEROTRAIN_E2E_KUBECONFIG naming a real cluster, in a throw-away
namespace there); the strategies alternate, reversed every other repetition. Printed per trial and as medians with
their range, the parts named:

- decided: from the kill to the operator's restart decision (the Restarting condition's time): the failure reaching
  the launchers and the operator;
- pods back: to every pod of the new gang running (InPlace: each launcher printed its round's start; Recreate: every
  pod of the new gang has a process): the back-off, the pods' deletion and creation or the word to start;
- start, rendezvous, build: to every rank having loaded the checkpoint, less the load itself (Recreate: each new
  pod's launcher importing torch, checking the job and starting its fork server first);
- checkpoint load: the slowest rank's load, as its "resumed from ... in X s" line says;
- first step: to rank 0 printing the first step after the checkpoint.

The process kubelet starts a pod's process as soon as it sees the pod: no scheduling, image pull or container start,
which on a cluster make Recreate slower still. The operator runs with the e2e suite's timers (a 0.2 s back-off);
its default back-off after a first failure is 10 s, the same for both.

    python bench/operator/bench_in_place.py --reps 5 --out in_place.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import kmock  # noqa: E402
import kubernetes  # noqa: E402
from e2e.cluster import KUBECONFIG_ENV, Cluster, real_cluster_setup, real_cluster_teardown  # noqa: E402
from e2e.conftest import running_operator  # noqa: E402
from e2e.emulator import ZeroEmulator  # noqa: E402
from e2e.process_kubelet import ProcessKubelet  # noqa: E402
from e2e.test_operator_e2e import JOBS, job_manifest  # noqa: E402
from e2e.test_training_e2e import ROUND_STARTS  # noqa: E402

from zerotrain.operator.client.kube import path_of  # noqa: E402
from zerotrain.spec import PLURAL  # noqa: E402

NAME, PODS, CHECKPOINT, KILL_AFTER = "recover", 4, 10, 15
SPEC: dict[str, Any] = {
    "entrypoint": "zerotrain.runtime.examples.slowed:build",
    "entrypointArgs": {
        "seq_len": 32,
        "batch_size": 4,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 2,
        "max_bytes": 100000,
        "factor": 1.0,
        "data_seconds": 0.1,
    },
    "replicas": PODS,
    "nprocPerNode": 1,
    "zero": {"stage": 3, "unitModules": ["Block"]},
    "training": {"steps": 40, "seed": 0, "logEvery": 1},
    "checkpoint": {"claimName": "ckpt", "intervalSteps": CHECKPOINT, "keepLast": 2},
    "failurePolicy": {"backoffLimit": 3},
    "metrics": {"enabled": False},
}
PARTS = ("decided", "pods back", "start, rendezvous, build", "checkpoint load", "first step")
LOAD = re.compile(r"resumed from \S+ at step \d+ \(.*? in ([0-9.]+) s\)")
TIMEOUT_S = 180.0


@contextlib.asynccontextmanager
async def cluster_for() -> AsyncIterator[Cluster]:
    """A fresh in-process emulator, or a throw-away namespace on the real cluster."""
    if path := os.environ.get(KUBECONFIG_ENV):
        cluster = await asyncio.to_thread(real_cluster_setup, path)
        try:
            yield cluster
        finally:
            await asyncio.to_thread(real_cluster_teardown, cluster)
        return
    async with ZeroEmulator() as emu, kmock.Server(emu):
        cfg = kubernetes.client.Configuration()
        cfg.host = str(emu.url).rstrip("/")
        yield Cluster(cfg, "default", emu)


def new_output(kubelet: ProcessKubelet, pod: str, in_place: bool) -> str | None:
    """What `pod` printed in the gang after the kill: after its launcher's round start (InPlace), or its new
    process's (Recreate); None before either."""
    if in_place:
        out = next((p.output() for p in kubelet.gang(0) if p.name == pod), "")
        return out.split(ROUND_STARTS, 1)[1] if ROUND_STARTS in out else None
    return next((p.output() for p in kubelet.gang(1) if p.name == pod), None)


async def decided_at(kube: Any, ns: str) -> float:
    """When the operator decided the restart: its Restarting condition's time, once restarts.total is 1."""
    while True:
        job = await asyncio.to_thread(kube.get_job, ns, NAME)
        status = (job or {}).get("status") or {}
        if status.get("restarts", {}).get("total") == 1:
            c = next(c for c in status["conditions"] if c["type"] == "Restarting")
            return datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00")).timestamp()
        await asyncio.sleep(0.1)


async def marks_after_kill(kubelet: ProcessKubelet, in_place: bool, t_kill: float) -> dict[str, float]:
    """The times each mark was first seen (polled every 20 ms), and the slowest rank's load."""
    pods = [f"{NAME}-worker-{r}" for r in range(PODS)]
    marks: dict[str, float] = {}
    first_step = f'"step": {CHECKPOINT + 1},'
    while "step" not in marks:
        assert time.time() - t_kill < TIMEOUT_S, f"no first step within {TIMEOUT_S} s of the kill"
        outs = [new_output(kubelet, p, in_place) for p in pods]
        now = time.time()
        if "ranks" not in marks and all(o is not None for o in outs):
            marks["ranks"] = now
        if "ranks" in marks and "loaded" not in marks and all(o and LOAD.search(o) for o in outs):
            marks["loaded"] = now
            marks["load_s"] = max(float(LOAD.search(o).group(1)) for o in outs if o)  # type: ignore[union-attr]
        if "loaded" in marks and first_step in (outs[0] or ""):
            marks["step"] = now
        await asyncio.sleep(0.02)
    return marks


async def trial(strategy: str, workdir: Path) -> dict[str, float]:
    """One recovery: seconds per part, and their total."""
    in_place = strategy == "InPlace"
    spec = {**SPEC, "failurePolicy": {**SPEC["failurePolicy"], "restartStrategy": strategy}}
    async with cluster_for() as cluster, running_operator(cluster, [cluster.namespace]):
        kube = cluster.client("bench-in-place")
        try:
            async with ProcessKubelet(cluster, NAME, workdir) as kubelet:
                body = job_manifest(NAME, cluster.namespace, **spec)
                await asyncio.to_thread(kube.request, "POST", path_of(JOBS, PLURAL, cluster.namespace), body)
                started = time.time()
                while not any(f'"step": {KILL_AFTER},' in p.output() for p in kubelet.gang(0) if p.name.endswith("-0")):
                    assert time.time() - started < TIMEOUT_S, "the gang did not reach the kill's step"
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(kubelet.kill_rank, f"{NAME}-worker-2")
                t_kill = time.time()
                decision = asyncio.ensure_future(decided_at(kube, cluster.namespace))
                marks = await marks_after_kill(kubelet, in_place, t_kill)
                t_decided = await asyncio.wait_for(decision, TIMEOUT_S)
                assert not kubelet.errors, kubelet.errors
        finally:
            kube.close()
    load = marks["load_s"]
    parts = {
        "decided": t_decided - t_kill,
        "pods back": marks["ranks"] - t_decided,
        "start, rendezvous, build": marks["loaded"] - marks["ranks"] - load,
        "checkpoint load": load,
        "first step": marks["step"] - marks["loaded"],
    }
    return {**parts, "total": marks["step"] - t_kill}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s ({min(values):.2f}-{max(values):.2f})"


async def run(reps: int) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {"InPlace": [], "Recreate": []}
    for rep in range(reps):
        order = ["InPlace", "Recreate"] if rep % 2 == 0 else ["Recreate", "InPlace"]
        for strategy in order:
            with tempfile.TemporaryDirectory(prefix="zt-bench-in-place-") as tmp:
                got = await trial(strategy, Path(tmp))
            results[strategy].append(got)
            print(f"rep {rep + 1} {strategy:8s} " + "  ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
    return results


def report(results: dict[str, list[dict[str, float]]]) -> str:
    lines = [f"{'part':26s} {'InPlace':>26s} {'Recreate':>26s}"]
    for part in (*PARTS, "total"):
        cells = [spread([r[part] for r in results[s]]) for s in ("InPlace", "Recreate")]
        lines.append(f"{part:26s} {cells[0]:>26s} {cells[1]:>26s}")
    totals = {s: statistics.median(r["total"] for r in results[s]) for s in results}
    lines.append(f"InPlace / Recreate, kill to first step: {totals['InPlace'] / totals['Recreate']:.2f} (goal ≤ 0.5)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="trials of each strategy (default 5)")
    parser.add_argument("--out", type=Path, help="write every trial's parts here as JSON")
    args = parser.parse_args()
    where = "the real cluster of " + os.environ[KUBECONFIG_ENV] if os.environ.get(KUBECONFIG_ENV) else "KMock"
    print(f"{PODS} pods × 1 rank, one rank of pod 2 killed after step {KILL_AFTER}; on {where}", flush=True)
    results = asyncio.run(run(args.reps))
    print(report(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
