"""Streams for communication: what runs beside compute, what compute waits for before it reads or reuses memory,
and a CPU model of those semantics that makes a missing wait fail a CPU test.

On CUDA, NCCL runs each collective on its own internal stream, ordered by events: at launch that stream waits
for the launching stream, and `Work.wait()` makes the current stream (not the host) wait for the collective's
end. What remains are the copies into bucket buffers before a reduce-scatter (the bucket's rows gathered from a
unit's gradients) and the pre-divide: those run on a side stream (as FSDP2 in torch 2.4 did its copy-in; later
FSDP2 copies in on the compute stream), so they overlap the rest of backward, and the collective is launched from
there. "Compute" is whatever stream is current when the hooks run (a caller's own stream too).

The rules every caller keeps, each one a `SideWork` ticket:
- `side(fn)` queues `fn` (device work, and the launch of the collective it feeds) on the side stream after all
  compute issued so far, and returns a ticket for it. Host bookkeeping stays outside `fn`.
- Compute reads what side work wrote (a collective's result, a world-1 stand-in copy) only after `wait(ticket)`.
- Compute overwrites memory that side work reads (a gradient arena given back and zeroed for the next unit, a
  pooled buffer lent again) only after `wait(ticket)` too.
- A gradient the runtime drops right after queueing its copy is `keep`-ed: the caching allocator must not hand its
  memory to compute before the side stream has read it.

`wait(ticket)` returns what `fn` returned. On CUDA it makes the compute stream wait for an event recorded after
`fn`'s work (the host never blocks); on CPU with gloo the work ran already (`HostStreams`).

`LazyStreams` is the CPU model used by the tests (`ZEROTRAIN_STREAM_MODEL=lazy`): side work is queued and runs
only when something waits for it — as late as CUDA could run it — so compute that reads a result it never waited
for reads stale data, and compute that reuses memory before the side work read it changes what the side work
sends: either way the parity tests against plain AdamW fail. Compute itself runs eagerly on the host, which is
what one in-order CUDA stream guarantees.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

from zerotrain.pod_contract import STREAM_MODEL_ENV

T = TypeVar("T")

"""`lazy` selects `LazyStreams` on CPU (tests); `delayed` the same on CPU and, on CUDA, side work that starts with a
spin of about a millisecond (`DelayedCudaStreams`, the GPU check); unset or `host`, the plain order."""


class SideWork(Generic[T]):
    """A ticket for work queued on the side stream: its result, once the compute stream waited for it."""

    def __init__(self, fn: Callable[[], T] | None = None) -> None:
        self._fn = fn
        self._result: T | None = None
        self.event: torch.cuda.Event | None = None
        self.ran = fn is None

    def run(self) -> None:
        if not self.ran:
            assert self._fn is not None
            self._result, self._fn, self.ran = self._fn(), None, True

    def result(self) -> T:
        assert self.ran, "side work read before it was waited for"
        return self._result  # type: ignore[return-value]


class HostStreams:
    """CPU: one order, the host's. Side work runs at once; waiting is free."""

    def side(self, fn: Callable[[], T]) -> SideWork[T]:
        ticket = SideWork(fn)
        ticket.run()
        return ticket

    def wait(self, ticket: SideWork[T]) -> T:
        ticket.run()
        return ticket.result()

    def join(self) -> None:
        """The compute stream waits for every side work queued so far (before the optimizer reads)."""

    def keep(self, t: torch.Tensor | None) -> None:
        """`t` is read by queued side work and may be dropped by compute before that: keep its memory until then."""


class LazyStreams(HostStreams):
    """The CPU model of a side stream that runs as late as it may: only when waited for (FIFO, as one stream)."""

    def __init__(self) -> None:
        self._queue: deque[SideWork[object]] = deque()

    def side(self, fn: Callable[[], T]) -> SideWork[T]:
        ticket = SideWork(fn)
        self._queue.append(ticket)  # type: ignore[arg-type]
        return ticket

    def wait(self, ticket: SideWork[T]) -> T:
        while not ticket.ran:  # one stream: everything queued before the ticket runs first
            self._queue.popleft().run()
        return ticket.result()

    def join(self) -> None:
        while self._queue:
            self._queue.popleft().run()


class CudaStreams(HostStreams):
    """The compute stream and a side stream of one CUDA device, ordered by events."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side_stream = torch.cuda.Stream(device, priority=-1)  # high priority: reductions gate the step

    @property
    def compute(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def side(self, fn: Callable[[], T]) -> SideWork[T]:
        self.side_stream.wait_stream(self.compute)  # after the compute issued so far (the gradients it copies)
        ticket = SideWork(fn)
        with torch.cuda.stream(self.side_stream):
            ticket.run()
            ticket.event = self.side_stream.record_event()
        return ticket

    def wait(self, ticket: SideWork[T]) -> T:
        if ticket.event is not None:
            self.compute.wait_event(ticket.event)
        return ticket.result()

    def join(self) -> None:
        self.compute.wait_stream(self.side_stream)

    def keep(self, t: torch.Tensor | None) -> None:
        if t is not None and t.is_cuda:
            t.record_stream(self.side_stream)


class DelayedCudaStreams(CudaStreams):
    """CUDA with every piece of side work held back by a GPU spin first: what LazyStreams does on CPU, on the real
    streams, so a missing wait (or a missing `keep`, which the CPU model cannot see) changes the numbers."""

    SPIN_CYCLES = 2_000_000  # about a millisecond at GPU clocks

    def side(self, fn: Callable[[], T]) -> SideWork[T]:
        def late() -> T:
            torch.cuda._sleep(self.SPIN_CYCLES)
            return fn()

        return super().side(late)


def streams_for(device: torch.device) -> HostStreams:
    """The streams of a rank's device: CUDA's, or on CPU the host order (the lazy model when the tests ask)."""
    model = os.environ.get(STREAM_MODEL_ENV, "host")
    if model not in ("host", "lazy", "delayed"):
        raise ValueError(f"{STREAM_MODEL_ENV}={model!r}: use 'lazy' or 'delayed' (the checks' stream models) or 'host'")
    if device.type == "cuda":
        return DelayedCudaStreams(device) if model == "delayed" else CudaStreams(device)
    return HostStreams() if model == "host" else LazyStreams()
