"""Step time and model-state memory of ZeRO stages 0-3 against PyTorch's own DDP and FSDP2.

Every configuration trains the same byte-level GPT (zerotrain.runtime.examples.gpt) on the same data
with AdamW, as N gloo processes spawned from this one process tree, one configuration after another.
Results are printed as ratios against the peers (DDP for data parallelism, FSDP2 `fully_shard` per
block for full sharding): wall-clock seconds on a shared machine mean little alone.

    python bench/bench_stages.py --world 2 --steps 12 --d-model 256 --layers 4
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

from zerotrain.runtime.launch import free_port

CONFIGS = ["ddp", "zero0", "zero1", "zero2", "zero3", "fsdp2"]


@dataclass
class Result:
    """One configuration's figures, from rank 0."""

    name: str
    step_seconds: float
    model_state_bytes: int
    comm_bytes_per_step: int
    final_loss: float


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _tensor_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state this rank holds (DTensors by their local shard)."""
    total = 0
    for p in model.parameters():
        total += _local(p).numel() * p.element_size()
        if p.grad is not None:
            total += _local(p.grad).numel() * p.grad.element_size()
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                total += _local(v).numel() * v.element_size()
    return total


def _comm_bytes(engine: Any) -> int:
    return 0 if engine is None else sum(int(s["bytes"]) for s in engine.comm_report().values())


def _peer(name: str, task: Any) -> tuple[Any, Any]:
    model = task.model
    if name == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in task.model.blocks:
            fully_shard(block)
        fully_shard(task.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    return model, opt


def _rank_main(rank: int, world: int, port: int, name: str, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.examples.gpt import build

    torch.manual_seed(0)
    task = build(
        rank=rank,
        world_size=world,
        seq_len=args.seq_len,
        batch_size=args.batch,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=4,
        max_bytes=500_000,
    )
    engine = None
    if name.startswith("zero"):
        # Same optimisation as the peers: decay on every parameter, no clipping.
        cfg = ZeroConfig(
            stage=int(name[-1]), unit_modules=task.unit_modules, gradient_clipping=None, no_weight_decay=[]
        )
        engine = ZeroEngine(task.model, cfg, optimizer=lambda g: torch.optim.AdamW(g, lr=1e-3, weight_decay=0.1))
        model, opt = engine, None
    else:
        model, opt = _peer(name, task)
    times: list[float] = []
    comm_at_warmup = 0
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        batch = next(task.batches)
        dist.barrier()
        t0 = time.perf_counter()
        loss = task.loss(model(task.inputs(batch)), batch)
        if engine is not None:
            engine.backward(loss)
            engine.step()
        else:
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        if step == args.warmup - 1:
            comm_at_warmup = _comm_bytes(engine)
    if engine is not None:
        report = engine.memory_report()
        state_bytes = report.model_state_bytes
        # Steady state only: the start-up broadcast of rank 0's weights is not a per-step cost.
        comm = (_comm_bytes(engine) - comm_at_warmup) // (args.steps - args.warmup)
    else:
        state_bytes, comm = _tensor_bytes(model, opt), 0
    if rank == 0:
        out.put(asdict(Result(name, statistics.median(times), state_bytes, comm, loss.item())))
    # The engine's hooks form reference cycles: free it (and its gloo work) while the group is alive.
    del engine, model, opt
    gc.collect()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args()
    # Spawned ranks import torch first; the CPU wheel warns about numpy in each of them otherwise.
    os.environ.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")
    ctx = mp.get_context("spawn")
    results: dict[str, dict[str, Any]] = {}
    for name in args.configs.split(","):
        queue = ctx.SimpleQueue()
        mp.spawn(_rank_main, args=(args.world, free_port(), name, args, queue), nprocs=args.world)
        results[name] = queue.get()
    render(results, args)


def render(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    base = results.get("ddp") or next(iter(results.values()))
    table = Table(
        title=f"GPT d={args.d_model} L={args.layers}, N={args.world} gloo ranks, AdamW fp32; "
        f"ratios against {base['name']}"
    )
    for col in ("config", "step time ×", "model states / rank", "memory ×", "comm bytes / step", "loss"):
        table.add_column(col, justify="right")
    for r in results.values():
        table.add_row(
            r["name"],
            f"{r['step_seconds'] / base['step_seconds']:.2f}",
            f"{r['model_state_bytes']:,}",
            f"{r['model_state_bytes'] / base['model_state_bytes']:.3f}",
            f"{r['comm_bytes_per_step']:,}" if r["comm_bytes_per_step"] else "-",
            f"{r['final_loss']:.4f}",
        )
    console = Console()
    console.print(table)
    if "zero3" in results and "fsdp2" in results:
        z, f = results["zero3"], results["fsdp2"]
        console.print(
            f"zero3 / fsdp2: step time {z['step_seconds'] / f['step_seconds']:.2f}×, "
            f"model states {z['model_state_bytes'] / f['model_state_bytes']:.3f}×"
        )


if __name__ == "__main__":
    main()
