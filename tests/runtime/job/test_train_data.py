"""Text data: the stdlib corpus is read deterministically, and the global batch does not depend on the world size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zerotrain.runtime.examples import gpt
from zerotrain.runtime.job.data import TextBatches, read_text_corpus, stdlib_dir
from zerotrain.runtime.job.task import ConfigError


@pytest.fixture(scope="module")
def corpus() -> torch.Tensor:
    return read_text_corpus(max_bytes=200_000)


def test_corpus_is_the_sorted_stdlib_sources(corpus: torch.Tensor) -> None:
    first = min(p for p in stdlib_dir().iterdir() if p.suffix == ".py" and p.is_file())
    head = first.read_bytes()[:1000]
    assert bytes(corpus[: len(head)].tolist()) == head
    assert corpus.numel() == 200_000
    assert torch.equal(read_text_corpus(max_bytes=200_000), corpus)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_global_batch_is_world_size_invariant(corpus: torch.Tensor, accumulation: int) -> None:
    """Step t's global batch (all ranks' micro-batches of that step) is identical for W = 1, 2, 4."""
    steps, batch = 3, 8

    def global_steps(world: int) -> list[torch.Tensor]:
        streams = [
            iter(TextBatches(corpus, seq_len=16, batch_size=batch, rank=r, world_size=world, seed=7))
            for r in range(world)
        ]
        out = []
        for _ in range(steps):
            micro = [torch.cat([next(s) for s in streams]) for _ in range(accumulation)]
            out.append(torch.cat(micro))
        return out

    reference = global_steps(1)
    assert reference[0].shape == (batch * accumulation, 17)
    for world in (2, 4):
        for got, want in zip(global_steps(world), reference, strict=True):
            assert torch.equal(got, want)
    assert not torch.equal(reference[0], reference[1])  # steps differ


def test_rows_are_consecutive_bytes_of_the_text(corpus: torch.Tensor) -> None:
    row = next(iter(TextBatches(corpus, seq_len=32, batch_size=4, rank=1, world_size=2, seed=0)))[0]
    text = bytes(corpus.tolist())
    assert bytes(row.tolist()) in text


def test_seed_changes_the_order(corpus: torch.Tensor) -> None:
    a = TextBatches(corpus, seq_len=16, batch_size=4, rank=0, world_size=1, seed=0).global_batch(0)
    b = TextBatches(corpus, seq_len=16, batch_size=4, rank=0, world_size=1, seed=1).global_batch(0)
    assert not torch.equal(a, b)


def test_uneven_split_names_the_field(corpus: torch.Tensor) -> None:
    with pytest.raises(ConfigError, match=r"spec\.entrypointArgs\.batch_size: got 6.*4 ranks.*multiple"):
        TextBatches(corpus, seq_len=16, batch_size=6, rank=0, world_size=4)


def test_empty_text_dir_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"spec\.entrypointArgs\.text_dir: no \.py source files"):
        read_text_corpus(tmp_path)


def test_gpt_tasks_split_the_same_global_batch() -> None:
    """The example entry point itself: two ranks' first micro-batches concatenate to the single rank's."""

    def first_batch(rank: int, world: int) -> torch.Tensor:
        torch.manual_seed(3)
        task = gpt.build(rank, world, seq_len=16, batch_size=4, d_model=16, n_layers=1, n_heads=2, max_bytes=50_000)
        assert task.tokens_per_batch == 4 // world * 16
        return next(task.batches)

    assert torch.equal(torch.cat([first_batch(0, 2), first_batch(1, 2)]), first_batch(0, 1))
