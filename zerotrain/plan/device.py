"""What a GPU rank holds on its device beyond its tensors, planned term by term. Torch-free.

The whole peak (`peak`) counts the tensors a rank holds. A GPU process also holds memory torch's tensors never see:
the CUDA context (the driver's per-process state and the kernels it loads), cuBLAS's workspaces, NCCL's buffers
(each communicator's channels to each peer), and what the caching allocator reserves beyond what it has handed out
at the peak (fragmentation). Each is a figure from the libraries' documented defaults, stated here as an estimate
until a GPU measures it: `bench/gpu/gpu_check.py`'s device phase measures every term on the GPU it runs on and
prints it beside these. Until then they are printed, not added to the verdict: the plan's 20% device headroom is
kept for them.
"""

from __future__ import annotations

from zerotrain._model import SpecModel

MIB = 1 << 20
CUDA_CONTEXT = 512 * MIB
"""The CUDA context of a torch process with lazy module loading (CUDA 12's default): a few hundred MB."""
CUBLAS_WORKSPACE = 32 * MIB
"""cuBLAS's workspace per handle on Hopper (torch's CUBLAS_WORKSPACE_CONFIG default :4096:8, eight 4 MiB chunks)."""
CUBLAS_HANDLES = 2
"""Handles with a workspace: the compute stream's, and the side stream's that overlapped collectives run on."""
NCCL_BUFFER = 4 * MIB
"""NCCL_BUFFSIZE's default: each channel's buffer to each peer, per direction."""
NCCL_CHANNELS = 16
"""Channels NCCL opens between GPUs of one node (up to 32 on NVSwitch systems)."""
ALLOCATOR_RESERVE = 0.05
"""The caching allocator's reserve beyond its peak allocation, as a share of that peak (fragmentation)."""


class DeviceTerms(SpecModel):
    """A GPU rank's device memory beyond its tensors (bytes), planned term by term."""

    cuda_context: int
    """The CUDA context: per GPU process, whatever the model."""
    cublas_workspace: int
    """cuBLAS's workspaces (one per handle)."""
    nccl_buffers: int
    """NCCL's buffers: each communicator's channels to its ring peers, both directions (none at one rank)."""
    allocator_reserve: int
    """What the caching allocator reserves beyond its peak allocation."""

    @property
    def total(self) -> int:
        return self.cuda_context + self.cublas_workspace + self.nccl_buffers + self.allocator_reserve


def device_terms(world_size: int, shard_group: int, peak: int) -> DeviceTerms:
    """The terms for a rank of `world_size` ranks sharding over groups of `shard_group` (hybrid sharding adds a
    communicator across the groups), whose tensors peak at `peak` bytes."""
    communicators = (world_size > 1) + (shard_group not in (1, world_size))
    peers = 2 if world_size > 2 else 1 if world_size == 2 else 0
    return DeviceTerms(
        cuda_context=CUDA_CONTEXT,
        cublas_workspace=CUBLAS_HANDLES * CUBLAS_WORKSPACE,
        nccl_buffers=communicators * peers * NCCL_CHANNELS * NCCL_BUFFER * 2,
        allocator_reserve=round(ALLOCATOR_RESERVE * peak),
    )
