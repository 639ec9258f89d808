"""Rank-divergent control flow fails fast with the rank and unit named: rank 1 skips a block's forward,
or its backward never reaches a block (activations detached after it)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from dist_helpers import run_ranks
from tiny_models import batches, lm_loss, make_model

TIMEOUT_S = 10


def train_two_steps(engine: Any, rank: int, world: int) -> None:
    for step in batches(2, world):
        tokens = step[0][rank]
        engine.backward(lm_loss(engine(tokens), tokens))
        engine.step()


def diverge(rank: int, world: int, stage: int, prefetch: int, how: str) -> tuple[str, str, float, int, str]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(stage=stage, unit_modules=["Block"], prefetch_units=prefetch, collective_timeout_seconds=TIMEOUT_S)
    odd = {how: 1} if rank == 1 else {}
    engine = ZeroEngine(make_model(**odd), cfg, optimizer=lambda g: torch.optim.AdamW(g))
    start = time.monotonic()
    try:
        train_two_steps(engine, rank, world)
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


def diverge_with(rank: int, world: int, stage: int, mode: str) -> tuple[str, str, list[float]]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(stage=stage, unit_modules=["Block"], divergence_check=mode, collective_timeout_seconds=TIMEOUT_S)
    engine = ZeroEngine(make_model(**({"skip": 1} if rank == 1 else {})), cfg, optimizer=lambda g: torch.optim.AdamW(g))
    before = [p.detach().clone() for p in engine.full_state_dict().values()]
    try:
        train_two_steps(engine, rank, world)
    except RuntimeError as e:
        after = engine.full_state_dict().values()
        return type(e).__name__, str(e), [float((a - b).abs().max()) for a, b in zip(after, before, strict=True)]
    return "none", "", []


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "where"), [("step", "optimizer step"), ("every_pass", "end of forward")])
def test_the_check_runs_where_its_mode_says_and_before_any_update(mode: str, where: str) -> None:
    """Stage 2: by default the check rides the step's control all-reduce; `every_pass` catches it at the forward.
    Either way the divergent step is never applied."""
    for kind, message, moved in run_ranks(diverge_with, 2, 2, mode, timeout=4 * TIMEOUT_S):
        assert kind == "RankDivergenceError", message
        assert f"up to the {where}" in message and "rank 1, unit 'blocks.1'" in message, message
        assert max(moved) == 0.0, "a step was applied with divergent gradients"


def count_collectives(rank: int, world: int, stage: int, mode: str) -> dict[str, float]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(stage=stage, unit_modules=["Block"], divergence_check=mode, gradient_accumulation_steps=2)
    engine = ZeroEngine(make_model(), cfg, optimizer=lambda g: torch.optim.AdamW(g))
    data = batches(3, world, micro=2)
    for step in data:
        for micro in step:
            tokens = micro[rank]
            engine.backward(lm_loss(engine(tokens), tokens))
            result = engine.step()
    assert result.loss is not None and result.grad_norm is None  # no clipping, fp32: no norm computed
    return {op: s["calls"] / len(data) for op, s in engine.accounting().comm_report().items()}


def count_collectives_of(rank: int, world: int, cases: tuple[tuple[int, str], ...]) -> list[dict[str, float]]:
    """`count_collectives` per (stage, mode), one engine after another in one spawn of the ranks."""
    return [count_collectives(rank, world, stage, mode) for stage, mode in cases]


@pytest.mark.slow
def test_one_control_collective_per_step_and_no_check_of_its_own() -> None:
    """Stages 0-2, default: the loss mean, votes and the check are one all-reduce per optimizer step; stage 3 adds
    one small asynchronous all-gather per forward (its backward follows its forward); `every_pass` two per pass."""
    stage2, stage3, passes = run_ranks(count_collectives_of, 2, ((2, "step"), (3, "step"), (2, "every_pass")))[0]
    assert stage2["control"] == 1 and "order_check" not in stage2, stage2
    assert stage3["control"] == 1 and stage3["order_check"] == 2, stage3  # 2 micro-batches, one per forward
    assert passes["control"] == 1 and passes["order_check"] == 4, passes
