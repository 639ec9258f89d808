"""Rank-divergent control flow (rank 1 skips a block's forward) fails fast with the rank and unit named."""

from __future__ import annotations

import time

import pytest
import torch
from dist_helpers import run_ranks
from tiny_models import batches, lm_loss, make_model

TIMEOUT_S = 10


def diverge(rank: int, world: int, stage: int, prefetch: int) -> tuple[str, str, float, int, str]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(stage=stage, unit_modules=["Block"], prefetch_units=prefetch, collective_timeout_seconds=TIMEOUT_S)
    engine = ZeroEngine(make_model(skip=1 if rank == 1 else -1), cfg, optimizer=lambda g: torch.optim.AdamW(g))
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
@pytest.mark.parametrize(("stage", "prefetch"), [(3, 0), (3, 1), (2, 1)])
def test_a_rank_skipping_a_unit_fails_within_the_timeout_naming_rank_and_unit(stage: int, prefetch: int) -> None:
    for kind, message, elapsed, rank, unit in run_ranks(diverge, 2, stage, prefetch, timeout=4 * TIMEOUT_S):
        # Every rank reports the same culprit: rank 1 (not the rank reporting) and the unit it skipped.
        assert kind == "RankDivergenceError", message
        assert elapsed < TIMEOUT_S
        assert (rank, unit) == (1, "blocks.1"), message
        assert "rank 1" in message and "'blocks.1'" in message, message
