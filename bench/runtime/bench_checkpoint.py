"""How long a checkpoint holds the step loop: synchronous saves against `checkpoint.async`, on the same run.

Two gloo ranks train zerotrain's example GPT at stage 3 with fp32 AdamW and save every `--every` steps, the two
modes alternating save by save (so both see the same machine, page cache and disk state). Per save: the seconds
the loop was blocked (a synchronous save's whole write, fsync and commit; an asynchronous one's snapshot into host
buffers and the directory's token), the steps run while its write was in flight, and the seconds to its commit;
per mode, the median step time of the steps around the saves against steps with no save near. Figures are medians
with their range; the goal is an asynchronous save that blocks at least 10× less than a synchronous one.

    python bench/runtime/bench_checkpoint.py                      # d=512, 8 layers, 6 saves of each mode
    python bench/runtime/bench_checkpoint.py --d-model 256 --layers 2 --saves 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

from zerotrain.quantity import format_bytes
from zerotrain.runtime.job.launch import free_port

MODES = ("sync", "async")


def _engine(args: argparse.Namespace, rank: int, world: int) -> tuple[Any, Any]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.examples.gpt import build

    torch.manual_seed(0)
    task = build(
        rank=rank, world_size=world, seq_len=64, batch_size=4, d_model=args.d_model, n_layers=args.layers,
        n_heads=8, max_bytes=200_000,
    )  # fmt: skip
    cfg = ZeroConfig(stage=3, unit_modules=task.unit_modules)
    engine = ZeroEngine(task.model, cfg, optimizer=lambda g: torch.optim.AdamW(g, lr=1e-4))
    return engine, task


def _step(engine: Any, task: Any, written: bool = False) -> tuple[float, Any]:
    t0 = time.perf_counter()
    batch = next(task.batches)
    engine.backward(task.loss(engine(task.inputs(batch)), batch))
    out = engine.step(written=written)
    return time.perf_counter() - t0, out


def _save(mode: str, engine: Any, task: Any, root: Path, saver: Any) -> dict[str, float]:
    """One save in `mode`, and the steps that follow it until it is committed (at least `--every` of them)."""
    from zerotrain.runtime.checkpoints import checkpoint

    t0 = time.perf_counter()
    if mode == "sync":
        checkpoint.save(engine, root)
        blocked = committed = time.perf_counter() - t0
        return {"blocked": blocked, "committed": committed, "steps_in_flight": 0}
    saver.start(engine, root)
    blocked = time.perf_counter() - t0
    steps = 0
    while True:
        _, out = _step(engine, task, written=saver.written())
        steps += 1
        if saver.commit_if_agreed(engine, out.written) is not None:
            return {"blocked": blocked, "committed": time.perf_counter() - t0, "steps_in_flight": steps}


def run_rank(rank: int, args: argparse.Namespace, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from zerotrain.runtime.checkpoints.async_save import AsyncSaver

    engine, task = _engine(args, rank, 2)
    saver = AsyncSaver()
    plain: list[float] = []
    saves: list[dict[str, Any]] = []
    for _ in range(2):
        _step(engine, task)  # warm-up
    for i in range(2 * args.saves):
        mode = MODES[i % 2]
        for _ in range(args.every):
            plain.append(_step(engine, task)[0])
        root = Path(out_dir) / mode
        seconds_after = time.perf_counter()
        save = _save(mode, engine, task, root, saver)
        after, _ = _step(engine, task)  # the step right after the save's return (or commit)
        saves.append({"mode": mode, **save, "step_after": after, "wall": time.perf_counter() - seconds_after})
    from zerotrain.runtime.checkpoints import checkpoint, model_record

    newest = checkpoint.latest(Path(out_dir) / "sync")
    nbytes = model_record.rank_file_bytes(newest, rank) if newest else 0
    Path(out_dir, f"{rank}.json").write_text(json.dumps({"plain": plain, "saves": saves, "file_bytes": nbytes}))
    dist.destroy_process_group()


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}–{max(values):.3f})"


def report(ranks: list[dict[str, Any]], console: Console) -> dict[str, Any]:
    """The table, and the figures it shows (the slowest rank's, save by save)."""
    saves = [max(col, key=lambda s: s["blocked"]) for col in zip(*(r["saves"] for r in ranks), strict=True)]
    plain = statistics.median(max(col) for col in zip(*(r["plain"] for r in ranks), strict=True))
    table = Table(title=f"checkpoint saves of {format_bytes(max(r['file_bytes'] for r in ranks))} per rank, 2 ranks")
    for col in ("mode", "blocked", "to commit", "steps in flight", "step after"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    figures: dict[str, Any] = {"plain_step_seconds": plain}
    for mode in MODES:
        mine = [s for s in saves if s["mode"] == mode]
        blocked = [s["blocked"] for s in mine]
        figures[mode] = {"blocked": blocked, "committed": [s["committed"] for s in mine]}
        table.add_row(
            mode,
            _median(blocked),
            _median([s["committed"] for s in mine]),
            f"{statistics.median(s['steps_in_flight'] for s in mine):g}",
            _median([s["step_after"] for s in mine]),
        )
    console.print(table)
    sync, asy = (statistics.median(figures[m]["blocked"]) for m in MODES)
    figures["blocked_ratio"] = sync / asy
    overlap = max(figures["async"]["blocked"]) >= min(figures["sync"]["blocked"])
    console.print(
        f"a step without a save: {plain:.3f} s; an asynchronous save blocks {sync / asy:.1f}× less than a "
        f"synchronous one (goal: ≥ 10×){'; the ranges overlap: call them equal' if overlap else ''}"
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--saves", type=int, default=6, help="saves of each mode, alternating")
    parser.add_argument("--every", type=int, default=3, help="steps between saves")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "checkpoint.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zt-bench-ckpt-") as d:
        mp.set_forkserver_preload(["torch", "torch.distributed", "zerotrain.runtime.zero.engine"])  # imported once
        mp.start_processes(run_rank, args=(args, free_port(), d), nprocs=2, start_method="forkserver")
        ranks = [json.loads(Path(d, f"{r}.json").read_text()) for r in range(2)]
    figures = report(ranks, Console(width=160))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(["python", "bench/runtime/bench_checkpoint.py", *(argv if argv is not None else sys.argv[1:])])
    args.out.write_text(json.dumps({"command": cmd, **figures}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
