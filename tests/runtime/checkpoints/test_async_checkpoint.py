"""Asynchronous checkpoints on real gloo ranks: the step loop goes on while the files are written, the checkpoint
commits only at the step at which every rank's write is done (the slowest rank decides), what it holds is the state
of the step it was started at (the same bytes a synchronous save writes), a rank killed during a background write
leaves the previous checkpoint the newest, and a directory that cannot be fsynced is refused naming the field."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from budget import budget
from dist_helpers import run_ranks
from tiny_models import batches, lm_loss, make_model

from zerotrain.runtime.checkpoints import checkpoint
from zerotrain.runtime.checkpoints.async_save import check_directory_fsync
from zerotrain.runtime.job.task import ConfigError

SLOW_WRITE_S = 1.5


def _adamw(g: list) -> torch.optim.Optimizer:
    return torch.optim.AdamW(g, lr=1e-3, weight_decay=0.1, eps=1e-6)


def _engine():  # type: ignore[no-untyped-def]
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    return ZeroEngine(make_model(seed=0), ZeroConfig(stage=3, unit_modules=["Block"]), optimizer=_adamw)


def _step(engine, data, rank: int, written: bool = False):  # type: ignore[no-untyped-def]
    tokens = data[0][rank]
    engine.backward(lm_loss(engine(tokens), tokens))
    return engine.step(written=written)


def save_while_training(rank: int, world: int, root: str) -> dict[str, object]:
    from zerotrain.runtime.checkpoints import async_save

    engine = _engine()
    data = batches(12, world)
    for step in data[:3]:
        _step(engine, step, rank)
    sync_dir = checkpoint.save(engine, Path(root) / "sync")  # the same step, saved synchronously
    slow = SLOW_WRITE_S * (1 + rank)  # rank 1 writes slowest: the commit must wait for it
    real_write = checkpoint.write_rank

    def slow_write(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(slow)
        return real_write(*args, **kwargs)

    async_save.checkpoint.write_rank = slow_write  # type: ignore[assignment]
    saver = async_save.AsyncSaver()
    t0 = time.perf_counter()
    target = saver.start(engine, Path(root) / "async")
    blocked = time.perf_counter() - t0
    steps_before_commit, committed_at = 0, None
    for i in range(400):
        time.sleep(0.05)  # the compute of a step of a real model, which the write overlaps
        out = _step(engine, data[3 + i % 9], rank, written=saver.written())
        if saver.commit_if_agreed(engine, out.written) is not None:
            committed_at = time.perf_counter() - t0
            break
        steps_before_commit = i + 1
        assert not (target / checkpoint.COMMITTED).exists()
    assert saver.finish(engine) is None  # nothing left in flight
    return {
        "blocked": blocked,
        "committed_at": committed_at,
        "steps_before_commit": steps_before_commit,
        "target": str(target),
        "sync": str(sync_dir),
    }


@pytest.mark.slow
def test_the_loop_goes_on_while_writing_and_the_slowest_rank_decides_the_commit(tmp_path: Path) -> None:
    per_rank = run_ranks(save_while_training, 2, str(tmp_path))
    for r in per_rank:
        assert r["blocked"] < SLOW_WRITE_S / 3, r  # the write is not in the loop's time
        assert r["steps_before_commit"] >= 1, r  # training went on while the files were written
        assert r["committed_at"] is not None and r["committed_at"] >= 2 * SLOW_WRITE_S, r  # rank 1's write
    target, sync = Path(per_rank[0]["target"]), Path(per_rank[0]["sync"])
    assert checkpoint.latest(tmp_path / "async") == target
    mine, theirs = checkpoint.read_marker(target), checkpoint.read_marker(sync)
    assert (mine["step"], mine["micro_batches"]) == (theirs["step"], theirs["micro_batches"]) == (3, 3)
    for r in range(2):
        name = checkpoint.rank_file(r)
        from safetensors.torch import load_file

        a, b = load_file(target / name), load_file(sync / name)
        assert a.keys() == b.keys()
        for key in a:
            if not key.startswith("rng."):  # the RNG moved on between the two saves (the sync one came first)
                assert torch.equal(a[key], b[key]), key


KILLED_DURING_WRITE = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import torch
from tiny_models import batches, lm_loss, make_model
from zerotrain.runtime import ZeroConfig, ZeroEngine
from zerotrain.runtime.checkpoints import async_save, checkpoint

engine = ZeroEngine(make_model(seed=0), ZeroConfig(stage=1, unit_modules=["Block"]),
                    optimizer=lambda g: torch.optim.AdamW(g, lr=1e-3))
root = Path({root!r})
for i, step in enumerate(batches(2, 1)):
    engine.backward(lm_loss(engine(step[0][0]), step[0][0]))
    engine.step()
    if i == 0:
        checkpoint.save(engine, root)
real = checkpoint.write_rank
def stuck(target, *a, **k):
    (target / "rank-00000.safetensors.tmp").write_bytes(b"half")  # a write cut short
    print("writing", flush=True)
    time.sleep(60)
async_save.checkpoint.write_rank = stuck
async_save.AsyncSaver().start(engine, root)
time.sleep(60)
"""


@pytest.mark.slow
def test_a_rank_killed_during_a_background_write_leaves_the_previous_checkpoint_newest(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    script = KILLED_DURING_WRITE.format(tests=str(Path(__file__).parents[1]), root=str(root))  # tests/runtime
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=budget(30))
    dirs = sorted(p.name for p in root.glob("step-*"))
    assert len(dirs) == 2 and dirs[0].startswith("step-00000001") and dirs[1].startswith("step-00000002")
    assert checkpoint.latest(root) == root / dirs[0]  # the half-written save has no marker: ignored


def test_a_directory_that_cannot_be_fsynced_is_refused_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_directory_fsync(tmp_path / "ok")  # a real directory here fsyncs

    def refuse(fd: int) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "fsync", refuse)
    with pytest.raises(ConfigError, match=r"spec\.checkpoint\.async: true, but .* cannot fsync a directory") as e:
        check_directory_fsync(tmp_path / "nfs")
    assert "checkpoint.async: false" in str(e.value)
