"""SIGTERM mid-interval: every rank finishes its step, commits a checkpoint there and stops; a rerun resumes from
that step and ends with exactly the parameters of a run never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_run_resume import by_step, tiny_job

STEPS = 300


def job(tmp_path: Path) -> Path:
    path = tiny_job(tmp_path, STEPS)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["checkpoint"] = {"intervalSteps": 1000, "keepLast": 2, "terminationBudgetSeconds": 60}
    doc["spec"]["training"]["logEvery"] = 50
    path.write_text(yaml.safe_dump(doc))
    return path


def metrics_port() -> int:
    """A first metrics port with the next one free too, below the ephemeral range: the ranks' own connections
    (gloo, the rendezvous store) take ephemeral ports, and could take one between the check and the bind."""
    import random
    import socket

    for _ in range(200):
        port = random.randrange(20000, 32000)
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free pair of ports below 32000")


def start(tmp_path: Path, manifest: Path, ckpt: Path, port: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "zerotrain.cli", "run", str(manifest), "--checkpoint-dir", str(ckpt)]
    argv += ["--metrics-port", str(port)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)


def step_of_rank0(port: int) -> int:
    """The last finished step rank 0 reports on /metrics (0 before the first)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return 0
    lines = [ln for ln in text.splitlines() if ln.startswith("zerotrain_step{")]
    return int(float(lines[0].rsplit(" ", 1)[1])) if lines else 0


def wait_for_step(proc: subprocess.Popen[str], port: int, step: int) -> None:
    deadline = time.monotonic() + 120
    while step_of_rank0(port) < step:
        assert proc.poll() is None, proc.communicate()[0]
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
            if p != pid and b"zerotrain.runtime.train" in Path(f"/proc/{p}/cmdline").read_bytes():
                found.append(p)
        except OSError:
            continue
    return found


def masters(checkpoint: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(checkpoint.glob("rank-*.safetensors")):
        out |= {f"{f.name}/{k}": v for k, v in load_file(f).items() if k.startswith(("master.", "optim."))}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("target", ["launcher", "ranks"])
def test_sigterm_commits_the_current_step_and_a_rerun_continues_exactly(tmp_path: Path, target: str) -> None:
    manifest, ckpt, port = job(tmp_path), tmp_path / "ckpt", metrics_port()
    proc = start(tmp_path, manifest, ckpt, port)
    wait_for_step(proc, port, 3)
    # The kubelet signals the pod's PID 1 (the launcher), which forwards; SIGTERM straight to the ranks counts too.
    for pid in [proc.pid] if target == "launcher" else rank_pids(proc.pid):
        os.kill(pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert "preempted:" in output and "Traceback" not in output, output
    saved = by_step(ckpt)
    assert len(saved) == 1, output
    ((stopped_at, path),) = saved.items()
    assert 3 <= stopped_at < STEPS and (path / "COMMITTED").is_file()
    assert json.loads((path / "COMMITTED").read_text())["micro_batches"] == stopped_at

    rerun = start(tmp_path, manifest, ckpt, metrics_port())
    output, _ = rerun.communicate(timeout=240)
    assert rerun.returncode == 0 and f"resumed from {path} at step {stopped_at}" in output, output

    straight = start(tmp_path, manifest, tmp_path / "straight", metrics_port())
    assert straight.wait(timeout=240) == 0
    got, want = masters(by_step(ckpt)[STEPS]), masters(by_step(tmp_path / "straight")[STEPS])
    assert got.keys() == want.keys() and len(got) > 0
    for name, value in want.items():
        assert torch.equal(got[name], value), name
