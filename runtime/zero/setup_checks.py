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


def model_device(model: nn.Module, config: ZeroConfig, device: torch.device | None = None) -> torch.device:
    """Where the engine trains: `device` when given, else where the model is, as DDP and FSDP take it (move the
    model to its GPU first). Parameters still on the meta device need `device`: their values come from elsewhere."""
    devices = {p.device for p in model.parameters()}
    if not devices:
        raise ZeroSetupError("model", type(model).__name__, "it has no parameters", "wrap a model that has some")
    if device is None:
        if len(devices) > 1:
            raise ZeroSetupError(
                "model",
                sorted(map(str, devices)),
                "its parameters are on several devices",
                "move it to one device first",
            )
        device = devices.pop()
        if device.type == "meta":
            raise ZeroSetupError(
                "device",
                None,
                "the model's parameters are placeholders on the meta device, so where to train is not known",
                "pass device= (and init=, where their values come from) to ZeroEngine",
            )
    check_precision(config.precision, device)
    return device


def check_precision(precision: Precision, device: torch.device) -> None:
    """bf16 needs a device that computes in it: refuse before anything runs, naming the setting."""
    if precision is Precision.BF16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(device)
        raise ZeroSetupError(
            "zero.precision", "bf16", f"{name} cannot compute in bf16", "use precision fp16 (loss-scaled) or fp32"
        )
