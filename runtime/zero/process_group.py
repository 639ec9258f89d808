"""The process group: formed from the rank's device, and the backends that serve which tensors.

gloo on CPU; with CUDA, NCCL for CUDA tensors beside gloo for CPU ones (`cpu:gloo,cuda:nccl`). On CUDA the rank's GPU
is checked against LOCAL_RANK, made current and passed as `device_id`. Bad input is refused before any rank waits.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from zerotrain.runtime.zero.engine_errors import ZeroSetupError


def init_from_env(timeout_seconds: float, device: torch.device) -> None:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) if none exists, for a
    rank that trains on `device` (the model's: gloo on CPU, NCCL beside gloo on CUDA, whatever else the machine has).

    Without WORLD_SIZE (a plain `python` run) the engine works as a single rank and creates no group.
    """
    if dist.is_initialized() or (int(os.environ.get("WORLD_SIZE", "1")) <= 1 and "MASTER_ADDR" not in os.environ):
        return
    init_group(device, timeout_seconds)


def init_group(device: torch.device, timeout_seconds: float) -> None:
    """Form the group for a rank on `device`. On CUDA the rank's GPU is checked against LOCAL_RANK, made current,
    and passed as `device_id`, so NCCL sets its communicator up now and its errors surface here, not inside the
    first broadcast."""
    cuda = device.type == "cuda"
    if cuda:
        device = check_local_gpu(device)
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend=process_group_backend(cuda),
        timeout=timedelta(seconds=timeout_seconds),
        device_id=device if cuda else None,
    )


def hybrid_groups(shard_ranks: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """This rank's shard group (the `shard_ranks` consecutive ranks its own belongs to: a pod's, as global rank =
    node rank × nprocPerNode + local rank) and its replica group (the ranks at the same place of every other shard
    group). Every rank creates every group, in one order, as torch.distributed requires."""
    world = dist.get_world_size()
    shard, _ = dist.new_subgroups_by_enumeration(
        [list(range(g, g + shard_ranks)) for g in range(0, world, shard_ranks)]
    )
    across, _ = dist.new_subgroups_by_enumeration([list(range(j, world, shard_ranks)) for j in range(shard_ranks)])
    assert shard is not None and across is not None
    return shard, across


def check_local_gpu(
    device: torch.device, env: dict[str, str] | None = None, visible: int | None = None
) -> torch.device:
    """The rank's GPU, refused when several are visible and it is not the one LOCAL_RANK names: every rank of the
    node would share it, and NCCL fails with "Duplicate GPU detected". (With one visible GPU per process, as
    CUDA_VISIBLE_DEVICES per rank gives, cuda:0 is right whatever LOCAL_RANK is.)"""
    env = dict(os.environ) if env is None else env
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = torch.cuda.device_count() if visible is None else visible
    if "LOCAL_RANK" not in env:
        return torch.device("cuda", index)  # a launcher that maps GPUs its own way (srun, mpirun): its choice
    local = int(env["LOCAL_RANK"])
    if visible > 1 and index != local:
        raise ZeroSetupError(
            "model device",
            f"cuda:{index}",
            f"this is local rank {local} of a node where this process sees {visible} GPUs, so ranks would share "
            f"cuda:{index} (NCCL: 'Duplicate GPU detected')",
            f"call torch.cuda.set_device({local}) before model.cuda(), or move the model with model.to('cuda:{local}')",
        )
    return torch.device("cuda", index)


def process_group_backend(cuda: bool) -> str:
    """gloo on CPU; with CUDA, NCCL for CUDA tensors *and* gloo for CPU ones: the small control collectives (the
    divergence check's counts, votes) use CPU tensors, which a NCCL-only group cannot serve."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def served_devices(backend: str) -> set[str]:
    """Device types a process group created with `backend` serves."""
    if ":" not in backend:
        return {"cuda"} if backend == "nccl" else {"cpu"}
    return {part.split(":")[0] for part in backend.split(",")}


def control_device(backend: str, device: torch.device) -> torch.device:
    """Where small control tensors (the divergence check's int64 hashes and counts) live: the host where the group
    serves it (no device sync), else the model's device (a plain `init_process_group("nccl")`)."""
    return torch.device("cpu") if "cpu" in served_devices(backend) else device


def check_backend_serves(backend: str, device: torch.device) -> None:
    """Refuse, before the first collective, a process group that cannot carry this rank's tensors."""
    if device.type not in served_devices(backend):
        raise ZeroSetupError(
            "process group backend",
            backend,
            f"it does not serve {device.type} tensors, and the model's parameters are on {device}",
            "create it with 'cpu:gloo,cuda:nccl' (as zerotrain does), or move the model to a device the group serves",
        )
