"""The GPU paths in one short run: stages 0-3 against single-device AdamW on NCCL, bf16 training and the CUDA
allocator figures in `memory_report()` (`bench/gpu_check.sh` then measures throughput against FSDP2 with
`bench/compare.py`).

    bash bench/gpu_check.sh                 # on a machine with one or more NVIDIA GPUs
    python bench/gpu_check.py --device cpu  # the same checks on gloo, to try the script itself

World size 1 (NCCL will not put two ranks on one GPU), with the group created as zerotrain creates it
(`cpu:gloo,cuda:nccl`), so the CPU control collectives and the CUDA data collectives both run. Exits non-zero
when a check fails; prints one line per check.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from zerotrain.runtime import ZeroConfig, ZeroEngine
from zerotrain.runtime.collectives import process_group_backend
from zerotrain.runtime.examples.gpt import build
from zerotrain.runtime.launch import free_port
from zerotrain.runtime.train import to_device

GPT = {"seq_len": 64, "batch_size": 8, "d_model": 128, "n_layers": 4, "n_heads": 4, "max_bytes": 200_000}
OPT = {"lr": 1e-3, "weight_decay": 0.1}


def _task(device: torch.device, **gpt: Any) -> Any:
    torch.manual_seed(0)
    task = build(rank=0, world_size=1, **{**GPT, **gpt})
    task.model.to(device)
    return task


def _batches(task: Any, device: torch.device, n: int) -> list[Any]:
    return [to_device(next(task.batches), device) for _ in range(n)]


def parity(device: torch.device, steps: int = 5) -> bool:
    """Every stage's weights after `steps` equal plain AdamW's on one device (fp32, TF32 off)."""
    ref_task = _task(device)
    data = _batches(ref_task, device, steps)
    ref_opt = torch.optim.AdamW(ref_task.model.parameters(), **OPT)
    for batch in data:
        ref_opt.zero_grad()
        ref_task.loss(ref_task.model(ref_task.inputs(batch)), batch).backward()
        ref_opt.step()
    want = {k: v.detach() for k, v in ref_task.model.named_parameters()}
    ok = True
    for stage in range(4):
        task = _task(device)
        cfg = ZeroConfig(stage=stage, unit_modules=task.unit_modules)
        engine = ZeroEngine(task.model, cfg, optimizer=lambda g: torch.optim.AdamW(g, **OPT))
        for batch in data:
            engine.backward(task.loss(engine(task.inputs(batch)), batch))
            engine.step()
        got = engine.full_state_dict()
        worst = max(float((got[k].to(device) - v).abs().max()) for k, v in want.items())
        good = worst <= 1e-5
        ok &= good
        print(f"parity stage {stage}: max |w - w_adamw| = {worst:.2e} {'ok' if good else 'FAILED'}", flush=True)
    return ok


def bf16_and_allocator(device: torch.device, steps: int = 30) -> bool:
    """bf16 stage 3 trains (finite, falling loss) and the report carries the allocator's figures on CUDA."""
    task = _task(device)
    cfg = ZeroConfig(stage=3, unit_modules=task.unit_modules, precision="bf16", reduce_dtype="fp32")
    engine = ZeroEngine(task.model, cfg, optimizer=lambda g: torch.optim.AdamW(g, **OPT))
    losses = []
    for _ in range(steps):
        batch = to_device(next(task.batches), device)
        engine.backward(task.loss(engine(task.inputs(batch)), batch))
        losses.append(engine.step().loss)
    trained = all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    print(f"bf16 stage 3: loss {losses[0]:.4f} -> {losses[-1]:.4f} {'ok' if trained else 'FAILED'}", flush=True)
    report = engine.memory_report()
    fields = ("cuda_allocated_bytes", "cuda_reserved_bytes", "cuda_peak_allocated_bytes", "cuda_alloc_retries")
    figures = {f: getattr(report, f) for f in fields}
    if device.type != "cuda":
        print(f"allocator: {figures} (CPU: none expected)", flush=True)
        return trained and all(v is None for v in figures.values())
    present = all(v is not None for v in figures.values()) and (report.cuda_allocated_bytes or 0) > 0
    print(f"allocator: {figures} {'ok' if present else 'FAILED'}", flush=True)
    return trained and present


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device; run on a GPU machine or pass --device cpu", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # parity is checked in fp32
        torch.backends.cudnn.allow_tf32 = False
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group(process_group_backend(device.type == "cuda"), rank=0, world_size=1)
    print(f"torch {torch.__version__}, backend {dist.get_backend()}, device {device}", flush=True)
    try:
        ok = parity(device)
        ok &= bf16_and_allocator(device)
    finally:
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
