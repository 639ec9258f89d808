"""ZeRO-R on and off: what contiguous gradients, the bucket size, activation checkpointing and offload do to a
rank's memory and step time, on the byte-level GPT of the examples, stage 3 (and 2), as gloo ranks spawned from
this process tree, configurations alternated and repeated, medians reported.

Memory is counted from the tensors each rank holds (`memory_report()`; RSS under glibc hides what sharding
frees): model states, plus the peaks of gathered parameters, saved activations and communication buffers, plus
the gradient arenas. Step time is the median over the measured steps (the first is left out: it allocates).
"New grad storages/step" counts the gradient tensors of the last step that live in storage no earlier step used:
the allocations contiguous gradients remove (on CUDA, `torch.cuda.memory_stats()` would show the fragmentation).

    python bench/runtime/bench_zero_r.py --d-model 384 --layers 4 --steps 6 --repeats 2 --plot docs/zero-r.svg
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

from zerotrain.quantity import format_bytes
from zerotrain.runtime.job.launch import free_port


@dataclass(frozen=True)
class Setup:
    name: str
    stage: int = 3
    contiguous: bool = True
    bucket: int = 50_000_000
    checkpointing: bool = False
    offload: bool = False


SETUPS = [
    Setup("stage 3, defaults (contiguous, 50M bucket)"),
    Setup("stage 3, contiguous off", contiguous=False),
    Setup("stage 3, bucket 10M", bucket=10_000_000),
    Setup("stage 3, bucket 1M", bucket=1_000_000),
    Setup("stage 3, checkpointing", checkpointing=True),
    Setup("stage 3, checkpointing + offload", checkpointing=True, offload=True),
    Setup("stage 2, defaults", stage=2),
    Setup("stage 2, contiguous off", stage=2, contiguous=False),
]


def _rank(rank: int, world: int, port: int, setup: Setup, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    import gc

    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.examples.gpt import GPT, next_byte_loss

    torch.manual_seed(0)
    model = GPT(seq_len=args.seq_len, d_model=args.d_model, n_layers=args.layers, n_heads=4)
    cfg = ZeroConfig(
        stage=setup.stage,
        unit_modules=["Block"],
        contiguous_gradients=setup.contiguous,
        reduce_bucket_elements=setup.bucket,
        allgather_bucket_elements=setup.bucket,
        activation_checkpointing=setup.checkpointing,
        offload_activation_checkpoints=setup.offload,
    )
    # New gradient storages per step (on CPU the allocation count the arenas are there to bring to zero): a hook
    # ahead of the engine's own sees each `.grad` before its reduction drops it.
    storages: list[set[int]] = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda q: storages[-1].add(q.grad.untyped_storage()._cdata))
    engine = ZeroEngine(model, cfg, optimizer=lambda g: torch.optim.AdamW(g, lr=1e-3))
    g = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(args.steps):
        storages.append(set())
        batch = torch.randint(0, 256, (args.batch, args.seq_len + 1), generator=g)
        t0 = time.perf_counter()
        engine.backward(next_byte_loss(engine(batch[:, :-1]), batch))
        engine.step()
        times.append(time.perf_counter() - t0)
    m = engine.accounting().memory_report()
    peak = (
        m.model_state_bytes
        + m.gathered_peak_bytes
        + m.activation_peak_bytes
        + m.comm_buffer_peak_bytes
        + m.gradient_arena_bytes
    )
    seen_before = set().union(*storages[:-1])
    new_grads = len(storages[-1] - seen_before)  # the last step's gradients in storages no earlier step used
    if rank == 0:
        out.put({"step_s": statistics.median(times[1:]), "peak": peak, "grad_allocs": new_grads, **m.model_dump()})
    del engine
    gc.collect()
    torch.distributed.destroy_process_group()


def measure(setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_rank, args=(args.world, free_port(), setup, args, queue), nprocs=args.world)
    return dict(queue.get())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--plot", default=None, help="write the figure here (.svg or .png; needs matplotlib)")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in SETUPS}
    for _ in range(args.repeats):  # alternate, so drift on a shared machine hits every configuration alike
        for setup in SETUPS:
            runs[setup.name].append(measure(setup, args))
    rows = summarize(runs)
    render(rows, args)
    if args.plot:
        plot(rows, Path(args.plot))


def summarize(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    base = statistics.median(r["step_s"] for r in runs[SETUPS[0].name])
    rows = []
    for name, rs in runs.items():
        step = statistics.median(r["step_s"] for r in rs)
        last = rs[-1]
        rows.append(
            {
                "name": name,
                "step_s": step,
                "vs_default": step / base,
                "peak": last["peak"],
                "activations": last["activation_peak_bytes"],
                "comm": last["comm_buffer_peak_bytes"],
                "arenas": last["gradient_arena_bytes"],
                "gathered": last["gathered_peak_bytes"],
                "grad_allocs": last["grad_allocs"],
            }
        )
    return rows


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    table = Table(title=f"ZeRO-R, GPT d={args.d_model} × {args.layers} layers, {args.world} gloo ranks, per rank")
    columns = ("configuration", "step", "× default", "peak", "activations", "comm buffers", "arenas", "gathered")
    for col in (*columns, "new grad storages/step"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for r in rows:
        table.add_row(
            r["name"],
            f"{r['step_s'] * 1000:.0f} ms",
            f"{r['vs_default']:.2f}",
            *(format_bytes(r[k]) for k in ("peak", "activations", "comm", "arenas", "gathered")),
            str(r["grad_allocs"]),
        )
    Console().print(table)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in rows]
    fig, (mem, step) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    parts = ("activations", "comm", "arenas", "gathered")
    left = [r["peak"] - sum(r[k] for k in parts) for r in rows]
    mem.barh(names, [x / 1e6 for x in left], label="model states")
    for key in parts:
        mem.barh(names, [r[key] / 1e6 for r in rows], left=[x / 1e6 for x in left], label=key)
        left = [a + r[key] for a, r in zip(left, rows, strict=True)]
    mem.set_xlabel("MB per rank (counted from the tensors held)")
    mem.legend(fontsize=8)
    mem.invert_yaxis()
    step.barh(names, [r["vs_default"] for r in rows], color="gray")
    step.axvline(1.0, color="black", linewidth=0.8)
    step.set_xlabel("step time × stage-3 defaults (median)")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
