"""bench/runtime/bench_hf_plan.py: a Hugging Face job's planned activations against what torch allocates, within
±5% and never under by more than 2%: a sample of the grid on every run, the whole grid in the long tier (its table
is docs/memory.md's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "runtime"
sys.path[:0] = [str(BENCH)]

import bench_hf_plan  # noqa: E402

pytest.importorskip("transformers")


def _within(rows: list[dict[str, object]]) -> None:
    bad = [r for r in rows if not -0.02 <= float(r["error"]) <= 0.05]  # type: ignore[arg-type]
    assert not bad, [(r["name"], f"{float(r['error']):+.2%}") for r in bad]  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_sample_of_every_family_is_planned_as_torch_allocates_it(tmp_path: Path) -> None:
    rows = [bench_hf_plan.measure(point, tmp_path) for point in bench_hf_plan.sample()]
    assert {r["family"] for r in rows} == set(bench_hf_plan.FAMILIES)
    assert all(int(r["measured"]) > 500_000 for r in rows)  # the meter saw the model run  # type: ignore[call-overload]
    _within(rows)


@pytest.mark.slow
def test_the_whole_grid_is_planned_as_torch_allocates_it(tmp_path: Path) -> None:
    points = bench_hf_plan.grid()
    assert len(points) == 6 * 3 * 2 * 2 * 2 * 2
    _within([bench_hf_plan.measure(point, tmp_path) for point in points])
