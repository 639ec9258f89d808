"""`zerotrain top` driven in a real terminal (tmux) against a real local run: rank 1's batches come twice as late,
and the screen (80 columns) shows both ranks, rank 1 marked as the straggler with cause input while it lasts, the
goodput, and q leaves with status 0."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from budget import budget

ROOT = Path(__file__).resolve().parents[2]
JOB = "toplive"

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="needs tmux (Debian package tmux; `make test` installs it)"
)


def slowed_job(tmp_path: Path) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    doc["metadata"]["name"] = JOB
    spec = doc["spec"]
    spec["entrypoint"] = "zerotrain.runtime.examples.slowed:build"
    gpt = {"seq_len": 32, "batch_size": 4, "d_model": 32, "n_layers": 2, "n_heads": 2, "max_bytes": 100_000}
    spec["entrypointArgs"] = {"slow_rank": 1, "cause": "input", "factor": 2.0, "data_seconds": 0.05, **gpt}
    spec.pop("model")  # its declared Ψ is the quickstart's
    spec["training"].update({"steps": 100_000, "logEvery": 50})  # stopped by the test
    spec["stragglers"] = {"windowSteps": 5, "threshold": 1.2}
    path = tmp_path / f"{JOB}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


class Tmux:
    """A tmux server of the test's own (its own socket), one 80×24 window."""

    def __init__(self, tmp_path: Path) -> None:
        self.socket = str(tmp_path / "tmux.sock")

    def __call__(self, *args: str) -> str:
        run = subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, run.stderr
        return run.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def wait(self, what: str, ok: Callable[[str], bool], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while not ok(screen := self.screen()):
            assert time.monotonic() < deadline, f"the screen never showed {what}:\n{screen}"
            time.sleep(0.3)
        return screen


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Path]:
    """A local run of the slowed job with metrics on free ports, its logs under tmp_path/logs; stopped after."""
    logs = tmp_path / "logs"
    argv = [sys.executable, "-m", "zerotrain.cli", "run", str(slowed_job(tmp_path)), "--metrics-port", "0"]
    proc = subprocess.Popen([*argv, "--log-dir", str(logs)], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + budget(120)
        while not (logs / "metrics.json").exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the run never served its metrics"
            time.sleep(0.2)
        yield logs
    finally:
        proc.send_signal(signal.SIGINT)  # every rank finishes its step and stops
        proc.communicate(timeout=budget(60))


@pytest.mark.slow
def test_top_shows_the_ranks_a_straggler_and_the_goodput_and_quits_on_q(run: Path, tmp_path: Path) -> None:
    tmux = Tmux(tmp_path)
    env = f"PYTHONSAFEPATH=1 PATH={Path(sys.executable).parent}:{os.environ['PATH']}"
    command = f"env {env} zerotrain top {JOB} --log-dir {run} --interval 0.5; echo EXIT=$?; sleep 600"
    tmux("new-session", "-d", "-s", "top", "-x", "80", "-y", "24", command)
    try:
        named = tmux.wait("rank 1 named for its input", lambda s: "input 2." in s or "input 1." in s, budget(90))
        lines = named.splitlines()
        assert any(line.split()[:1] == ["0"] for line in lines), named
        (slow,) = [line for line in lines if line.split()[:1] == ["1"]]
        assert "input" in slow, named
        assert f"{JOB}  step " in named and "goodput " in named and "training" in named, named
        assert max(len(line.rstrip()) for line in lines) <= 80, named
        tmux("send-keys", "-t", "top", "q")
        left = tmux.wait("top's exit", lambda s: "EXIT=" in s, budget(15))
        assert "EXIT=0" in left, left
    finally:
        subprocess.run(["tmux", "-S", tmux.socket, "kill-server"], capture_output=True, timeout=30)
