"""SIGTERM or Ctrl-C mid-interval: every rank finishes its step, commits a checkpoint there and stops; a rerun
resumes from that step and ends with exactly the parameters of a run never interrupted. A second Ctrl-C stops the
ranks at once, and a launcher killed outright leaves no rank behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml
from budget import budget
from safetensors.torch import load_file
from test_run_resume import by_step, tiny_job

STEPS = 60  # long enough that a stop lands mid-run (it does within a few steps of the signal)


def job(tmp_path: Path) -> Path:
    path = tiny_job(tmp_path, STEPS)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["checkpoint"] = {"intervalSteps": 1000, "keepLast": 2, "terminationBudgetSeconds": 60}
    doc["spec"]["training"]["logEvery"] = 20
    path.write_text(yaml.safe_dump(doc))
    return path


class Run:
    """`zerotrain run` in the background with its metrics on ports the system hands out (`--metrics-port 0`),
    its output collected as it comes (the ranks say there which ports they hold)."""

    def __init__(self, tmp_path: Path, manifest: Path, ckpt: Path, *extra: str) -> None:
        argv = [sys.executable, "-m", "zerotrain.cli", "run", str(manifest), "--checkpoint-dir", str(ckpt)]
        argv += ["--metrics-port", "0", "--log-dir", str(tmp_path / "logs"), *extra]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def rank0_port(self, timeout_s: float = 120) -> int:
        deadline = time.monotonic() + timeout_s
        while not (found := re.search(r"rank 0 http://127\.0\.0\.1:(\d+)/metrics", self.output)):
            assert self.proc.poll() is None or self._reader.is_alive(), self.output
            assert time.monotonic() < deadline, "the ranks never said where they serve:\n" + self.output
            time.sleep(0.05)
        return int(found.group(1))

    def communicate(self, timeout: float) -> tuple[str, None]:
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return self.output, None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode


def start(tmp_path: Path, manifest: Path, ckpt: Path, *extra: str) -> Run:
    return Run(tmp_path, manifest, ckpt, *extra)


def step_of_rank0(port: int) -> int:
    """The last finished step rank 0 reports on /metrics (0 before the first)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return 0
    lines = [ln for ln in text.splitlines() if ln.startswith("zerotrain_step{")]
    return int(float(lines[0].rsplit(" ", 1)[1])) if lines else 0


def wait_for_step(run: Run, step: int) -> None:
    port = run.rank0_port()
    deadline = time.monotonic() + budget(120)
    while step_of_rank0(port) < step:
        assert run.proc.poll() is None, run.communicate(10)[0]
        assert time.monotonic() < deadline, "training did not reach the step in time"
        time.sleep(0.05)


def rank_pids(pid: int) -> list[int]:
    """The rank processes under launcher `pid` (its descendants running the rank module)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:  # a short-lived helper may exit while we look
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
            if p != pid and b"zerotrain.runtime.job.rank" in Path(f"/proc/{p}/cmdline").read_bytes():
                found.append(p)
        except OSError:
            continue
    # Rank 0 first: the local command reports rank 0's account, and a rank whose signal lands after the others
    # stopped on their vote says, truly, "a stop signal to another rank" (the kills are not simultaneous).
    return sorted(found, key=_rank_of)


def _rank_of(pid: int) -> int:
    """A rank process's RANK: in its environment when spawned, in its title (`RANK=N`) when forked from the
    launcher's server (whose /proc environ it shares)."""
    try:
        found = Path(f"/proc/{pid}/cmdline").read_bytes() + b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone meanwhile: last
        return 1 << 30
    words = found.replace(b"\0", b" ").split()
    return next((int(v[5:]) for v in words if v.startswith(b"RANK=") and v[5:].isdigit()), 1 << 30)


def masters(checkpoint: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(checkpoint.glob("rank-*.safetensors")):
        out |= {f"{f.name}/{k}": v for k, v in load_file(f).items() if k.startswith(("master.", "optim."))}
    return out


STOPS = {  # who is signalled, how, and what the local command then exits with
    "sigterm-launcher": (signal.SIGTERM, "launcher", 143, "preempted: SIGTERM"),
    "sigterm-ranks": (signal.SIGTERM, "ranks", 143, "preempted: SIGTERM"),
    "ctrl-c": (signal.SIGINT, "launcher", 130, "interrupted: SIGINT"),
}


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final training state of the job run once through, never stopped (one run for every way of stopping)."""
    tmp_path = tmp_path_factory.mktemp("straight")
    run = start(tmp_path, job(tmp_path), tmp_path / "ckpt")
    output, _ = run.communicate(timeout=budget(240))
    assert run.returncode == 0, output
    return masters(by_step(tmp_path / "ckpt")[STEPS])


@pytest.mark.slow
@pytest.mark.parametrize("how", list(STOPS))
def test_a_stop_signal_commits_the_current_step_and_a_rerun_continues_exactly(
    tmp_path: Path, how: str, straight: dict[str, torch.Tensor]
) -> None:
    sig, target, status, account = STOPS[how]
    manifest, ckpt = job(tmp_path), tmp_path / "ckpt"
    proc = start(tmp_path, manifest, ckpt)
    wait_for_step(proc, 3)
    # The kubelet signals the pod's PID 1 (the launcher), which forwards; SIGTERM straight to the ranks counts too.
    # A terminal's Ctrl-C reaches the launcher alone: torch starts each rank in a session of its own.
    for pid in [proc.pid] if target == "launcher" else rank_pids(proc.pid):
        os.kill(pid, sig)
    output, _ = proc.communicate(timeout=budget(120))
    # Unfinished work is never a success for the local command (a pod's launcher exits 0: the operator reads why).
    assert proc.returncode == status, output
    assert account in output and "Traceback" not in output, output
    saved = by_step(ckpt)
    assert len(saved) == 1, output
    ((stopped_at, path),) = saved.items()
    assert 3 <= stopped_at < STEPS and (path / "COMMITTED").is_file()
    assert json.loads((path / "COMMITTED").read_text())["micro_batches"] == stopped_at
    assert f"every rank stopped after step {stopped_at} of {STEPS}, checkpoint {path} committed" in output, output
    assert f"step {stopped_at}/{STEPS}" in output  # the bar ends where the ranks stopped

    rerun = start(tmp_path, manifest, ckpt)
    output, _ = rerun.communicate(timeout=budget(240))
    assert rerun.returncode == 0 and f"resumed from {path} at step {stopped_at}" in output, output
    ran = STEPS - stopped_at
    assert f"over steps {stopped_at + 1}–{STEPS} ({ran}, resumed after {stopped_at})" in output, output

    got = masters(by_step(ckpt)[STEPS])
    assert got.keys() == straight.keys() and len(got) > 0
    for name, value in straight.items():
        assert torch.equal(got[name], value), name


@pytest.mark.slow
def test_asynchronous_saves_commit_as_they_go_and_a_stop_waits_for_the_one_in_flight(
    tmp_path: Path, straight: dict[str, torch.Tensor]
) -> None:
    """checkpoint.async with a save every 2 steps: SIGTERM finishes the write in flight, commits the step it stopped
    at, and a rerun (also asynchronous) ends exactly where the synchronous run never stopped did."""
    manifest, ckpt = job(tmp_path), tmp_path / "ckpt"
    doc = yaml.safe_load(manifest.read_text())
    doc["spec"]["checkpoint"] |= {"async": True, "intervalSteps": 2}
    manifest.write_text(yaml.safe_dump(doc))
    proc = start(tmp_path, manifest, ckpt)
    wait_for_step(proc, 12)
    os.kill(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=budget(120))
    assert proc.returncode == 143 and "Traceback" not in output, output
    saved = by_step(ckpt)
    stopped_at = max(saved)
    assert 12 <= stopped_at < STEPS and len(saved) == 2, output  # keepLast 2: the stop and an interval save before
    assert min(saved) % 2 == 0 and all((p / "COMMITTED").is_file() for p in saved.values())
    assert not [p for p in ckpt.glob("step-*") if not (p / "COMMITTED").exists() and p.name < saved[stopped_at].name]
    assert f"every rank stopped after step {stopped_at} of {STEPS}, checkpoint {saved[stopped_at]} committed" in output

    rerun = start(tmp_path, manifest, ckpt)
    output, _ = rerun.communicate(timeout=budget(240))
    assert rerun.returncode == 0 and f"at step {stopped_at}" in output, output
    got = masters(by_step(ckpt)[STEPS])
    assert got.keys() == straight.keys() and len(got) > 0
    for name, value in straight.items():
        assert torch.equal(got[name], value), name


# Steps slow enough that a stop takes seconds: what a second Ctrl-C cuts short.
SLOW_TASK = """
import time
import torch
from zerotrain.runtime.job.task import TrainingTask


def batches(step_s):
    yield torch.ones(2, 4)  # the first step at once, every later one step_s
    while True:
        time.sleep(step_s)
        yield torch.ones(2, 4)


def build(rank, world_size, step_s):
    torch.manual_seed(0)
    return TrainingTask(model=torch.nn.Linear(4, 1), loss=lambda out, b: out.square().mean(), batches=batches(step_s))
"""


def slow_job(tmp_path: Path, step_s: float) -> Path:
    """A manifest whose entry point lives beside it (in `job/`), not in the working directory."""
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "slowtask.py").write_text(SLOW_TASK)
    doc = {
        "apiVersion": "zerotrain.dev/v1alpha1",
        "kind": "ZeroTrainingJob",
        "metadata": {"name": "slow"},
        "spec": {
            "image": "unused",
            "entrypoint": "slowtask:build",
            "entrypointArgs": {"step_s": step_s},
            "replicas": 2,
            "zero": {"stage": 2},
            "training": {"steps": 1000, "logEvery": 1},
            "checkpoint": {"intervalSteps": 1, "terminationBudgetSeconds": 120},
        },
    }
    path = tmp_path / "job" / "slow.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
def test_a_second_ctrl_c_stops_every_rank_at_once_and_the_last_commit_stands(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    proc = start(tmp_path, slow_job(tmp_path, step_s=30.0), ckpt)
    port = proc.rank0_port()
    deadline = time.monotonic() + budget(120)
    while not by_step_or_none(ckpt):  # step 1 committed: the ranks are 30 s into step 2
        assert proc.proc.poll() is None and time.monotonic() < deadline, proc.output
        time.sleep(0.1)
    ranks = rank_pids(proc.pid)
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(1)
    # Rank 0 records step 1 just after committing its checkpoint: under a full test run that moment (or the /metrics
    # answer) can come later than the second above, so the gauge is polled. Step 2 has ~28 s left: 10 s is safe.
    settled = time.monotonic() + 10
    while (step := step_of_rank0(port)) < 1 and time.monotonic() < settled:
        time.sleep(0.1)
    assert proc.proc.poll() is None and step == 1, proc.output  # finishing step 2 first
    os.kill(proc.pid, signal.SIGINT)
    again = time.monotonic()
    output, _ = proc.communicate(timeout=budget(60))
    # Killed, not waited for: the step had ~28 s left and the budget 120 s.
    assert time.monotonic() - again < 15, output
    assert proc.returncode == 130, output
    assert "Ctrl-C again: stopping every rank now" in output and "interrupted: SIGINT twice" in output, output
    assert "Traceback" not in output, output
    assert sorted(by_step(ckpt)) == [1]  # nothing of step 2 was committed
    assert not [p for p in ranks if Path(f"/proc/{p}").exists()], "a rank outlived its launcher"


def by_step_or_none(root: Path) -> dict[int, Path]:
    return by_step(root) if root.exists() else {}


@pytest.mark.slow
def test_a_launcher_killed_outright_leaves_no_rank_behind(tmp_path: Path) -> None:
    proc = start(tmp_path, slow_job(tmp_path, step_s=0.05), tmp_path / "ckpt")
    wait_for_step(proc, 2)
    ranks = rank_pids(proc.pid)
    assert len(ranks) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=budget(30))
    deadline = time.monotonic() + budget(15)
    try:
        while alive := [p for p in ranks if Path(f"/proc/{p}").exists() and b"zombie" not in state(p)]:
            assert time.monotonic() < deadline, f"ranks {alive} outlived their launcher"
            time.sleep(0.1)
    finally:  # never leave them running when this fails
        for p in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/status").read_bytes()
    except OSError:
        return b"zombie"
