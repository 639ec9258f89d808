"""Stages 1/2 gather the updated parameters after the step without blocking: each unit's gather is in flight when
`step()` returns, launched in the order the next forward needs them, and waited for just before the unit runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from dist_helpers import run_ranks
from tiny_models import batches, lm_loss, make_model


def states_around_a_step(rank: int, world: int, stage: int, overlap: bool) -> dict[str, Any]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(stage=stage, unit_modules=["Block"], overlap_comm=overlap)
    engine = ZeroEngine(make_model(), cfg, optimizer=lambda g: torch.optim.AdamW(g))
    launched: list[str] = []
    real = engine.comm.all_gather

    def recording(out: torch.Tensor, shard: torch.Tensor, unit: str, **kw: Any) -> Any:
        launched.append(unit)
        return real(out, shard, unit, **kw)

    engine.comm.all_gather = recording  # type: ignore[method-assign]
    seen: dict[str, list[str]] = {}
    for u in engine.units:
        if u.layout.module is not None:
            u.layout.module.register_forward_pre_hook(
                lambda *_, u=u: seen.setdefault("at_forward", []).append(u.params_state.value)
            )
    tokens = batches(2, world)[0][0][rank]
    engine.backward(lm_loss(engine(tokens), tokens))
    seen["at_forward"] = []
    engine.step()
    seen["after_step"] = [u.params_state.value for u in engine.units]
    seen["order"] = list(launched)
    engine(tokens)
    seen["after_forward"] = [u.params_state.value for u in engine.units]
    return seen


def states_overlapped_and_not(rank: int, world: int, stage: int) -> list[dict[str, list[str]]]:
    # Both in one spawn of the ranks: starting them costs more than a case.
    return [states_around_a_step(rank, world, stage, overlap) for overlap in (True, False)]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_post_step_gathers_overlap_the_next_forward(stage: int) -> None:
    ranks = run_ranks(states_overlapped_and_not, 2, stage)
    for seen in (r[0] for r in ranks):
        assert set(seen["after_step"]) == {"gathering"}, seen
        assert seen["order"][0] == "<root>" and seen["order"][1:] == ["blocks.0", "blocks.1", "blocks.2"], seen
        assert set(seen["at_forward"]) == {"gathered"} and set(seen["after_forward"]) == {"gathered"}, seen
    for seen in (r[1] for r in ranks):
        assert set(seen["after_step"]) == {"gathered"}, seen  # overlapComm: false waits in the step
