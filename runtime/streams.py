"""CUDA streams for communication: what runs beside compute, and how buffers outlive the collectives reading them.

On CUDA, NCCL already runs each collective on its own internal stream, ordered by events: at launch that stream
waits for the launching stream, and `Work.wait()` makes the current stream (not the host) wait for the
collective's end. That orders every gather and reduce-scatter against compute, and lets a stage-3 prefetch
issued before unit k's forward run while unit k computes. What remains on the compute stream are the copies into
bucket buffers before a reduce-scatter (the bucket's rows gathered from the unit's gradients): those run here on
a side stream, as FSDP2's reduce-scatter copy-in does, so they overlap the rest of backward too.

Buffer lifetimes: pooled buffers are persistent (`buckets`) and lent again only after the collective that used
them is waited for, so the compute stream reuses them strictly after; a gradient that autograd allocated and the
runtime drops right after copying it in (stage 2 without contiguous gradients) is `record_stream`-ed on the side
stream, so the caching allocator cannot hand its memory to compute before the copy has read it.

On CPU every method here is a no-op: gloo's collectives are ordered by the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class CommStreams:
    """The compute stream and the side stream of one rank's device (neither on CPU)."""

    def __init__(self, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.compute: torch.cuda.Stream | None = torch.cuda.current_stream(device) if cuda else None
        self.side: torch.cuda.Stream | None = torch.cuda.Stream(device) if cuda else None

    @contextlib.contextmanager
    def copy_in(self) -> Iterator[None]:
        """Run the block (bucket copies and the collectives' launch) on the side stream, after the compute so far."""
        if self.side is None or self.compute is None:
            yield
            return
        self.side.wait_stream(self.compute)
        with torch.cuda.stream(self.side):
            yield

    @contextlib.contextmanager
    def on_compute(self) -> Iterator[None]:
        """Finish a collective on the compute stream (its results are read there; its buffer is reused after)."""
        if self.side is None or self.compute is None:
            yield
            return
        with torch.cuda.stream(self.compute):
            yield
        self.side.wait_stream(self.compute)  # a buffer given back may be filled again on the side stream

    def join(self) -> None:
        """The compute stream waits for everything issued on the side stream (before the optimizer reads)."""
        if self.side is not None and self.compute is not None:
            self.compute.wait_stream(self.side)

    def keep(self, t: torch.Tensor | None) -> None:
        """`t` is read on the side stream and may be freed by compute before that: keep its memory until then."""
        if self.side is not None and t is not None and t.is_cuda:
            t.record_stream(self.side)
