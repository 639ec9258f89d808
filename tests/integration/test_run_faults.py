"""`zerotrain run` under faults: one account that leads with the root cause, printed verbatim, never a crash of
the launcher itself; throughput in the task's own unit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from budget import budget
from test_run_preemption import _rank_of, job, rank_pids, start, wait_for_step

from zerotrain.cli import main

# An entry point of the user's own: an MLP of residual layers on synthetic regression, no tokens.
TASK = """
import torch
from torch import nn
from zerotrain.runtime.job.task import TrainingTask


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


def batches(rank, world_size, rows):
    g = torch.Generator().manual_seed(0)
    while True:
        x = torch.randn(rows, 8, generator=g)
        yield x[rank * rows // world_size : (rank + 1) * rows // world_size]


def build(rank, world_size, fail_rank=-1):
    if rank == fail_rank:
        raise ValueError("[bold]not markup[/] and [/__w/gloo/pair.cc:537]")
    model = nn.Sequential(*(Layer(8) for _ in range(4)), nn.Linear(8, 1))
    return TrainingTask(
        model=model,
        loss=lambda out, x: (out.squeeze(-1) - x.sum(-1)).square().mean(),
        batches=batches(rank, world_size, 8),
        samples_per_batch=8 // world_size,
        unit_modules=["Layer"],
    )
"""


def custom_job(tmp_path: Path, **args: int) -> Path:
    (tmp_path / "mytask.py").write_text(TASK)
    doc = {
        "apiVersion": "zerotrain.dev/v1alpha1",
        "kind": "ZeroTrainingJob",
        "metadata": {"name": "regression"},
        "spec": {
            "image": "unused",
            "entrypoint": "mytask:build",
            "entrypointArgs": args,
            "replicas": 2,
            "zero": {"stage": 2},
            "training": {"steps": 20, "logEvery": 5},
            "metrics": {"enabled": False},
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(tmp_path: Path, manifest: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "zerotrain.cli", "run", str(manifest), "--log-dir", str(tmp_path / "logs"), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=budget(240), cwd=tmp_path)


@pytest.mark.slow
def test_a_task_without_tokens_reports_samples_per_second(tmp_path: Path) -> None:
    proc = run(tmp_path, custom_job(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "samples/s" in proc.stdout and "tokens/s" not in proc.stdout, proc.stdout


@pytest.mark.slow
def test_an_exception_text_with_brackets_prints_verbatim_without_a_traceback(tmp_path: Path) -> None:
    proc = run(tmp_path, custom_job(tmp_path, fail_rank=1))
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, out
    assert (
        "rank 1 failed first: it exited with status 1: ValueError: [bold]not markup[/] and [/__w/gloo/pair.cc:537]"
        in out
    )
    assert "Traceback" not in out  # neither the launcher's own nor the rank's (ZEROTRAIN_DEBUG=1 or --debug shows it)
    (trace,) = (tmp_path / "logs").glob("*/attempt_0/1/traceback.txt")
    assert "Traceback" in trace.read_text() and "raise ValueError" in trace.read_text()
    assert f"logs: {trace.parent}/ (stderr.log, stdout.log, traceback.txt)" in out

    debug = run(tmp_path, custom_job(tmp_path, fail_rank=1), "--debug")
    assert debug.returncode == 1 and "raise ValueError" in debug.stdout + debug.stderr


@pytest.mark.slow
def test_a_rank_killed_mid_run_is_named_first_and_its_peer_says_why_it_stopped(tmp_path: Path) -> None:
    proc = start(tmp_path, job(tmp_path), tmp_path / "ckpt")
    wait_for_step(proc, 3)
    victim = next(p for p in rank_pids(proc.pid) if _rank_of(p) == 1)
    os.kill(victim, signal.SIGKILL)  # as the OOM killer would
    killed_at = time.monotonic()
    output, _ = proc.communicate(timeout=budget(60))
    out = " ".join(output.split())
    assert proc.returncode == 128 + signal.SIGKILL, output
    assert time.monotonic() - killed_at < 15, "the launcher took too long to notice"
    assert "rank-failed: rank 1 failed first: it was killed by SIGKILL from outside" in out, output
    assert "(exit status 137)" in out, output
    assert "rank 0 stopped: its peer was gone" in out, output
    assert "Traceback" not in out and "MarkupError" not in out, output


def test_cli_errors_print_bracketed_values_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--params", "[bold]1e9[/]"]) == 2
    assert "[bold]1e9[/]" in capsys.readouterr().err
