"""The plan's communication per step (`zerotrain.plan.peak.comm_bytes_per_step`, the paper's 2Ψ/3Ψ made exact) is what
each rank's collectives send, op by op, per stage, dtype and accumulation."""

from __future__ import annotations

import pytest
import torch
from dist_helpers import run_ranks

ZERO_OPS = ("all_reduce", "reduce_scatter", "all_gather")


def sent_per_step(rank: int, world: int, stage: int, precision: str, micro: int) -> tuple[dict, dict]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.examples.gpt import build

    torch.manual_seed(0)
    task = build(rank, world, seq_len=16, batch_size=2 * world, d_model=32, n_layers=2, n_heads=2, max_bytes=20_000)
    cfg = ZeroConfig(stage=stage, unit_modules=["Block"], precision=precision, gradient_accumulation_steps=micro)
    engine = ZeroEngine(task.model, cfg, optimizer=lambda g: torch.optim.AdamW(g, lr=1e-3))

    def step() -> dict[str, float]:
        for _ in range(micro):
            batch = next(task.batches)
            engine.backward(task.loss(engine(task.inputs(batch)), batch))
        engine.step()
        return {op: s["bytes"] for op, s in engine.accounting().comm_report().items() if op in ZERO_OPS}

    first = step()  # the first step also broadcasts and sizes things: count the second
    second = step()
    return {op: second[op] - first.get(op, 0) for op in second}, engine.accounting().planned_comm()


CASES = (("fp32", 1), ("bf16", 2))


def sent_per_step_cases(rank: int, world: int, stage: int) -> list[tuple[dict, dict]]:
    # Both cases in one spawn of the ranks: starting them costs more than a case here.
    return [sent_per_step(rank, world, stage, precision, micro) for precision, micro in CASES]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_op_sends_what_the_plan_says(stage: int) -> None:
    for results in run_ranks(sent_per_step_cases, 2, stage):
        for (precision, micro), (measured, planned) in zip(CASES, results, strict=True):
            assert measured == planned, (precision, micro, measured, planned)
