"""What a resharded load costs each rank: bytes read and peak extra memory, against the shard it ends up holding.

Saves a stage-3 checkpoint of an MLP stack (AdamW, after one step) at one world size and loads it at another,
as gloo processes spawned from this process tree. Per loading rank: the bytes it read, its largest single read,
the training state it holds after the load (fp32 master + Adam's two moments = 12 bytes per element of its
shard), and its peak anonymous resident memory during the load (RssAnon, sampled every 2 ms) above what it held
before, less the moments the load creates: the transient cost of loading. (The file pages safetensors maps are
page cache, counted in RssFile, and left out. The ranks run with a fixed glibc mmap threshold so RSS follows
the tensors held.) The loader before this one read every rank's file and built the
full masters and moments on every rank: 12Ψ bytes per rank, printed for comparison.

    python bench/runtime/bench_reshard.py --width 2048 --blocks 8
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table
from torch import nn

from zerotrain.quantity import format_bytes
from zerotrain.runtime.job.launch import free_port


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


def _model(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block(args.width) for _ in range(args.blocks)))


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _rank(rank: int, world: int, port: int, mode: str, root: str, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.checkpoints import checkpoint

    engine = ZeroEngine(
        _model(args), ZeroConfig(stage=3, unit_modules=["Block"]), lambda g: torch.optim.AdamW(g, lr=1e-3)
    )
    if mode == "save":
        x = torch.randn(2, args.width)
        engine.backward(engine(x).square().mean())
        engine.step()
        checkpoint.save(engine, root)
        _teardown(engine)
        return
    shard = sum(u.master.numel() for u in engine.units)
    gc.collect()  # the construction's garbage (the model's original tensors) must not be freed inside the window
    before, peak, stop = _status("RssAnon"), [0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.002):
            peak[0] = max(peak[0], _status("RssAnon"))

    sampler = threading.Thread(target=sample)
    sampler.start()
    loaded = checkpoint.load(engine, root)
    stop.set()
    sampler.join()
    peak[0] = max(peak[0], _status("RssAnon"))
    # Adam's moments did not exist before the load (torch creates them at the first step): 8 bytes per element.
    extra = peak[0] - before - 8 * shard
    out.put((rank, loaded.bytes_read, loaded.largest_read_bytes, 12 * shard, extra))
    _teardown(engine)


def _teardown(engine: Any) -> None:
    # The engine's hooks form cycles; finalising them after the process group is gone can abort the process.
    del engine
    gc.collect()
    torch.distributed.destroy_process_group()


def _spawn(world: int, mode: str, root: str, args: argparse.Namespace) -> list[tuple[int, ...]]:
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_rank, args=(world, free_port(), mode, root, args, queue), nprocs=world)
    rows = [queue.get() for _ in range(world)] if mode == "load" else []
    return sorted(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--cases", default="4:3,2:4", help="saved:loaded world sizes, comma-separated")
    args = parser.parse_args()
    # A fixed mmap threshold: every large tensor is its own mapping, returned on free, so RSS follows the tensors
    # held (glibc's adaptive threshold otherwise keeps freed memory resident and hides what a load allocates).
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    psi = sum(p.numel() for p in _model(args).parameters())
    table = Table(title=f"resharded loads, stage 3, Ψ = {psi:,} parameters (12Ψ = {format_bytes(12 * psi)})")
    columns = ("case", "rank", "bytes read", "largest read", "state held (12·shard)", "transient (RssAnon)", "old: 12Ψ")
    for col in columns:
        table.add_column(col, justify="right")
    for case in args.cases.split(","):
        saved, loaded = (int(n) for n in case.split(":"))
        with tempfile.TemporaryDirectory(prefix="bench-reshard-") as root:
            _spawn(saved, "save", root, args)
            for rank, read, largest, held, extra in _spawn(loaded, "load", root, args):
                cells = (format_bytes(read), format_bytes(largest), format_bytes(held), format_bytes(extra))
                table.add_row(f"{saved} → {loaded}", str(rank), *cells, format_bytes(12 * psi))
    Console().print(table)


if __name__ == "__main__":
    main()
