"""The only module that calls torch.distributed collectives; it counts bytes and seconds per op.

Byte convention (what a ring algorithm sends per rank; the ZeRO paper's unit): for a flat buffer of
n elements of e bytes over N ranks, all-gather and reduce-scatter each send n·(N-1)/N·e bytes,
all-reduce (= reduce-scatter + all-gather) 2·n·(N-1)/N·e, broadcast n·e from the source. `payload`
is the plain tensor size (n·e) for reference. Seconds, on CPU, are wall time the caller spent inside the
op: the blocking call, or for an async op its launch plus the time `wait()` blocked. On CUDA the host only
queues work, so its time says nothing: there seconds are GPU time from the collective's launch (an event on the
launching stream) to the point the compute stream may use its result (an event after the wait), read from the
events once they have completed (`CommStats.settle`, when reported). Nothing here adds a synchronisation: no
barrier, no device sync, no extra collective.

Averages: a reduction asked for the mean (`mean=True`) averages on NCCL itself (AVG: each rank's values times 1/N
before adding, so fp16 cannot overflow; bf16 only at a power-of-two N, see `Comm.averages`); gloo has neither, so
there it is a plain SUM and the caller divides (before the sum when reducing in fp16, after it otherwise;
`averages(t)` says which, see `unit_context`). gloo has no uneven collectives either:
every buffer reaching this module is padded to a multiple of N (`partition`). Both are said here
rather than emulated: an uneven size raises.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from zerotrain.pod_contract import SINGLE_RANK_COLLECTIVES_ENV
from zerotrain.runtime.zero.engine_errors import CollectiveError, CollectiveTimeoutError, PeerLostError

# torch 2.13 renamed the flat collectives (the old names warn); older torch has only the old names.
_all_gather_flat = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


@dataclass
class OpStats:
    """Totals for one collective op."""

    calls: int = 0
    bytes: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0


@dataclass
class CommStats:
    """Per-op totals plus the live and peak bytes of buffers allocated only for communication."""

    ops: dict[str, OpStats] = field(default_factory=dict)
    buffer_bytes: int = 0
    peak_buffer_bytes: int = 0
    buffer_allocations: int = 0
    """Communication buffers allocated so far: flat after the first step (the pool keeps its buffers)."""
    _timed: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)
    """CUDA collectives' (op, launch event, end event) whose GPU time `settle` has not added yet."""

    def record(self, op: str, ring_bytes: int, payload: int, seconds: float) -> None:
        s = self.ops.setdefault(op, OpStats())
        s.calls += 1
        s.bytes += ring_bytes
        s.payload_bytes += payload
        s.seconds += seconds

    def add_seconds(self, op: str, seconds: float) -> None:
        self.ops[op].seconds += seconds

    def time_on_device(self, op: str, start: torch.cuda.Event, end: torch.cuda.Event) -> None:
        """A CUDA collective's launch and consumption events: added to `op`'s seconds once both completed."""
        self._timed.append((op, start, end))

    def settle(self) -> None:
        """Add the GPU time of every timed collective whose events completed (no sync: others wait their turn)."""
        still = []
        for op, start, end in self._timed:
            if end.query():
                self.ops[op].seconds += start.elapsed_time(end) / 1000.0
            else:
                still.append((op, start, end))
        self._timed = still

    def hold(self, t: torch.Tensor) -> None:
        self.buffer_allocations += 1
        self.buffer_bytes += t.numel() * t.element_size()
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self.buffer_bytes)

    def release(self, t: torch.Tensor) -> None:
        self.buffer_bytes -= t.numel() * t.element_size()


class Pending:
    """An async collective, counted when launched; `wait()` blocks (bounded by the timeout) and adds the time spent.

    Counting at launch keeps a step's bytes in that step, also for the post-step gathers the next forward waits for.
    On CUDA, `wait()` makes the current stream wait and returns at once: a wait with a timeout would block the host
    until the transfer ends (ProcessGroupNCCL polls for it), so the host could no longer run ahead of the GPU and
    queue the next unit's compute. There the group's own timeout (NCCL's watchdog, set from
    collectiveTimeoutSeconds) bounds a stuck collective, and `seconds` is GPU time between two events (see above).
    """

    def __init__(
        self,
        comm: Comm,
        work: dist.Work | None,
        op: str,
        unit: str,
        nbytes: tuple[int, int],
        t0: float,
        cuda: bool = False,
        start: torch.cuda.Event | None = None,
    ):
        self._comm, self._work, self.op, self.unit, self._cuda, self._start = comm, work, op, unit, cuda, start
        comm.stats.record(op, *nbytes, 0.0 if start is not None else time.perf_counter() - t0)
        self.done = work is None

    def wait(self) -> None:
        if self.done:
            return
        t0 = time.perf_counter()
        assert self._work is not None
        try:
            if self._cuda:
                self._work.wait()  # the current (compute) stream waits; the host does not
            else:
                self._work.wait(timeout=self._comm.timeout)
        except RuntimeError as e:
            raise collective_failure(self._comm.rank, self.unit, self.op, e) from e
        self.done = True
        # Drop the Work once waited: it can hold gloo's temporaries (a full-size copy per reduce-scatter) for as long
        # as anything holds this Pending, and an arena's ticket does until the arena's next use.
        work, self._work = self._work, None
        if self._start is None:
            self._comm.stats.add_seconds(self.op, time.perf_counter() - t0)
            return
        # The end is marked on a stream that waits for nothing but the collective, so the time is the collective's
        # (queued behind earlier collectives included), not also the compute before the consumer reached its wait.
        compute, timing = torch.cuda.current_stream(), self._comm.timing_stream()
        timing.wait_stream(compute)
        with torch.cuda.stream(timing):
            work.wait()
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        self._comm.stats.time_on_device(self.op, self._start, end)


# What gloo and NCCL say when the other end of a connection has died, as opposed to a timeout.
_PEER_GONE = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "end of file",
    "socket closed",
    "remote process exited",
)


def collective_failure(rank: int, unit: str, op: str, error: RuntimeError) -> CollectiveError:
    """The error to raise for a failed collective: a lost peer, or (otherwise) a timeout or mismatch."""
    detail = str(error).splitlines()[0] if str(error) else type(error).__name__
    if any(marker in str(error).lower() for marker in _PEER_GONE):
        return PeerLostError(rank, unit, op, detail)
    return CollectiveTimeoutError(rank, unit, op, detail)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


"""`1`: a one-rank group still runs its collectives (single-rank communicators), so a GPU check on one GPU
exercises NCCL; by default a world of one copies instead and launches nothing."""


class Comm:
    """Counted collectives over one process group (the default group unless given)."""

    def __init__(
        self, timeout_seconds: float, group: dist.ProcessGroup | None = None, stats: CommStats | None = None
    ) -> None:
        self.group = group
        self.world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        """This rank's index in the group (its shard's index, for a shard group)."""
        self.timeout = timedelta(seconds=timeout_seconds)
        self.stats = CommStats() if stats is None else stats
        """Shared by an engine's groups: one account of its traffic, each op under its own label."""
        initialized = dist.is_initialized()
        self.local = self.world_size == 1 and not (initialized and os.environ.get(SINGLE_RANK_COLLECTIVES_ENV) == "1")
        """No collective is launched: one rank, no group asked to run them."""
        self._nccl = initialized and "nccl" in str(dist.get_backend(group))
        self._timing: torch.cuda.Stream | None = None

    def timing_stream(self) -> torch.cuda.Stream:
        """A stream that only waits for collectives and records when they end (their GPU time, `CommStats`)."""
        if self._timing is None:
            self._timing = torch.cuda.Stream()
        return self._timing

    def averages(self, t: torch.Tensor) -> bool:
        """A reduction of `t` with `mean=True` averages in the collective itself (NCCL), not in the caller. NCCL's
        AVG multiplies each rank's values by 1/N in the tensor's dtype before adding (a pre-multiplied sum, so fp16
        cannot overflow); in bf16, 1/N is exact only for a power-of-two N (1/3 rounds 0.2% high, a bias on every
        gradient), so there the caller sums and divides."""
        if not (self._nccl and t.is_cuda and not self.local):
            return False
        n = self.world_size
        return t.dtype != torch.bfloat16 or n & (n - 1) == 0

    def _mean_op(self, t: torch.Tensor) -> Any:  # ReduceOp members, typed RedOpType by torch's stubs
        return dist.ReduceOp.AVG if self.averages(t) else dist.ReduceOp.SUM

    def _ring(self, n_bytes: int) -> int:
        return n_bytes * (self.world_size - 1) // self.world_size

    def _run(
        self,
        op: str,
        unit: str,
        nbytes: tuple[int, int],
        async_op: bool,
        launch: Callable[[], Any],
        cuda: bool = False,
    ) -> Pending:
        t0 = time.perf_counter()
        start = None
        if self.local:
            work = None
        else:
            if cuda:
                start = torch.cuda.Event(enable_timing=True)
                start.record()  # on the launching stream: the collective's stream waits for this point
            try:
                work = launch()
            except RuntimeError as e:
                raise collective_failure(self.rank, unit, op, e) from e
        pending = Pending(self, work, op, unit, nbytes, t0, cuda, start)
        if work is not None and not async_op:
            pending.wait()
        return pending

    def all_gather(
        self, out: torch.Tensor, shard: torch.Tensor, unit: str, async_op: bool = False, label: str = "all_gather"
    ) -> Pending:
        """Concatenate every rank's equal-size `shard` into `out` (n = out.numel()), counted under `label`."""
        if out.numel() != shard.numel() * self.world_size:
            raise ValueError(f"uneven all-gather for unit {unit!r}: {out.numel()} != {shard.numel()}·{self.world_size}")
        if self.local:
            out.copy_(shard)
        return self._run(
            label,
            unit,
            (self._ring(_nbytes(out)), _nbytes(out)),
            async_op,
            lambda: _all_gather_flat(out, shard, group=self.group, async_op=True),
            out.is_cuda,
        )

    def reduce_scatter(
        self, out: torch.Tensor, full: torch.Tensor, unit: str, async_op: bool = False, mean: bool = False
    ) -> Pending:
        """Sum `full` over ranks (or average, where `averages` says the collective can) and keep this rank's
        equal-size slice in `out` (n = full.numel())."""
        if full.numel() != out.numel() * self.world_size:
            raise ValueError(f"uneven reduce-scatter for unit {unit!r}: {full.numel()} != {out.numel()}·N")
        if self.local:
            out.copy_(full)
        op = self._mean_op(full) if mean else dist.ReduceOp.SUM
        return self._run(
            "reduce_scatter",
            unit,
            (self._ring(_nbytes(full)), _nbytes(full)),
            async_op,
            lambda: _reduce_scatter_flat(out, full, op=op, group=self.group, async_op=True),
            out.is_cuda,
        )

    def all_reduce(
        self,
        t: torch.Tensor,
        unit: str,
        async_op: bool = False,
        op: str = "sum",
        label: str = "all_reduce",
        mean: bool = False,
    ) -> Pending:
        """In-place SUM (or MAX) over ranks, counted under `label`; `mean` as in `reduce_scatter`."""
        reduce_op = self._mean_op(t) if mean else dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX
        return self._run(
            label,
            unit,
            (2 * self._ring(_nbytes(t)), _nbytes(t)),
            async_op,
            lambda: dist.all_reduce(t, op=reduce_op, group=self.group, async_op=True),
            t.is_cuda,
        )

    def broadcast(self, t: torch.Tensor, src: int, unit: str) -> None:
        """Overwrite `t` with rank `src`'s copy."""
        sent = _nbytes(t) if self.rank == src and not self.local else 0
        self._run(
            "broadcast",
            unit,
            (sent, _nbytes(t)),
            False,
            lambda: dist.broadcast(t, src=src, group=self.group, async_op=True),
            t.is_cuda,
        )
