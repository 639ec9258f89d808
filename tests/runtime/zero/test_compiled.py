"""Compiled units (`zero.compile`) on real gloo ranks: each block's forward is compiled (inductor) with the engine's
hooks outside it, and training matches single-process AdamW at stages 1 and 3, with the stage-3 prefetch and with
activation checkpointing; bf16 matches the eager engine to bf16's tolerance. A block that cannot compile to one
graph runs eagerly, named once in a warning, and trains exactly as eager does."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import tiny_models
import torch
from dist_helpers import run_ranks
from test_stages import Case, _check_parity, engine_for, run_case
from tiny_models import batches, lm_loss

COMPILE = {"compile_units": True}


def _trained(rank: int, world: int, case: Case) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    engine = engine_for(case)
    for step in batches(3, world):
        engine.backward(lm_loss(engine(step[0][rank]), step[0][rank]))
        engine.step()
    return engine.full_state_dict(), dict(engine._eager_units)


def _breaking_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    torch._dynamo.graph_break()
    return _plain_forward(self, x)


_plain_forward = tiny_models.Block.forward


def compiled_cases(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, case in {
        "stage3": Case(stage=3, extra=COMPILE),
        "stage3-recompute": Case(stage=3, checkpointing=True, extra=COMPILE),
        "stage1": Case(stage=1, extra=COMPILE),
    }.items():
        out[name] = run_case(rank, world, case)
    bf16 = {"precision": "bf16", "reduce_dtype": "fp32"}
    out["bf16"] = (
        _trained(rank, world, Case(stage=3, extra={**bf16, **COMPILE})),
        _trained(rank, world, Case(3, extra=bf16)),
    )
    seen: list[str] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logging.getLogger("zerotrain.runtime.zero.compiled").addHandler(Seen())
    tiny_models.Block.forward = _breaking_forward  # type: ignore[method-assign]
    try:
        out["breaks"] = (_trained(rank, world, Case(stage=3, extra=COMPILE)), _trained(rank, world, Case(stage=3)))
    finally:
        tiny_models.Block.forward = _plain_forward  # type: ignore[method-assign]
    out["warnings"] = seen
    return out


@pytest.mark.slow
def test_compiled_blocks_train_as_eager_and_as_adamw() -> None:
    for r in run_ranks(compiled_cases, 2, timeout=600):
        for name in ("stage3", "stage3-recompute", "stage1"):
            _check_parity(r[name])
        (got, eager_units), (want, _) = r["bf16"]
        assert eager_units == {}  # every block compiled
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=2e-2, atol=2e-3, msg=lambda m, k=key: f"{k}: {m}")
        (got, eager_units), (want, _) = r["breaks"]
        assert sorted(eager_units) == ["blocks.0", "blocks.1", "blocks.2"], eager_units
        assert len(r["warnings"]) == 1 and "'blocks.0'" in r["warnings"][0] and "graph_break" in r["warnings"][0]
        for key, value in want.items():
            assert torch.equal(got[key], value), key  # eager after the break: the same computation
