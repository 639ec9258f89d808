"""What the per-rank metrics cost: the real training loop (`zerotrain.runtime.job.train.Trainer`) with metrics on
against metrics off, in the same process tree, alternating on and off so drift on a shared machine hits both alike.
With metrics on, a thread in each rank scrapes it every --scrape-interval seconds (1 by default: 15 times as often
as the chart's PodMonitor).

Printed: median step time with metrics on over off, the time `observe_step` itself takes per step (the whole
hot-path cost: a memory report, a copy of the collective counters, an RSS read), and the time the step watch takes
per step (the step split's clock reads around data, checkpoint and evaluation, and every window the straggler
all-reduce: `runtime/job/step_watch.py`), each as a share of the step.

    python bench/runtime/bench_metrics.py --world 2 --steps 60 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import urllib.request
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

from zerotrain.runtime.job.launch import free_port
from zerotrain.runtime.job.metrics_endpoint import Endpoint


def _scraper(port: int, interval: float, stop: threading.Event, count: list[int]) -> None:
    while not stop.wait(interval):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            r.read()
        count[0] += 1


def _rank_main(rank: int, world: int, port: int, on: bool, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ["ZEROTRAIN_PROGRESS_FILE"] = os.devnull
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from zerotrain.runtime import ZeroEngine
    from zerotrain.runtime.job.model_start import make_engine
    from zerotrain.runtime.job.rank_metrics import NoMetrics, RankMetrics, StepValues
    from zerotrain.runtime.job.task import build_task
    from zerotrain.runtime.job.train import RankContext, Trainer
    from zerotrain.spec import ZeroTrainingJobSpec

    spec = ZeroTrainingJobSpec.model_validate(
        {
            "image": "bench",
            "entrypoint": "zerotrain.runtime.examples.gpt:build",
            "entrypointArgs": {
                "seq_len": 128,
                "batch_size": 16,
                "d_model": args.d_model,
                "n_layers": args.layers,
                "n_heads": 4,
                "max_bytes": 500_000,
            },
            "zero": {"stage": args.stage, "unitModules": ["Block"]},
            "training": {"steps": args.steps, "logEvery": 10**6, "optimizer": {"lr": 1e-3}},
        }
    )
    torch.manual_seed(0)
    ctx = RankContext(rank, world, rank)
    task = build_task(spec.entrypoint, rank=rank, world_size=world, args=spec.entrypoint_args)
    device = torch.device("cpu")
    engine = make_engine(task, spec, device, ZeroEngine)
    metrics = RankMetrics("bench", rank, rank, world, args.stage, args.steps, enabled=on)
    observe_s: list[float] = []
    watch_s = _time_the_watch()
    if on:
        metrics_port = metrics.serve(Endpoint("127.0.0.1", 0, 0, "bench"))
        inner = metrics.observe_step

        def timed(engine: ZeroEngine, values: StepValues) -> None:
            t0 = time.perf_counter()
            inner(engine, values)
            observe_s.append(time.perf_counter() - t0)

        metrics.observe_step = timed  # type: ignore[method-assign]
    stop, scrapes = threading.Event(), [0]
    scraper = (
        threading.Thread(target=_scraper, args=(metrics_port, args.scrape_interval, stop, scrapes)) if on else None
    )
    if scraper:
        scraper.start()
    result = Trainer(engine, task, spec, ctx, device, metrics=metrics if on else NoMetrics()).run()
    stop.set()
    if scraper:
        scraper.join()
    metrics.stop()
    if rank == 0:
        per_step = result.elapsed_s / args.steps
        observed = statistics.median(observe_s) if observe_s else 0.0
        out.put({"step_s": per_step, "observe_s": observed, "watch_s": watch_s[0] / args.steps, "scrapes": scrapes[0]})
    del engine
    import gc

    gc.collect()
    dist.destroy_process_group()


def _time_the_watch() -> list[float]:
    """Wrap the step watch's calls so their time adds up in the returned cell (run in every mode: the watch runs
    whether metrics are on or off)."""
    from contextlib import contextmanager

    from zerotrain.runtime.job.step_watch import StepWatch

    spent = [0.0]
    begin, end, timing = StepWatch.begin, StepWatch.end, StepWatch.timing

    def timed_begin(self: StepWatch) -> None:
        t0 = time.perf_counter()
        begin(self)
        spent[0] += time.perf_counter() - t0

    def timed_end(self: StepWatch, step: int) -> Any:
        t0 = time.perf_counter()
        try:
            return end(self, step)
        finally:
            spent[0] += time.perf_counter() - t0

    @contextmanager
    def timed_timing(self: StepWatch, phase: Any) -> Any:
        t0 = time.perf_counter()
        inner = timing(self, phase)
        inner.__enter__()
        spent[0] += time.perf_counter() - t0
        try:
            yield
        finally:
            t1 = time.perf_counter()
            inner.__exit__(None, None, None)
            spent[0] += time.perf_counter() - t1

    StepWatch.begin, StepWatch.end, StepWatch.timing = timed_begin, timed_end, timed_timing  # type: ignore[method-assign]
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stage", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes of each rank")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")
    ctx = mp.get_context("spawn")
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(args.repeats):
        for on in (False, True):
            queue = ctx.SimpleQueue()
            mp.spawn(_rank_main, args=(args.world, free_port(), on, args, queue), nprocs=args.world)
            runs[on].append(queue.get())
    off = statistics.median(r["step_s"] for r in runs[False])
    with_metrics = statistics.median(r["step_s"] for r in runs[True])
    observe = statistics.median(r["observe_s"] for r in runs[True])
    watch = statistics.median(r["watch_s"] for r in (*runs[True], *runs[False]))
    table = Table(
        title=f"metrics overhead: GPT d={args.d_model} L={args.layers}, stage {args.stage}, "
        f"N={args.world} gloo, {args.steps} steps × {args.repeats} runs each"
    )
    for col in ("", "median step", "on / off", "observe_step per step", "share of step", "scrapes per run"):
        table.add_column(col, justify="right")
    table.add_row("metrics off", f"{off * 1e3:.1f} ms", "1.000", "-", "-", "-")
    table.add_row("step watch (both)", "-", "-", f"{watch * 1e6:.0f} µs", f"{watch / off:.2%}", "-")
    table.add_row(
        "metrics on",
        f"{with_metrics * 1e3:.1f} ms",
        f"{with_metrics / off:.3f}",
        f"{observe * 1e6:.0f} µs",
        f"{observe / with_metrics:.2%}",
        f"{statistics.median(r['scrapes'] for r in runs[True]):.0f}",
    )
    Console().print(table)
    print(
        "per run, off:",
        [f"{r['step_s'] * 1e3:.1f}" for r in runs[False]],
        "on:",
        [f"{r['step_s'] * 1e3:.1f}" for r in runs[True]],
    )


if __name__ == "__main__":
    main()
