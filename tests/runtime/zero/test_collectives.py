"""Collective failures name their cause: a peer that died is not reported as rank divergence."""

from __future__ import annotations

import time

import pytest
import torch
from dist_helpers import run_ranks


def lose_peer(rank: int, world: int) -> str:
    from zerotrain.runtime.zero.collectives import Comm
    from zerotrain.runtime.zero.engine_errors import PeerLostError
    from zerotrain.runtime.zero.process_group import init_from_env

    init_from_env(30, torch.device("cpu"))
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


def record_devices(rank: int, world: int) -> list[tuple[str, str]]:
    """Every tensor any collective of a training step carries, as (op, device type)."""
    import torch.distributed as dist
    from tiny_models import batches, lm_loss, make_model

    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.zero import collectives

    seen: list[tuple[str, str]] = []

    def wrap(owner: object, name: str, op: str) -> None:
        original = getattr(owner, name)

        def recording(*args: object, **kwargs: object) -> object:
            for t in [*args, *kwargs.values()]:
                for x in t if isinstance(t, list) else [t]:
                    if isinstance(x, torch.Tensor):
                        seen.append((op, x.device.type))
            return original(*args, **kwargs)

        setattr(owner, name, recording)

    for name in ("all_reduce", "broadcast", "all_gather", "gather"):
        wrap(dist, name, name)
    wrap(collectives, "_all_gather_flat", "all_gather_into_tensor")
    wrap(collectives, "_reduce_scatter_flat", "reduce_scatter_tensor")
    engine = ZeroEngine(make_model(), ZeroConfig(stage=3, unit_modules=["Block"]), lambda g: torch.optim.AdamW(g))
    tokens = batches(1, world)[0][0][rank]
    engine.backward(lm_loss(engine(tokens), tokens))
    engine.step()
    return seen


def test_every_collective_tensor_is_on_a_device_the_group_serves() -> None:
    from zerotrain.runtime.zero.process_group import process_group_backend, served_devices

    # With CUDA, CPU control tensors (the divergence check) would hang or fail on a NCCL-only group.
    assert served_devices(process_group_backend(cuda=True)) == {"cpu", "cuda"}
    assert served_devices("nccl") == {"cuda"} and served_devices(process_group_backend(cuda=False)) == {"cpu"}
    served = served_devices(process_group_backend(torch.cuda.is_available()))
    seen = run_ranks(record_devices, 2)[0]
    ops = {op for op, _ in seen}
    assert {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"} <= ops, ops  # the step was recorded
    assert {device for _, device in seen} <= served, seen


class _Work:
    """Records how it was waited for."""

    def __init__(self) -> None:
        self.waits: list[dict[str, object]] = []

    def wait(self, **kwargs: object) -> bool:
        self.waits.append(kwargs)
        return True


@pytest.mark.parametrize("cuda", [False, True])
def test_a_cuda_wait_orders_the_stream_without_blocking_the_host(cuda: bool) -> None:
    """NCCL's wait with a timeout polls on the host until the transfer ends; without one it only makes the current
    stream wait. CUDA waits take the second (the group's watchdog bounds them); gloo's keep the timeout."""
    from zerotrain.runtime.zero.collectives import Comm, Pending

    comm, work = Comm(7), _Work()
    Pending(comm, work, "all_gather", "blocks.0", (8, 16), time.perf_counter(), cuda).wait()  # type: ignore[arg-type]
    assert work.waits == ([{}] if cuda else [{"timeout": comm.timeout}])
    assert comm.stats.ops["all_gather"].calls == 1 and comm.stats.ops["all_gather"].bytes == 8


class _Event:
    """Stands in for torch.cuda.Event (no GPU here): done or not, and a time in milliseconds."""

    def __init__(self, at_ms: float, done: bool = True) -> None:
        self.at_ms, self.done = at_ms, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: _Event) -> float:
        return end.at_ms - self.at_ms


def test_cuda_collective_seconds_are_added_once_their_events_completed() -> None:
    from zerotrain.runtime.zero.collectives import CommStats

    stats = CommStats()
    stats.record("reduce_scatter", 100, 200, 0.0)
    late = _Event(40.0, done=False)
    stats.time_on_device("reduce_scatter", _Event(10.0), _Event(35.0))  # type: ignore[arg-type]
    stats.time_on_device("reduce_scatter", _Event(30.0), late)  # type: ignore[arg-type]
    stats.settle()
    assert stats.ops["reduce_scatter"].seconds == pytest.approx(0.025)  # the unfinished one waits its turn
    late.done = True
    stats.settle()
    stats.settle()  # each pair is counted once
    assert stats.ops["reduce_scatter"].seconds == pytest.approx(0.035)
