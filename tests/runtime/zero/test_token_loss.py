"""A loss given as a sum over counted tokens is one process's loss, however unevenly ranks and micro-batches count.

Answer-only labels leave every micro-batch with its own number of counted tokens. Here rank 1's micro-batches count
about five times rank 0's. With `backward(sum, tokens=count)` the step's loss and update must equal one process
training on the whole global batch (mean over every counted token), at every stage, with accumulation; averaging
each rank's own mean (what DDP and DeepSpeed do) must not, which the same comparison shows.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from dist_helpers import run_ranks
from tiny_models import make_model

STEPS = 10
ACCUM = 2
VOCAB = 13
TOLERANCE = 1e-6


def labelled_batches(world: int) -> list[list[list[tuple[torch.Tensor, torch.Tensor]]]]:
    """[step][micro][rank] (tokens, labels): labels are the next token, -100 where not counted; rank 0 counts one
    position in six of its rows, rank 1 five in six (the counts also vary from micro-batch to micro-batch)."""
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        step = []
        for _ in range(ACCUM):
            micro = []
            for rank in range(world):
                tokens = torch.randint(0, VOCAB, (2, 13), generator=g)
                labels = torch.cat([tokens[:, 1:], torch.full((2, 1), -100)], dim=1)
                keep = torch.rand(labels.shape, generator=g) < (1 / 6 if rank == 0 else 5 / 6)
                labels = labels.masked_fill(~keep, -100)
                micro.append((tokens, labels))
            step.append(micro)
        out.append(step)
    return out


def summed(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    flat = logits.reshape(-1, logits.shape[-1]).float()
    total = F.cross_entropy(flat, labels.reshape(-1), ignore_index=-100, reduction="sum")
    return total, (labels != -100).sum()


def optimizer(groups: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.1, eps=1e-6)


def reference(data: list) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process, the global batch of each step: Σ loss over every counted token / their number."""
    model = make_model(seed=0, tied=False)
    opt = optimizer([{"params": list(model.parameters())}])
    losses = []
    for step in data:
        opt.zero_grad()
        pairs = [pair for micro in step for pair in micro]
        count = sum(int((labels != -100).sum()) for _, labels in pairs)
        total = sum(summed(model(tokens), labels)[0] for tokens, labels in pairs)
        loss = total / count
        loss.backward()
        losses.append(float(loss))
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses


def train(rank: int, stage: int, data: list, per_rank_mean: bool) -> tuple[dict[str, torch.Tensor], list[float]]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    config = ZeroConfig(stage=stage, unit_modules=["Block"], gradient_accumulation_steps=ACCUM)
    engine = ZeroEngine(make_model(seed=0, tied=False), config, optimizer=optimizer)
    losses = []
    for step in data:
        for micro in step:
            tokens, labels = micro[rank]
            total, count = summed(engine(tokens), labels)
            if per_rank_mean:
                engine.backward(total / count.clamp_min(1))
            else:
                engine.backward(total, tokens=count)
            result = engine.step()
        assert result.loss is not None
        losses.append(result.loss)
    return engine.full_state_dict(), losses


def run(rank: int, world: int) -> dict[str, Any]:
    data = labelled_batches(world)
    out: dict[str, Any] = {"stages": {s: train(rank, s, data, False) for s in range(4)}}
    out["per_rank_mean"] = train(rank, 2, data, True)
    if rank == 0:
        out["reference"] = reference(data)  # in a rank: the same single thread as the engines
    return out


Run = tuple[dict[str, torch.Tensor], list[float]]


def largest_difference(a: Run, b: Run) -> tuple[float, float]:
    params = max(float((a[0][n] - b[0][n]).abs().max()) for n in b[0])
    losses = max(abs(x - y) for x, y in zip(a[1], b[1], strict=True))
    return params, losses


def test_summed_losses_equal_one_process_on_the_global_batch_at_every_stage_and_per_rank_means_do_not() -> None:
    results = run_ranks(run, 2)
    ref = results[0]["reference"]
    counts = [[int((m[r][1] != -100).sum()) for m in step for r in range(2)] for step in labelled_batches(2)]
    rank0, rank1 = sum(sum(c[0::2]) for c in counts), sum(sum(c[1::2]) for c in counts)
    assert 4 <= rank1 / rank0 <= 6, (rank0, rank1)  # the two ranks count about 1:5
    for stage in range(4):
        params, losses = largest_difference(results[0]["stages"][stage], ref)
        assert params <= TOLERANCE and losses <= TOLERANCE, (stage, params, losses)
        assert results[0]["stages"][stage][1] == results[1]["stages"][stage][1]  # every rank reports one loss
    params, losses = largest_difference(results[0]["per_rank_mean"], ref)
    assert params > 100 * TOLERANCE and losses > 100 * TOLERANCE, (params, losses)
