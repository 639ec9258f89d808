"""zerotrain's ZeRO stages 0-3 side by side with DDP, ZeroRedundancyOptimizer, FSDP2 and DeepSpeed ZeRO 1-3.

Every system trains the same GPT (zerotrain.runtime.examples.gpt) from the same seed on the same global batches
with fp32 AdamW, each in its own process group of spawned ranks (gloo on CPU, NCCL with --device cuda), one
thread per rank. Systems run one after another, in reverse order every other repetition; the figures are
medians over repetitions. Per system: tokens/s, step time, model-state bytes per rank counted from the tensors
it holds, peak RSS per rank, bytes its collectives send per step and rank (counted, ring convention: see
compare_comm.py) and the loss. The run fails, naming the system and the step, when any system's loss
trajectory leaves a single-process torch.optim.AdamW reference on the concatenated global batch by more than
--atol. DeepSpeed runs when it imports (`make bench` installs it where it can; see docs/benchmarks.md).

Throughput here spreads ±15% run to run, so each figure is the median of the repetitions (5 by default) with their
range, and a ratio whose two ranges overlap is reported as equal, not as a win or a loss. `--shard-group S` runs the
sharded systems hybrid (zerotrain's zero.shardGroupSize, FSDP2's HSDP on a (W/S, S) mesh) and counts the bytes
that cross between groups apart.

    python bench/compare/compare.py                      # worlds 1,2, every system, 5 repetitions
    python bench/compare/compare.py --worlds 2 --systems zero3,fsdp2 --reps 1
    python bench/compare/compare.py --worlds 4 --shard-group 2 --systems zero3,fsdp2,ddp
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/compare: the sibling modules, also for spawned ranks

import torch
import torch.multiprocessing as mp
from compare_report import plot_all, print_tables
from compare_systems import DEEPSPEED, FORMULA_STAGE, HYBRID, LABELS, SYSTEMS, RunSpec, run_rank, run_reference

from zerotrain.runtime.job.launch import free_port
from zerotrain.runtime.zero.memory import predict
from zerotrain.zero_config import Stage

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "compare.json"  # bench/results, git-ignored
DEFAULT_PLOTS = Path(__file__).resolve().parents[2] / "docs"


class LossDisagreement(AssertionError):
    """A system's loss left the single-process reference."""


def check_agreement(system: str, world: int, losses: list[float], reference: list[float], atol: float) -> float:
    """The largest |loss - reference| over the steps; raises naming the system and the first step beyond atol."""
    if len(losses) != len(reference):
        raise LossDisagreement(f"{system} (N={world}): {len(losses)} losses, reference has {len(reference)}")
    worst = 0.0
    for step, (got, want) in enumerate(zip(losses, reference, strict=True)):
        diff = abs(got - want)
        if not diff <= atol:  # also catches NaN
            raise LossDisagreement(
                f"{system} (N={world}) step {step}: loss {got:.6f}, reference {want:.6f}, "
                f"|diff| {diff:.2e} > atol {atol:.0e}"
            )
        worst = max(worst, diff)
    return worst


PRELOAD = ["torch", "torch.distributed", "torch.distributed.fsdp", "zerotrain.runtime.zero.engine", "compare_systems"]
"""What the forkserver imports once: each repetition of each system starts fresh ranks, and a spawned rank spent about
3 s importing these (a fork happens before any rank computes, so the timed steps are the same either way)."""


def _spawn(target: Any, spec: RunSpec, nprocs: int) -> list[dict[str, Any]]:
    """Run `target(rank, spec)` in `nprocs` fresh processes (forked from a forkserver that imported `PRELOAD`, and
    nothing else: no CUDA context, no thread pool); their result files, by rank."""
    mp.set_forkserver_preload(PRELOAD)  # read when the server starts, at the first call
    with tempfile.TemporaryDirectory(prefix="zt-compare-") as d:
        spec = replace(spec, out_dir=d, port=free_port())
        try:
            mp.start_processes(target, args=(spec,), nprocs=nprocs, start_method="forkserver")
        except mp.ProcessExitedException as e:
            # A signal at exit after every rank wrote its figures (gloo teardown) loses nothing.
            if len(list(Path(d).glob("*.json"))) < nprocs:
                raise RuntimeError(f"{spec.system} (N={spec.world}): a rank failed: {e}") from None
            print(f"warning: {spec.system} (N={spec.world}): {e} after writing its results", file=sys.stderr)
        except mp.ProcessRaisedException as e:
            raise RuntimeError(f"{spec.system} (N={spec.world}): a rank raised:\n{e}") from None
        return [json.loads(Path(d, f"{r}.json").read_text()) for r in range(nprocs)]


def _summarise(system: str, world: int, ranks: list[dict[str, Any]], spec: RunSpec) -> dict[str, Any]:
    """One repetition's figures from every rank's."""
    # A step ends when its slowest rank does.
    per_step = [max(col) for col in zip(*(r["step_seconds"] for r in ranks), strict=True)]
    step_s = statistics.median(per_step)
    mem = ranks[0]["memory"]
    psi = ranks[0]["parameters"]
    pp, pg, po = predict(Stage(FORMULA_STAGE[system]), psi, _sharded_over(system, spec), 4.0, 4.0, 8.0)
    engine = [r["engine_comm_bytes"] for r in ranks]
    return {
        "system": system,
        "label": LABELS[system],
        "world": world,
        "parameters": psi,
        "step_seconds": step_s,
        "tokens_per_second": spec.batch * spec.seq_len / step_s,
        "memory": {**mem, "model_state": sum(mem.values())},
        "model_state_max_rank": max(sum(r["memory"].values()) for r in ranks),
        "predicted": {"parameter": pp, "gradient": pg, "optimizer": po, "model_state": pp + pg + po},
        "max_rss_bytes": max(r["max_rss_bytes"] for r in ranks),
        "cuda_peak_allocated_bytes": ranks[0]["cuda_peak_allocated_bytes"],
        # Broadcasts count at their source only, so ranks differ: the mean is what each sends on average.
        "comm_bytes_per_step": statistics.mean(r["comm_bytes"] for r in ranks),
        "across_bytes_per_step": statistics.mean(r["across_bytes"] for r in ranks),
        "shard_group": spec.shard_group if spec.hybrid else world,
        "comm_ops_rank0": ranks[0]["comm_ops"],
        "engine_comm_bytes_per_step": None if engine[0] is None else statistics.mean(engine),
        # Each rank's loss is the mean over its equal share of the batch: their mean is the global batch's.
        "losses": [statistics.mean(col) for col in zip(*(r["losses"] for r in ranks), strict=True)],
    }


def _sharded_over(system: str, spec: RunSpec) -> int:
    """N of the formula: the shard group for the systems that shard within it, the world for the others."""
    return spec.shard_group if spec.hybrid and system in HYBRID else spec.world


def _median_of_reps(reps: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(reps[-1])
    out["step_seconds_reps"] = [r["step_seconds"] for r in reps]
    out["step_seconds"] = statistics.median(out["step_seconds_reps"])
    out["tokens_per_second_reps"] = [r["tokens_per_second"] for r in reps]
    out["tokens_per_second"] = statistics.median(out["tokens_per_second_reps"])
    out["max_rss_bytes"] = statistics.median(r["max_rss_bytes"] for r in reps)
    out["final_loss"] = out["losses"][-1]
    return out


def deepspeed_reason(device: str) -> str | None:
    """Why DeepSpeed cannot run here, or None when it imports."""
    os.environ.setdefault("DS_ACCELERATOR", device)
    try:
        import deepspeed  # noqa: F401
    except Exception as e:  # an install without its ops fails in many ways, not only ImportError
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def environment() -> dict[str, Any]:
    """The machine and the versions the figures came from."""
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in ln),
        platform.processor(),
    )
    versions: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        from importlib.metadata import version

        versions["deepspeed"] = version("deepspeed")
    except Exception:
        versions["deepspeed"] = None
    return {"nproc": os.cpu_count(), "cpu": cpu, "versions": versions}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--worlds", default="1,2", help="comma-separated world sizes (e.g. 2,4; 4 oversubscribes 2 cores)")
    add("--systems", default=",".join(SYSTEMS), help=f"subset of {','.join(SYSTEMS)}")
    add("--reps", type=int, default=5, help="repetitions; every other one runs the systems in reverse order")
    add("--shard-group", type=int, default=0, help="hybrid sharding: shard over groups of this many ranks (FSDP2 HSDP)")
    add("--steps", type=int, default=7, help="steps per run: warmup, timed, then one counted for communication")
    add("--warmup", type=int, default=2, help="untimed steps at the start")
    add("--d-model", type=int, default=384)
    add("--layers", type=int, default=4)
    add("--heads", type=int, default=6)
    add("--seq-len", type=int, default=128)
    add("--batch", type=int, default=8, help="global batch in sequences (a multiple of every world size)")
    add("--max-bytes", type=int, default=500_000, help="bytes of text the batches are drawn from")
    add("--device", choices=["cpu", "cuda"], default="cpu")
    add("--atol", type=float, default=1e-4, help="largest |loss - reference| at any step before the run fails")
    add("--out", type=Path, default=DEFAULT_OUT, help="JSON results")
    add("--plots", type=Path, default=DEFAULT_PLOTS, help="directory for the PNG plots")
    add("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    check_steps(parser, args.steps, args.warmup)
    for world in (int(w) for w in args.worlds.split(",")):
        if args.shard_group and world > args.shard_group and world % args.shard_group:
            parser.error(f"--shard-group {args.shard_group} does not divide --worlds' {world}; use a divisor")
    check_choices(parser, "--systems", args.systems.split(","), SYSTEMS)
    return args


def check_steps(parser: argparse.ArgumentParser, steps: int, warmup: int) -> None:
    """Exit through `parser` unless the run has warmup steps, then one timed and one counted."""
    if steps < warmup + 2 or warmup < 0:
        parser.error(f"--steps {steps}, --warmup {warmup}: need steps >= warmup + 2 (one timed, one counted)")


def check_choices(parser: argparse.ArgumentParser, flag: str, given: list[str], known: Sequence[str]) -> None:
    """Exit through `parser`, naming what `given` holds beyond `known`."""
    unknown = set(given) - set(known)
    if unknown:
        parser.error(f"{flag}: unknown {', '.join(sorted(unknown))}; choose from {','.join(known)}")


def results_header(script: str, argv: list[str] | None, args: argparse.Namespace) -> dict[str, Any]:
    """What a results file starts with: the command that made it, the machine, and the parsed arguments."""
    return {
        "command": " ".join(["python", script, *(argv if argv is not None else sys.argv[1:])]),
        "environment": environment(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }


def _systems(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    wanted = args.systems.split(",")
    skipped: dict[str, str] = {}
    if args.shard_group:
        # ZeRO++'s hpZ shards only a secondary copy of the parameters per node, not the optimizer state: another
        # layout, so it is no peer of these figures.
        skipped = {s: "no layout matching --shard-group (ZeRO++ hpZ is another one)" for s in wanted if s in DEEPSPEED}
    elif any(s in DEEPSPEED for s in wanted):
        reason = deepspeed_reason(args.device)
        if reason is not None:
            skipped = {s: f"deepspeed does not import: {reason}" for s in wanted if s in DEEPSPEED}
    for s, why in skipped.items():
        print(f"skipping {s}: {why}")
    return [s for s in wanted if s not in skipped], skipped


def _run_one(spec: RunSpec, reference: list[float], atol: float) -> tuple[dict[str, Any], str | None]:
    """One system at one world size: its summary and, when its loss left the reference, why."""
    t0 = time.perf_counter()
    summary = _summarise(spec.system, spec.world, _spawn(run_rank, spec, spec.world), spec)
    summary["max_loss_diff"] = max(abs(a - b) for a, b in zip(summary["losses"], reference, strict=False))
    failure = None
    try:
        check_agreement(spec.system, spec.world, summary["losses"], reference, atol)
    except LossDisagreement as e:
        failure = str(e)
    ms = summary["step_seconds"] * 1e3
    print(f"N={spec.world} {spec.system}: {ms:.0f} ms/step, {time.perf_counter() - t0:.0f} s in all", flush=True)
    return summary, failure


def run_all(args: argparse.Namespace, systems: list[str]) -> tuple[list[float], list[dict[str, Any]], list[str]]:
    """The reference, then every system at every world size, `reps` times; (reference, results, failures)."""
    base = RunSpec(
        system="reference", world=1, port=0, out_dir="", d_model=args.d_model, layers=args.layers,
        heads=args.heads, seq_len=args.seq_len, batch=args.batch, steps=args.steps, warmup=args.warmup,
        device=args.device, max_bytes=args.max_bytes, shard_group=args.shard_group,
    )  # fmt: skip
    reference = _spawn(run_reference, base, 1)[0]["losses"]
    reps: dict[tuple[str, int], list[dict[str, Any]]] = {}
    failures: list[str] = []
    for rep in range(args.reps):
        print(f"repetition {rep + 1} of {args.reps}", flush=True)
        # Reversed every other repetition, so no system always runs first (cold caches) or last.
        order = systems if rep % 2 == 0 else systems[::-1]
        for world in (int(w) for w in args.worlds.split(",")):
            for system in order:
                summary, failure = _run_one(replace(base, system=system, world=world), reference, args.atol)
                reps.setdefault((system, world), []).append(summary)
                failures += [failure] if failure else []
    results = [_median_of_reps(r) for r in reps.values()]
    return reference, sorted(results, key=lambda r: (r["world"], SYSTEMS.index(r["system"]))), failures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Spawned ranks import torch first; the CPU wheel warns about numpy in each of them otherwise.
    os.environ.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")
    systems, skipped = _systems(args)
    reference, results, failures = run_all(args, systems)
    doc = {
        **results_header("bench/compare/compare.py", argv, args),
        "byte_convention": "per rank, ring: all-reduce 2(N-1)/N·payload, all-gather and reduce-scatter "
        "(N-1)/N·full tensor, broadcast payload at the source",
        "reference_losses": reference,
        "results": results,
        "skipped": skipped,
        "failures": failures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print_tables(doc)
    if not args.no_plots:
        for path in plot_all(doc, args.plots):
            print(f"wrote {path}")
    print(f"wrote {args.out}")
    for f in failures:
        print(f"FAIL: loss disagrees with the single-process reference: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
