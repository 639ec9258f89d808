"""The example GPT: tied embedding and output projection, pre-norm Blocks as units, a sane initial loss."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from zerotrain.runtime.examples import gpt
from zerotrain.runtime.job.data import read_text_corpus
from zerotrain.runtime.job.task import ConfigError, TrainingTask


def small(rank: int = 0, world: int = 1) -> TrainingTask:
    torch.manual_seed(0)
    return gpt.build(rank, world, seq_len=32, batch_size=4, d_model=32, n_layers=2, n_heads=4, max_bytes=100_000)


def test_build_returns_a_task_with_block_units() -> None:
    task = small()
    assert isinstance(task.model, gpt.GPT)
    assert task.unit_modules == ["Block"]
    assert sum(isinstance(m, gpt.Block) for m in task.model.modules()) == 2


def test_output_projection_is_tied_to_the_embedding() -> None:
    model = small().model
    assert model.head.weight is model.embed.weight
    names = [n for n, _ in model.named_parameters()]
    assert "head.weight" not in names  # one Parameter, listed once
    d, layers, seq = 32, 2, 32
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert sum(p.numel() for p in model.parameters()) == 256 * d + seq * d + layers * block + 2 * d


def test_initial_loss_is_uniform_over_bytes() -> None:
    task = small()
    batch = next(task.batches)
    loss = task.loss(task.model(task.inputs(batch)), batch)
    assert loss.shape == ()
    assert abs(loss.item() - math.log(256)) < 0.3  # near-uniform; tying lets a byte favour itself slightly


def test_a_few_plain_adamw_steps_lower_the_loss() -> None:
    task = small()
    opt = torch.optim.AdamW(task.model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        batch = next(task.batches)
        loss = task.loss(task.model(task.inputs(batch)), batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0


def test_heads_must_divide_width() -> None:
    with pytest.raises(ConfigError, match=r"spec\.entrypointArgs\.d_model: got 30.*n_heads=4"):
        gpt.build(0, 1, d_model=30, n_heads=4, max_bytes=10_000)


def test_quickstart_states_the_parameter_count_of_the_model_it_builds() -> None:
    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml").read_text())["spec"]
    args = {k: v for k, v in spec["entrypointArgs"].items() if k not in ("batch_size", "max_bytes")}
    model = gpt.GPT(**args)
    assert sum(p.numel() for p in model.parameters()) == spec["model"]["parameters"]
    assert read_text_corpus(max_bytes=spec["entrypointArgs"]["max_bytes"]).numel() == 2_000_000
