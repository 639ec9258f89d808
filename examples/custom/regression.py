"""A job of your own: your model, your data, one function returning a TrainingTask.

`zerotrain run examples/custom/job.yaml` finds this module beside the manifest (or on the Python path, as in an
image); spec.entrypoint names it as `regression:build` and spec.entrypointArgs are build's keyword arguments.
"""

import torch
from torch import nn

from zerotrain.runtime import TrainingTask


class Block(nn.Module):  # a ZeRO unit: stage 3 gathers one block's parameters at a time
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.norm(x)))


def batches(rank: int, world_size: int, batch_size: int, width: int):
    """Every rank draws the same global batch and keeps its slice: the run equals one process on the whole batch."""
    g = torch.Generator().manual_seed(0)
    target = torch.randn(width, 1, generator=g)
    while True:
        x = torch.randn(batch_size, width, generator=g)
        mine = x.chunk(world_size)[rank]
        yield mine, torch.sin(mine @ target)


def build(rank: int, world_size: int, width: int = 64, depth: int = 4, batch_size: int = 64) -> TrainingTask:
    model = nn.Sequential(*(Block(width) for _ in range(depth)), nn.Linear(width, 1))
    return TrainingTask(
        model=model,  # identical on every rank: the runtime seeds torch from spec.training.seed first
        loss=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batches=batches(rank, world_size, batch_size, width),
        inputs=lambda batch: batch[0],
        samples_per_batch=batch_size // world_size,
        unit_modules=["Block"],
    )
