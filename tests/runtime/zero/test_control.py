"""The step's control vector: summing the ranks' vectors (what the all-reduce does) yields the loss mean, the vote
count, the norm and a fingerprint comparison that is exact for any world size."""

from __future__ import annotations

import random

import pytest
import torch

from zerotrain.runtime.zero.control import fingerprint_bits, pack, unpack

CPU = torch.device("cpu")


def summed(prints: list[int], losses: list[float] | None = None, votes: list[bool] | None = None) -> torch.Tensor:
    n = len(prints)
    losses = losses or [0.0] * n
    votes = votes or [False] * n
    vecs = [
        pack(torch.tensor(loss), vote, torch.tensor(1.5), fp, n, CPU)
        for fp, loss, vote in zip(prints, losses, votes, strict=True)
    ]
    return torch.stack(vecs).sum(0)


@pytest.mark.parametrize("world", [2, 3, 8, 64, 1024])
def test_equal_fingerprints_agree_and_any_difference_is_seen(world: int) -> None:
    rng = random.Random(world)
    for _ in range(10):
        h = rng.getrandbits(61)
        assert unpack(summed([h] * world), world, 1, True).consistent
        odd = list([h] * world)
        # A difference in either piece of the fingerprint, on any rank.
        odd[rng.randrange(world)] = h ^ (1 << rng.randrange(2 * fingerprint_bits(world)))
        assert not unpack(summed(odd), world, 1, True).consistent


def test_sums_stay_exact_in_float64() -> None:
    for world in (2, 1024, 1 << 16):
        bits = fingerprint_bits(world)
        assert world * world * (1 << (2 * bits)) <= 1 << 53, world


def test_loss_mean_votes_and_norm() -> None:
    got = unpack(summed([7, 7, 7, 7], losses=[1.0, 2.0, 3.0, 6.0], votes=[False, True, False, True]), 4, 2, True)
    assert got.loss == pytest.approx(12.0 / (4 * 2))  # loss sums over 2 micro-batches, mean over ranks and them
    assert got.votes == 2 and got.norm_sq == pytest.approx(4 * 1.5)
    assert unpack(summed([7, 7]), 2, 1, had_loss=False).loss is None
