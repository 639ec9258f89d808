"""What starting a model costs each rank, against the bytes it is made of: construction, pretrained load, export.

For 3 sizes of the built-in GPT at N = 1, 2, 4, 8 gloo ranks (stage 3, fp32), every figure a ratio:

- construction: the peak of live tensor bytes (`LiveBytes`: every storage an operator returns, until freed) while
  the entry point builds the model, divided by the model's fp32 bytes; partitioned (today) and whole (an ordinary
  build, every rank holding the model), side by side;
- start-up: the same from before the entry point until the engine is built (its own shard and buffers included),
  both ways;
- load: `spec.model.pretrained` from a Hugging Face export of the same model, read into the rank's shard: the
  shard plus the largest single read (the reader's own count of each read's bytes: they are bytearrays, which
  `LiveBytes` does not see) and any tensor the reads allocated, divided by the shard's bytes;
- export: `checkpoint export --format huggingface` with shards of a quarter of the model: its peak of live tensor
  bytes divided by one output shard's size (one process; N = the checkpoint's ranks), and that peak in bytes: it
  is about two and a half reads of at most 16 MiB, whatever the shard;
- seconds from the entry point's call to the built engine, partitioned ÷ whole (each the median of `--reps`, the
  two interleaved).

    python bench/runtime/bench_init.py [--sizes 256x8,512x8,768x12] [--worlds 1,2,4,8] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

from zerotrain.quantity import format_bytes
from zerotrain.runtime.job.launch import free_port

GPT = "zerotrain.runtime.examples.gpt:build"


def gpt_args(d: int, layers: int) -> dict[str, Any]:
    return {"seq_len": 64, "batch_size": 8, "d_model": d, "n_layers": layers, "n_heads": 4, "max_bytes": 20_000}


def _rank(rank: int, world: int, port: int, job: dict[str, Any], out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        out.put((rank, {"start": _start, "load": _load, "save": _save}[job["what"]](rank, world, job)))
    finally:
        dist.destroy_process_group()


def _engine(model: Any, source: Any, device: Any) -> Any:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    return ZeroEngine(
        model,
        ZeroConfig(stage=3, unit_modules=["Block"]),
        lambda g: torch.optim.SGD(g, lr=0.1),
        init=source,
        device=device,
    )


def _start(rank: int, world: int, job: dict[str, Any]) -> dict[str, float]:
    from zerotrain.runtime.job.host_memory import returned_while_starting
    from zerotrain.runtime.job.model_start import start_task
    from zerotrain.runtime.job.task import build_task
    from zerotrain.runtime.zero.live_bytes import LiveBytes

    torch.manual_seed(0)
    t0 = time.perf_counter()
    with returned_while_starting(), LiveBytes() as live:
        if job["partitioned"]:
            with live.phase("build"):
                start = start_task(GPT, rank=rank, world_size=world, args=job["args"])
            engine = _engine(start.task.model, start.source, torch.device("cpu"))
        else:
            with live.phase("build"):
                task = build_task(GPT, rank=rank, world_size=world, args=job["args"])
            engine = _engine(task.model, None, None)
    seconds = time.perf_counter() - t0
    model = 4 * sum(u.layout.numel for u in engine.units)
    if job.get("save"):
        from zerotrain.runtime.checkpoints import checkpoint

        checkpoint.save(engine, job["save"])
    return {"build": live.phase_peaks["build"] / model, "peak": live.peak / model, "seconds": seconds}


def _load(rank: int, world: int, job: dict[str, Any]) -> dict[str, float]:
    """The pretrained load alone: the rank's shard allocated first, then each unit's range read into it."""
    from zerotrain.runtime.construction.pretrained import PretrainedValues, match
    from zerotrain.runtime.construction.weight_files import open_weights
    from zerotrain.runtime.job.task import build_task
    from zerotrain.runtime.zero.collectives import Comm
    from zerotrain.runtime.zero.live_bytes import LiveBytes
    from zerotrain.runtime.zero.partition import build_units
    from zerotrain.spec import PretrainedSpec

    with torch.device("meta"):
        model = build_task(GPT, rank=rank, world_size=world, args=job["args"]).model
    spec = PretrainedSpec(path=job["weights"])
    store = open_weights(spec.path)
    source = PretrainedValues(store, match(model, store, spec), None)  # type: ignore[arg-type]
    layouts = build_units(model, ["Block"], [], world)
    shard = torch.empty(sum(la.shard_numel for la in layouts))
    comm, at = Comm(60), 0
    with LiveBytes(held=[shard]) as live:  # the shard is the engine's; what the reads add is measured
        for la in layouts:
            lo, hi = la.shard_range(rank)
            source.read_loaded(la, lo, hi, shard[at : at + hi - lo])
            at += hi - lo
    del comm
    nbytes = 4 * shard.numel()
    held = nbytes + store.stats.largest_read_bytes + live.peak
    return {"ratio": held / nbytes, "read": store.stats.bytes_read / nbytes}


def _save(rank: int, world: int, job: dict[str, Any]) -> dict[str, float]:
    return _start(rank, world, {**job, "partitioned": True})


def ranks(world: int, job: dict[str, Any]) -> list[dict[str, float]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, job, out)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=900) for _ in procs)
    for p in procs:
        p.join()
    return [got[r] for r in range(world)]


def export_peak(ckpt: Path, model_bytes: int, tmp: Path) -> tuple[float, int]:
    from zerotrain.runtime.checkpoints.export_hf import export_huggingface
    from zerotrain.runtime.zero.live_bytes import LiveBytes

    shard = model_bytes // 4
    with LiveBytes() as live:
        export_huggingface(ckpt, tmp, max_shard_bytes=shard)
    return live.peak / shard, live.peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256x8,512x8,768x12", help="d_model x layers of each GPT")
    parser.add_argument("--worlds", default="1,2,4,8")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    table = Table(title="start-up per rank, as ratios (median over ranks; seconds: median of reps)")
    for col in (
        "model",
        "N",
        "construction ÷ model",
        "whole build ÷ model",
        "load ÷ shard",
        "export ÷ out shard",
        "seconds ÷ whole",
    ):
        table.add_column(col, justify="right")
    for size in args.sizes.split(","):
        d, layers = (int(x) for x in size.split("x"))
        gargs = gpt_args(d, layers)
        for world in (int(w) for w in args.worlds.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                peaks: dict[tuple[bool, str], list[float]] = {}
                times: dict[bool, list[float]] = {True: [], False: []}
                for _rep in range(args.reps):
                    for partitioned in (True, False):
                        got = ranks(world, {"what": "start", "args": gargs, "partitioned": partitioned})
                        for key in ("build", "peak"):
                            peaks.setdefault((partitioned, key), []).append(statistics.median(g[key] for g in got))
                        times[partitioned].append(max(g["seconds"] for g in got))
                ranks(world, {"what": "save", "args": gargs, "save": f"{tmp}/ckpt"})
                psi = _psi(gargs)
                out = Path(tmp, "hf")
                exported, export_bytes = export_peak(Path(tmp, "ckpt"), 4 * psi, out)
                load = ranks(world, {"what": "load", "args": gargs, "weights": str(out)})
                ratios = sorted(a / b for a, b in zip(times[True], times[False], strict=True))
                cells = [f"{psi / 1e6:.1f}M", str(world)]
                cells += [f"{statistics.median(peaks[(p, k)]):.2f}" for k in ("build", "peak") for p in (True, False)]
                cells += [f"{statistics.median(g['ratio'] for g in load):.3f}", f"{exported:.3f}"]
                seconds = f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
                table.add_row(*cells, format_bytes(export_bytes), seconds)
                Console(width=160).print(table)


def _psi(gargs: dict[str, Any]) -> int:
    d, layers, seq = gargs["d_model"], gargs["n_layers"], gargs["seq_len"]
    return layers * (12 * d * d + 13 * d) + (256 + seq) * d + 2 * d


if __name__ == "__main__":
    main()
