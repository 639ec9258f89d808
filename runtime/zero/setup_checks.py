"""What can be wrong with `ZeroEngine`'s input, checked before its first collective: bucket sizes, the model's
device, the precision that device can compute in, and (in `process_group`) whether the process group serves it."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from zerotrain.runtime.zero.engine_errors import ZeroSetupError
from zerotrain.zero_config import Precision, Stage, ZeroConfig, shard_group_ranks


def world_size_before_init() -> int:
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))


def sharded_over(config: ZeroConfig, world_size: int) -> int:
    """S for this run: `zero.shardGroupSize` resolved (`pod`: LOCAL_WORLD_SIZE, the ranks torchrun started on this
    node; the whole world without it), and the whole world for stage 0, which shards nothing."""
    if config.fixed_stage is Stage.DATA_PARALLEL:
        return world_size
    per_pod = int(os.environ.get("LOCAL_WORLD_SIZE") or world_size)
    try:
        return shard_group_ranks(config.shard_group_size, world_size, per_pod)
    except ValueError as e:
        size = config.shard_group_size
        raise ZeroSetupError(
            "zero.shardGroupSize",
            getattr(size, "value", size),
            f"it does not divide the world size {world_size} (ranks per pod: {per_pod})",
            "use a divisor of the world size, pod, or leave it unset",
        ) from e


def check_buckets(config: ZeroConfig, world_size: int) -> None:
    """A chunk holds at least one element per rank: a bucket smaller than the world size cannot be kept."""
    for field, value in (
        ("zero.reduceBucketElements", config.reduce_bucket_elements),
        ("zero.allgatherBucketElements", config.allgather_bucket_elements),
    ):
        if value < world_size:
            raise ZeroSetupError(
                field,
                value,
                f"a bucket holds at least one element per rank ({world_size} ranks)",
                f"use at least {world_size}",
            )


def model_device(model: nn.Module, config: ZeroConfig) -> torch.device:
    """Where the model is, as DDP and FSDP take it: the engine trains there (move the model to its GPU first)."""
    devices = {p.device for p in model.parameters()}
    if not devices:
        raise ZeroSetupError("model", type(model).__name__, "it has no parameters", "wrap a model that has some")
    if len(devices) > 1:
        raise ZeroSetupError(
            "model", sorted(map(str, devices)), "its parameters are on several devices", "move it to one device first"
        )
    device = devices.pop()
    check_precision(config.precision, device)
    return device


def check_precision(precision: Precision, device: torch.device) -> None:
    """bf16 needs a device that computes in it: refuse before anything runs, naming the setting."""
    if precision is Precision.BF16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(device)
        raise ZeroSetupError(
            "zero.precision", "bf16", f"{name} cannot compute in bf16", "use precision fp16 (loss-scaled) or fp32"
        )
