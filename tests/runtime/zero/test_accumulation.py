"""One accumulation dtype: under bf16 compute, micro-batch gradients sum in fp32 in every stage, so 8 micro-batches
give exactly the fp32 sum of their bf16 gradients (the reduction itself in fp32), never a bf16 running sum."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from dist_helpers import run_ranks
from torch import nn

D, G, B = 16, 8, 3


class Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Lin(), Lin())


def _data(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(B, D, generator=g) * 10 for _ in range(G)]


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


def accumulated(rank: int, world: int, stage: int) -> dict[str, Any]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(stage=stage, unit_modules=["Lin"], precision="bf16", gradient_accumulation_steps=G)
    engine = ZeroEngine(_model(), cfg, optimizer=lambda g: torch.optim.SGD(g, lr=0.0))
    for x in _data(rank):
        engine.backward(_loss(engine(x)))
    # After the boundary micro-batch every reduction is done: the fp32 gradients the optimizer would read.
    return {u.name: (u.master_range, u.grad_shard.clone()) for u in engine.units}


def reference(world: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per unit: the fp32 sum over micro-batches of each rank's bf16 gradients, averaged over ranks; and the same
    summed in bf16, as the compute dtype would."""
    fp32: dict[str, torch.Tensor] = {}
    bf16: dict[str, torch.Tensor] = {}
    for rank in range(world):
        model = _model().to(torch.bfloat16)
        acc32 = [torch.zeros(D * D) for _ in model]
        acc16 = [torch.zeros(D * D, dtype=torch.bfloat16) for _ in model]
        for x in _data(rank):
            model.zero_grad()
            (_loss(model(x.to(torch.bfloat16))) * (1.0 / G)).backward()
            for i, unit in enumerate(model):
                acc32[i] += unit.fc.weight.grad.reshape(-1)
                acc16[i] += unit.fc.weight.grad.reshape(-1)
        for i in range(len(model)):
            name = f"{i}"
            fp32[name] = fp32.get(name, torch.zeros(D * D)) + acc32[i]
            bf16[name] = bf16.get(name, torch.zeros(D * D)) + acc16[i].float()
    return {k: v / world for k, v in fp32.items()}, {k: v / world for k, v in bf16.items()}


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bf16_micro_batches_accumulate_in_fp32_in_every_stage(stage: int) -> None:
    world = 2
    want, bf16_sum = reference(world)
    for got in run_ranks(accumulated, world, stage):
        for name, ((lo, hi), grads) in got.items():
            expected = want[name][lo:hi]
            torch.testing.assert_close(grads[: expected.numel()], expected, rtol=1e-6, atol=1e-7)
            # A bf16 running sum would be visibly off: the test can tell the two apart.
            assert not torch.allclose(bf16_sum[name][lo:hi], expected, rtol=1e-6, atol=1e-7)
