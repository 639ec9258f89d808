"""bench/gpu/gpu_check.py's device phase: what a GPU rank holds beyond its tensors, measured term by term and printed
beside the plan's figures (`zerotrain.plan.device`), so one short GPU run settles them:

- the CUDA context: the device memory in use once torch has initialised CUDA and before any tensor (less what
  other processes hold, as torch.cuda.list_gpu_processes reports when it can);
- cuBLAS's workspaces: what the caching allocator reserves beyond the tensors once a bf16 matmul has run on the
  compute stream and on a side stream (torch allocates the workspaces through it);
- NCCL's buffers: the device memory NCCL takes outside the caching allocator for a one-rank communicator and its
  first all-reduce (its channels to peers need two GPUs: a one-GPU machine measures the communicator alone);
- the allocator's reserve: reserved beyond allocated at the peak of bf16 stage-3 steps on the allocator model.

A term measured more than TOLERANCE above its plan fails the check (the plan under-counts the device); below it is
reported, not failed. On the CPU there is nothing to measure: the phase says so and why.
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist
from gpu_check_allocator import train_bf16
from gpu_check_config import SIZES
from gpu_check_records import SKIPPED, Checks
from gpu_check_train import device_of, init_group, teardown

from zerotrain.plan.device import device_terms
from zerotrain.pod_contract import SINGLE_RANK_COLLECTIVES_ENV
from zerotrain.quantity import format_bytes

TOLERANCE = 0.25
"""How far above its planned figure a measured term may be before the check fails."""


def used(device: torch.device) -> int:
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def outside_allocator(device: torch.device) -> int:
    """Device memory in use that the caching allocator did not reserve."""
    return used(device) - torch.cuda.memory_reserved(device)


def others(device: torch.device) -> int:
    """What other processes hold on the device, when torch can tell (pynvml); 0 otherwise."""
    try:
        report = torch.cuda.list_gpu_processes(device)
    except Exception:
        return 0
    total = 0
    for line in report.splitlines():
        if "process" in line and str(os.getpid()) not in line and "MB" in line:
            total += int(float(line.split()[-2]) * (1 << 20))
    return total


def measure(device: torch.device) -> dict[str, int]:
    """Each term, in bytes, in one fresh process."""
    torch.cuda.init()
    context = used(device) - others(device)
    before = torch.cuda.memory_reserved(device)
    a = torch.randn(1024, 1024, device=device, dtype=torch.bfloat16)
    tensors = torch.cuda.memory_allocated(device)
    (a @ a).sum().item()
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        (a @ a).sum().item()
    torch.cuda.synchronize(device)
    cublas = torch.cuda.memory_reserved(device) - before - tensors
    del a
    outside = outside_allocator(device)
    os.environ[SINGLE_RANK_COLLECTIVES_ENV] = "1"
    init_group(device)
    x = torch.ones(1 << 20, device=device)
    dist.all_reduce(x)
    torch.cuda.synchronize(device)
    nccl = outside_allocator(device) - outside
    del x
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    engine, task, data = train_bf16(device, SIZES["cuda"], 3)
    stats = torch.cuda.memory_stats(device)
    peak, reserved = int(stats["allocated_bytes.all.peak"]), int(stats["reserved_bytes.all.peak"])
    del engine, task, data
    teardown()
    return {
        "cuda_context": context,
        "cublas_workspace": cublas,
        "nccl_buffers": nccl,
        "allocator_reserve": reserved - peak,
        "peak_allocated": peak,
    }


def phase_device(args: argparse.Namespace, checks: Checks) -> None:
    device = device_of(args)
    if device.type != "cuda":
        checks.add(
            "device terms",
            SKIPPED,
            "skipped: no CUDA device; the CUDA context, cuBLAS's workspaces, NCCL's buffers and the caching "
            "allocator's reserve exist only on a GPU (bash bench/gpu/gpu_check.sh there measures them)",
        )
        return
    measured = measure(device)
    # One rank: no NCCL peer, so the plan's channel buffers are 0 and the communicator's own memory is reported.
    planned = device_terms(1, 1, measured["peak_allocated"])
    for term in ("cuda_context", "cublas_workspace", "nccl_buffers", "allocator_reserve"):
        plan, real = getattr(planned, term), measured[term]
        over = real > plan * (1 + TOLERANCE) and real - plan > (16 << 20)
        checks.add(
            term.replace("_", " "),
            not over,
            f"planned {format_bytes(plan)}, measured {format_bytes(real)}"
            + (f" ({(real - plan) / plan:+.0%})" if plan else "")
            + (" -- the plan under-counts it: update zerotrain/plan/device.py" if over else ""),
            planned_bytes=plan,
            measured_bytes=real,
        )
