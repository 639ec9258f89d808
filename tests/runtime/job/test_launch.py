"""The pod entry point: env → launch plan (WORLD_SIZE = total ranks), ranks started by torch's elastic launcher,
the launcher's exit status is the ranks'."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from budget import budget
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from zerotrain import gpu_env
from zerotrain.runtime.job.launch import (
    LaunchPlan,
    Outcome,
    available_cpus,
    free_port,
    outcome_of_failures,
    plan_from_env,
    rank_environment,
)
from zerotrain.runtime.job.preemption import EXIT_PREEMPTED
from zerotrain.runtime.job.task import ConfigError
from zerotrain.spec import ZeroTrainingJobSpec

SIGKILL_SAID = (
    "it was killed by SIGKILL from outside (most often the kernel's OOM killer: its memory limit ran out; "
    "`zerotrain plan -f JOB` shows the resources.memory that holds it)"
)


def spec(replicas: int = 2, nproc: int = 1, **extra: Any) -> ZeroTrainingJobSpec:
    return ZeroTrainingJobSpec.model_validate(
        {"image": "x", "entrypoint": "m:f", "replicas": replicas, "nprocPerNode": nproc, **extra}
    )


# ---------------------------------------------------------------- plan from env


def test_plan_from_the_operator_env() -> None:
    env = {"MASTER_ADDR": "job-0.job", "MASTER_PORT": "29400", "NODE_RANK": "1", "NPROC_PER_NODE": "2"}
    plan = plan_from_env({**env, "WORLD_SIZE": "4"}, spec(2, 2))
    assert plan == LaunchPlan("job-0.job", 29400, nnodes=2, node_rank=1, nproc_per_node=2)
    assert plan.world_size == 4
    assert plan_from_env({**env, "NNODES": "2"}, spec(2, 2)) == plan  # NNODES instead of WORLD_SIZE


def test_single_node_defaults() -> None:
    assert plan_from_env({}, spec(1, 3)) == LaunchPlan("127.0.0.1", 29500, 1, 0, 3)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "3", "NNODES": "2"}, r"WORLD_SIZE: got 3, but NNODES × NPROC_PER_NODE = 2 × 1 = 2"),
        ({"WORLD_SIZE": "3", "NPROC_PER_NODE": "2"}, r"WORLD_SIZE: got 3, not a multiple of NPROC_PER_NODE=2"),
        ({"WORLD_SIZE": "2", "NPROC_PER_NODE": "2"}, r"NNODES=1, NPROC_PER_NODE=2, but the manifest has spec"),
        ({"WORLD_SIZE": "2", "NODE_RANK": "2"}, r"NODE_RANK: got 2; must be below NNODES=2"),
        ({"WORLD_SIZE": "two"}, r"WORLD_SIZE: got 'two'; not a whole number"),
        ({"WORLD_SIZE": "2"}, r"MASTER_ADDR: not set, but the job has 2 nodes"),
    ],
)
def test_inconsistent_env_is_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_from_env(env, spec(2, 1))


@pytest.mark.parametrize(("cpu_max", "expected"), [("250000 100000", 3), ("50000 100000", 1), ("max 100000", None)])
def test_available_cpus_follows_the_cgroup_limit(tmp_path: Path, cpu_max: str, expected: int | None) -> None:
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    schedulable = len(os.sched_getaffinity(0))
    want = schedulable if expected is None else min(expected, schedulable)
    assert available_cpus(tmp_path / "cpu.max") == want
    assert available_cpus(tmp_path / "missing") == schedulable


# ---------------------------------------------------------------- the ranks' environment


@pytest.fixture
def no_gpu_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in {*gpu_env.GPU_ENV, *(a for aliases in gpu_env.ALIASES.values() for a in aliases)}:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_gpu_ranks_get_the_gpu_defaults_the_environment_lacks(no_gpu_env: pytest.MonkeyPatch) -> None:
    plan = LaunchPlan("127.0.0.1", 29500, 1, 0, 2)
    assert rank_environment(plan, gpus=True).items() >= gpu_env.GPU_ENV.items()
    assert not rank_environment(plan).keys() & gpu_env.GPU_ENV.keys()  # CPU jobs: none
    no_gpu_env.setenv("NCCL_DEBUG", "INFO")  # the pod's (spec.env's) value wins: nothing to add
    no_gpu_env.setenv("PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync")  # also under torch's other name
    added = rank_environment(plan, gpus=True)
    assert "NCCL_DEBUG" not in added and "PYTORCH_CUDA_ALLOC_CONF" not in added
    assert added["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


# ---------------------------------------------------------------- which failure is the root cause


def failure(
    rank: int, exitcode: int, tmp: Path, recorded_at: float | None = None, kind: str = "error"
) -> ProcessFailure:
    path = tmp / f"error-{rank}.json"
    if recorded_at is not None:
        info = {"timestamp": str(int(recorded_at)), "zerotrainTime": recorded_at, "zerotrainKind": kind}
        path.write_text(json.dumps({"message": {"message": f"boom {rank}", "extraInfo": info}}))
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=exitcode, error_file=str(path))


def test_an_exit_status_beats_a_kill_by_the_launcher(tmp_path: Path) -> None:
    out = outcome_of_failures({0: failure(0, -15, tmp_path), 1: failure(1, 3, tmp_path)})
    assert (out.exit_code, out.reason) == (3, Outcome.RANK_FAILED)
    assert out.message == "rank 1 failed first: it exited with status 3"
    assert out.details == ("rank 0 was stopped by the launcher (SIGTERM)",)


def test_a_rank_killed_from_outside_beats_the_peer_that_lost_it(tmp_path: Path) -> None:
    lost = failure(0, 1, tmp_path, 1000.5, kind="peer-lost")
    out = outcome_of_failures({0: lost, 1: failure(1, -9, tmp_path)})
    assert (out.exit_code, out.message) == (137, "rank 1 failed first: " + SIGKILL_SAID)
    assert out.details == ("rank 0 stopped: its peer was gone",)
    assert out.summary() == "rank 1 failed first: " + SIGKILL_SAID + "; rank 0 stopped: its peer was gone"


def test_the_earliest_recorded_failure_is_the_root_cause(tmp_path: Path) -> None:
    first, second = failure(1, 3, tmp_path, 1000.25), failure(0, 1, tmp_path, 1000.75)
    out = outcome_of_failures({0: second, 1: first})
    assert out.exit_code == 3 and out.message.endswith("boom 1")


def test_a_crash_counts_as_128_plus_the_signal(tmp_path: Path) -> None:
    out = outcome_of_failures({0: failure(0, -15, tmp_path), 1: failure(1, -11, tmp_path)})
    assert out.exit_code == 128 + 11 and "rank 1 failed first: it was killed by SIGSEGV" in out.message


def test_ranks_that_all_stopped_preempted_make_a_preempted_launch(tmp_path: Path) -> None:
    out = outcome_of_failures(
        {0: failure(0, EXIT_PREEMPTED, tmp_path, 1000.5), 1: failure(1, EXIT_PREEMPTED, tmp_path, 1000.25)}
    )
    assert (out.exit_code, out.reason, out.message) == (0, Outcome.PREEMPTED, "boom 1")
    # One rank that failed otherwise makes it a failure.
    out = outcome_of_failures({0: failure(0, EXIT_PREEMPTED, tmp_path), 1: failure(1, 1, tmp_path)})
    assert (out.exit_code, out.reason) == (1, Outcome.RANK_FAILED)


# ---------------------------------------------------------------- real launches

RANK_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "OMP_NUM_THREADS")
record = {k: os.environ.get(k) for k in keys} | {"sum": total.item()}
open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w").write(json.dumps(record))
dist.destroy_process_group()
"""

FAILING_ENTRY = """
import sys
import time
import torch.distributed as dist

def build(rank, world_size):
    if rank == 1:
        sys.exit(3)
    dist.barrier()  # rank 0 waits for rank 1, which is gone
"""


def write_job(tmp_path: Path, spec_doc: dict[str, Any]) -> Path:
    doc = {"apiVersion": "zerotrain.dev/v1alpha1", "kind": "ZeroTrainingJob", "metadata": {"name": "t"}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**doc, "spec": {"image": "x", **spec_doc}}))
    return path


def pod(config: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """`python -m zerotrain.runtime` as the operator starts it: only the documented variables set."""
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.Popen(
        [sys.executable, "-m", "zerotrain.runtime", "--config", str(config)],
        env={**clean, "ZEROTRAIN_TERMINATION_LOG": str(cwd / f"termination-{env.get('NODE_RANK', '0')}"), **env},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_two_pods_of_one_rank_rendezvous_and_finish(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    config = write_job(tmp_path, {"entrypoint": str(script), "args": [str(tmp_path)], "replicas": 2})
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NPROC_PER_NODE": "1", "WORLD_SIZE": "2"}
    pods = [pod(config, {**env, "NODE_RANK": str(n)}, tmp_path) for n in (0, 1)]
    outputs = [p.communicate(timeout=budget(120))[0] for p in pods]
    assert [p.returncode for p in pods] == [0, 0], outputs
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"], r["GROUP_RANK"]) for r in ranks] == [
        ("0", "0", "2", "0"),
        ("1", "0", "2", "1"),
    ]
    assert all(r["sum"] == 3.0 for r in ranks)  # a real all-reduce across the two pods
    assert (tmp_path / "termination-0").read_text() == "succeeded: 1 rank(s) finished (exit status 0)\n"


ENV_SCRIPT = """
import json, os, sys
open(sys.argv[1], "w").write(json.dumps(dict(os.environ)))
"""


@pytest.mark.slow
def test_the_ranks_of_a_gpu_job_inherit_the_gpu_defaults(tmp_path: Path, no_gpu_env: pytest.MonkeyPatch) -> None:
    """A pod not made by the operator (no GPU env of its own) still hands the defaults to its ranks; a value the pod
    sets stays. A script entry point never touches CUDA, so this runs on CPU."""
    script, out = tmp_path / "env.py", tmp_path / "env.json"
    script.write_text(ENV_SCRIPT)
    config = write_job(tmp_path, {"entrypoint": str(script), "args": [str(out)], "resources": {"gpu": 1}})
    proc = pod(config, {"MASTER_PORT": str(free_port()), "NCCL_DEBUG": "INFO"}, tmp_path)
    output = proc.communicate(timeout=budget(120))[0]
    assert proc.returncode == 0, output
    seen = json.loads(out.read_text())
    assert {k: seen.get(k) for k in gpu_env.GPU_ENV} == {**gpu_env.GPU_ENV, "NCCL_DEBUG": "INFO"}


@pytest.mark.slow
def test_a_failing_rank_sets_the_pod_exit_status(tmp_path: Path) -> None:
    (tmp_path / "zt_failing_entry.py").write_text(FAILING_ENTRY)
    config = write_job(
        tmp_path,
        {"entrypoint": "zt_failing_entry:build", "nprocPerNode": 2, "zero": {"collectiveTimeoutSeconds": 30}},
    )
    env = {"NPROC_PER_NODE": "2", "WORLD_SIZE": "2", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(tmp_path)}
    proc = pod(config, env, tmp_path)
    out = proc.communicate(timeout=budget(120))[0]
    assert proc.returncode == 3, out
    assert "rank 1 failed first: it exited with status 3" in out
    message = (tmp_path / "termination-0").read_text()
    assert message.startswith("rank-failed: rank 1 failed first: it exited with status 3")
    assert message.endswith("(exit status 3)\n")


@pytest.mark.slow
def test_an_entry_point_that_cannot_be_imported_exits_2_before_any_rank(tmp_path: Path) -> None:
    config = write_job(tmp_path, {"entrypoint": "zt_missing_module:build", "nprocPerNode": 2})
    proc = pod(config, {"NPROC_PER_NODE": "2", "WORLD_SIZE": "2"}, tmp_path)
    out = proc.communicate(timeout=budget(60))[0]
    assert proc.returncode == 2, out
    assert "spec.entrypoint: got 'zt_missing_module:build', but module 'zt_missing_module' cannot be imported" in out
    assert (tmp_path / "termination-0").read_text().startswith("invalid-config: spec.entrypoint: got")


@pytest.mark.slow
def test_world_size_contradicting_the_manifest_exits_2(tmp_path: Path) -> None:
    config = write_job(tmp_path, {"entrypoint": "zerotrain.runtime.examples.gpt:build", "replicas": 2})
    proc = pod(config, {"NPROC_PER_NODE": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1"}, tmp_path)
    out = proc.communicate(timeout=budget(60))[0]
    assert proc.returncode == 2, out
    assert "NNODES=4, NPROC_PER_NODE=1, but the manifest has spec.replicas=2" in out


SLEEPING_RANK = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
open(os.path.join(sys.argv[1], f"ready{dist.get_rank()}"), "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


@pytest.mark.slow
def test_sigterm_is_forwarded_to_the_ranks_and_a_preempted_pod_exits_0(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPING_RANK)
    config = write_job(tmp_path, {"entrypoint": str(script), "args": [str(tmp_path)], "nprocPerNode": 2})
    proc = pod(config, {"NPROC_PER_NODE": "2", "WORLD_SIZE": "2", "MASTER_PORT": str(free_port())}, tmp_path)
    ready = [tmp_path / "ready0", tmp_path / "ready1"]
    deadline = time.monotonic() + budget(90)
    while not all(r.exists() and r.read_text() for r in ready):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    rank_pids = [int(r.read_text()) for r in ready]
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=budget(60))[0]
    assert proc.returncode == 0, out
    # The operator's observe.PREEMPTED_MESSAGE: a Succeeded pod whose message starts so was preempted.
    assert (tmp_path / "termination-0").read_text().startswith("preempted: ")
    for pid in rank_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


HANG_ENTRY = """
import pathlib, time

def build(rank, world_size):
    pathlib.Path(__file__).with_name(f"hung{rank}").write_text("")
    time.sleep(600)  # a collective that never returns, as NCCL's can hang for minutes
"""

ROUNDS_DRIVER = """
import json, sys, threading, time
from pathlib import Path
from zerotrain.manifest import load_job
from zerotrain.runtime.job import rank_fork
from zerotrain.runtime.job.launch import launch, local_plan


def fire(hang, stop):
    while not all((hang.parent / f"hung{r}").exists() for r in (0, 1)):
        time.sleep(0.05)
    stop.set()


def main(hang, script, out):
    plan, stop = local_plan(2), threading.Event()
    threading.Thread(target=fire, args=(hang, stop), daemon=True).start()
    began = time.monotonic()
    first = launch(load_job(hang).spec, hang, plan, quiet=True, stop=stop)
    stopped_s = time.monotonic() - began
    server = rank_fork.server_pid()
    second = launch(load_job(script).spec, script, plan, quiet=True)
    out.write_text(json.dumps({
        "first": [first.reason.value, first.exit_code, first.message], "stopped_s": stopped_s,
        "second": [second.reason.value, second.exit_code], "server_kept": rank_fork.server_pid() == server,
    }))


if __name__ == "__main__":  # the fork server imports this module: it must not run it again
    main(*(Path(a) for a in sys.argv[1:4]))
"""


@pytest.mark.slow
def test_a_round_stopped_by_the_operator_kills_its_ranks_and_the_next_launches_on_the_same_port(
    tmp_path: Path,
) -> None:
    """In-place restarts: `stop` kills every rank of a hung launch at once (no waiting for a collective timeout),
    the fork server stays for the next round, and node 0's rendezvous store binds the same port again."""
    (tmp_path / "zt_hang_entry.py").write_text(HANG_ENTRY)
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    hang = write_job(tmp_path, {"entrypoint": "zt_hang_entry:build", "nprocPerNode": 2, "replicas": 1})
    hang = hang.rename(tmp_path / "hang.yaml")
    script = write_job(tmp_path, {"entrypoint": str(tmp_path / "rank.py"), "args": [str(tmp_path)], "nprocPerNode": 2})
    driver, out = tmp_path / "driver.py", tmp_path / "out.json"
    driver.write_text(ROUNDS_DRIVER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(driver), str(hang), str(script), str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=budget(180),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(out.read_text())
    assert seen["first"][:2] == ["stopped", 137], (seen, done.stderr[-3000:])
    assert seen["stopped_s"] < budget(60), seen  # the sleep was 600 s
    assert seen["second"] == ["succeeded", 0] and seen["server_kept"], seen
    assert all(json.loads((tmp_path / f"rank{r}.json").read_text())["sum"] == 3.0 for r in (0, 1))
