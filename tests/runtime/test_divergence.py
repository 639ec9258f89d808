"""Rank-divergent control flow fails fast with the rank and unit named: rank 1 skips a block's forward,
or its backward never reaches a block (activations detached after it)."""

from __future__ import annotations

import time

import pytest
import torch
from dist_helpers import run_ranks
from tiny_models import batches, lm_loss, make_model

TIMEOUT_S = 10


def diverge(rank: int, world: int, stage: int, prefetch: int, how: str) -> tuple[str, str, float, int, str]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(stage=stage, unit_modules=["Block"], prefetch_units=prefetch, collective_timeout_seconds=TIMEOUT_S)
    odd = {how: 1} if rank == 1 else {}
    engine = ZeroEngine(make_model(**odd), cfg, optimizer=lambda g: torch.optim.AdamW(g))
    start = time.monotonic()
    try:
        for step in batches(2, world):
            tokens = step[0][rank]
            engine.backward(lm_loss(engine(tokens), tokens))
            engine.step()
    except RuntimeError as e:
        return type(e).__name__, str(e), time.monotonic() - start, getattr(e, "rank", -1), getattr(e, "unit", "")
    return "none", "", time.monotonic() - start, -1, ""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "prefetch", "how"),
    [(3, 0, "skip"), (3, 1, "skip"), (2, 1, "skip"), (3, 1, "cut"), (2, 1, "cut")],
)
def test_a_rank_diverging_fails_within_the_timeout_naming_rank_and_unit(stage: int, prefetch: int, how: str) -> None:
    results = run_ranks(diverge, 2, stage, prefetch, how, timeout=4 * TIMEOUT_S)
    # With `cut`, blocks 0 and 1 never complete on rank 1; the first difference found is block 0.
    culprit = "blocks.1" if how == "skip" else "blocks.0"
    for kind, message, elapsed, rank, unit in results:
        # Every rank reports the same culprit: rank 1 (not the rank reporting) and its unit.
        assert kind == "RankDivergenceError", message
        assert elapsed < TIMEOUT_S
        assert (rank, unit) == (1, culprit), message
        assert f"rank 1, unit '{culprit}'" in message, message
