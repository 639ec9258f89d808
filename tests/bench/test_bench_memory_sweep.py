"""bench/runtime/bench_memory_sweep.py: the smallest resources.memory the plan accepts runs 20 steps, and 15% less is
refused by validate and run before any rank starts (two of its 24 jobs, in the long tier; the whole sweep's table
is docs/memory.md's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "runtime"
sys.path[:0] = [str(BENCH)]

import bench_memory_sweep  # noqa: E402

pytest.importorskip("peft")


@pytest.mark.slow
@pytest.mark.parametrize("index", [10, 21], ids=["qwen2-stage3-ckpt-padded", "gpt2-stage2-lora-packed"])
def test_accepted_runs_and_fifteen_percent_less_is_refused(tmp_path: Path, index: int) -> None:
    job = bench_memory_sweep.jobs()[index]
    row = bench_memory_sweep.sweep_one(job, tmp_path)
    assert row["ran"], row
    assert all(peak <= row["share_bytes"] for peak in row["peaks"]) and len(row["peaks"]) == 2, row
    assert row["short_refused_by_validate"] and row["short_refused_by_run"], row
