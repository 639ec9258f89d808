"""Collective failures name their cause: a peer that died is not reported as rank divergence."""

from __future__ import annotations

import time

import pytest
import torch
from dist_helpers import run_ranks


def lose_peer(rank: int, world: int) -> str:
    from zerotrain.runtime.collectives import Comm, init_from_env
    from zerotrain.runtime.errors import PeerLostError

    init_from_env(30)
    comm = Comm(30)
    out, shard = torch.zeros(2 * world), torch.ones(2)
    comm.all_gather(out, shard, "warmup")
    if rank == 1:
        return "left"  # the harness then tears this rank's process group down: its peer is gone
    time.sleep(1.0)
    try:
        comm.all_gather(out, shard, "<root>")
    except PeerLostError as e:
        return str(e)
    return "no error"


@pytest.mark.slow
def test_a_dead_peer_is_reported_as_lost_not_as_divergence() -> None:
    message, _ = run_ranks(lose_peer, 2)
    assert message.startswith("rank 0: all_gather for unit '<root>' failed because a peer rank is gone"), message
    assert "rank-divergent" not in message and "look for the first rank that failed" in message
