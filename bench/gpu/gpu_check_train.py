"""bench/gpu/gpu_check.py's process group, model and training runs: the plain model under torch.optim.AdamW and the
engine, each leaving its losses, gradient norms and fp32 weights."""

from __future__ import annotations

import argparse
import gc
import math
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from compare_systems import _adamw as adamw  # the benchmarks' AdamW: lr 1e-3, weight decay 0.1

from zerotrain.runtime import ZeroConfig, ZeroEngine
from zerotrain.runtime.examples.gpt import build
from zerotrain.runtime.job.launch import free_port
from zerotrain.runtime.job.train import to_device
from zerotrain.runtime.zero.process_group import process_group_backend

if TYPE_CHECKING:
    from gpu_check_config import GptSize


def device_of(args: argparse.Namespace) -> torch.device:
    if args.device == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def init_group(device: torch.device, rank: int = 0, world: int = 1, port: int | None = None) -> None:
    """The group zerotrain creates (`cpu:gloo,cuda:nccl` on CUDA), NCCL's communicator made eagerly."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port if port is not None else free_port())
    dist.init_process_group(
        process_group_backend(device.type == "cuda"),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
        device_id=device if device.type == "cuda" else None,
    )


def teardown() -> None:
    gc.collect()  # engines hold hooks in cycles: free their collective state while the group is alive
    if dist.is_initialized():
        dist.destroy_process_group()


def exact_fp32(device: torch.device) -> None:
    """fp32 that only summation order can change: no TF32, deterministic kernels."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)


@contextmanager
def math_attention() -> Iterator[None]:
    """The math SDPA kernel (the fused ones' backward may be nondeterministic on CUDA)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        yield


def make_task(device: torch.device, gpt: GptSize, rank: int = 0, world: int = 1) -> Any:
    torch.manual_seed(0)
    task = build(rank=rank, world_size=world, **gpt)
    task.model.to(device)
    return task


def batches(task: Any, device: torch.device, n: int) -> list[Any]:
    return [to_device(next(task.batches), device) for _ in range(n)]


def fp32_copy(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Named tensors as detached fp32 copies on the CPU."""
    return {k: v.detach().float().cpu().clone() for k, v in named}


def initial_weights(task: Any) -> dict[str, torch.Tensor]:
    return fp32_copy(task.model.named_parameters())


def chunk_elements(task: Any) -> int:
    """A bucket size that splits every unit into at least three chunks."""
    units = [m for m in task.model.modules() if type(m).__name__ in task.unit_modules]
    return max(1, min(sum(p.numel() for p in u.parameters()) for u in units) // 3)


@dataclass
class Trained:
    """What a run leaves: losses, gradient norms, fp32 weights (on the CPU), and whether collectives ran."""

    losses: list[float]
    grad_norms: list[float]
    weights: dict[str, torch.Tensor]
    local: bool = False
    comm: dict[str, Any] = field(default_factory=dict)


def train_reference(task: Any, data: list[Any]) -> Trained:
    """torch.optim.AdamW on the plain model, one process."""
    params = list(task.model.parameters())
    opt = adamw(params)
    losses, norms = [], []
    for batch in data:
        opt.zero_grad()
        loss = task.loss(task.model(task.inputs(batch)), batch)
        loss.backward()
        norms.append(math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params if p.grad is not None)))
        opt.step()
        losses.append(float(loss.detach()))
    return Trained(losses, norms, fp32_copy(task.model.named_parameters()))


def train_engine(task: Any, data: list[Any], stage: int, precision: str = "fp32", **cfg: Any) -> Trained:
    """The engine over `data`, one optimizer step per batch."""
    config = ZeroConfig(stage=stage, unit_modules=task.unit_modules, precision=precision, **cfg)
    engine = ZeroEngine(task.model, config, optimizer=adamw)
    losses, norms = [], []
    for batch in data:
        engine.backward(task.loss(engine(task.inputs(batch)), batch))
        result = engine.step(report_grad_norm=True)
        assert result.loss is not None  # backward was given this step's loss
        losses.append(float(result.loss))
        norms.append(float(result.grad_norm if result.grad_norm is not None else math.nan))
    weights = fp32_copy(engine.full_state_dict().items())
    local = bool(getattr(engine.comm, "local", False))  # True: a world of one that launched no collective
    done = Trained(losses, norms, weights, local=local, comm=engine.accounting().comm_report())
    del engine
    gc.collect()
    return done
