"""Host memory given back to the system as the start-up frees it.

glibc keeps freed blocks in its heap for reuse, and maps a block on its own (returned to the system when freed)
only above a threshold it raises as it goes, up to 32 MiB. A partitioned construction frees each module's whole
weights right after building them, while the small tensors it keeps (slices, biases) land between them: the heap
cannot shrink, and the freed blocks no longer fit the next weights. Measured on the built-in GPT at Ψ = 596M, one
rank of 8: 298 MB of live tensors, 2.38 GB of heap (the whole model) held after construction; a container's limit
counts it all. So while a rank starts, every block of at least `START_UP_MMAP_THRESHOLD` is mapped on its own.

Training on the CPU has the same pattern in one place: stage 3 frees each unit's gathered parameters after its
forward and allocates them again for its backward, while activations are allocated between. With glibc's own
threshold the 596M GPT's ranks (2 GiB each) outgrew their memory in their first forward; with the threshold at the
unit's size (only those buffers mapped) still, at block 25 of 84; with every block above 1 MiB mapped they trained.
That costs CPU throughput: the GPT at d=512 on 2 ranks (12.6 MB units) ran at 661 tokens/s against 767 (medians of
3, interleaved; 607 against 820 with the units' size as the threshold). So after start-up the heap is trimmed and
`training_threshold` keeps 1 MiB only where it is needed: a memory limit applies to the rank (`resources.memory`:
a container's limit, or `zerotrain run`'s stand-in for it) and stage 3 gathers units of at least `MAPPED_UNIT_MIN`
on the CPU; glibc's maximum otherwise, as before (the README's demo, whose units are 0.8 MB, is unchanged). GPU
ranks' gathers are on the device, whose caching allocator this does not concern. Elsewhere than glibc (musl, macOS)
nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterator
from contextlib import contextmanager

M_MMAP_THRESHOLD = -3
"""mallopt's parameter number for the mmap threshold (glibc's malloc.h)."""
START_UP_MMAP_THRESHOLD = 1 << 20
"""While a rank starts: blocks of 1 MiB or more are mapped on their own (a module's weights, a slice)."""
GLIBC_MMAP_THRESHOLD_MAX = 32 << 20
"""glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, where its own adjustment settles."""
MAPPED_UNIT_MIN = 4 << 20
"""Gathered units smaller than this fragment the heap too little to be worth mapping."""


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it)
    except (OSError, AttributeError):
        return None
    return libc


def training_threshold(gathered_unit_bytes: list[int], limited: bool) -> int:
    """The mmap threshold for training: the start-up's 1 MiB where a memory limit applies and stage 3 gathers and
    frees units of at least `MAPPED_UNIT_MIN` on the host; glibc's maximum otherwise."""
    if limited and gathered_unit_bytes and max(gathered_unit_bytes) >= MAPPED_UNIT_MIN:
        return START_UP_MMAP_THRESHOLD
    return GLIBC_MMAP_THRESHOLD_MAX


class Threshold:
    """What the start-up leaves the threshold at; `training` is set once the engine's units are known."""

    def __init__(self) -> None:
        self.training = GLIBC_MMAP_THRESHOLD_MAX


@contextmanager
def returned_while_starting() -> Iterator[Threshold]:
    """Large blocks mapped on their own while the block runs; the heap trimmed after it and the threshold set to
    what the block decided for training (see the module)."""
    after = Threshold()
    libc = _glibc()
    if libc is None:
        yield after
        return
    libc.mallopt(M_MMAP_THRESHOLD, START_UP_MMAP_THRESHOLD)
    try:
        yield after
    finally:
        libc.malloc_trim(0)
        libc.mallopt(M_MMAP_THRESHOLD, after.training)
