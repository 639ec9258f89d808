"""bf16 tokens/s of zerotrain stage 3 against FSDP2 (reshard after forward, and keep), one rank per run.

    python bench/gpu/gpu_throughput.py --device cuda      # a 1.01 B-parameter GPT (bench/gpu/gpu_check.sh runs it)
    python bench/gpu/gpu_throughput.py --device cpu --d-model 64 --layers 1 --heads 4 --seq-len 32 --batch 4 --steps 3

bench/compare/compare.py's machinery (its spawn of ranks, compare_systems' training loop, step timing and counted step)
with the compute in bf16: compare.py itself trains in fp32 only, which on an H200 measures neither system at the
precision it is used in. zerotrain runs `precision: bf16, reduceDtype: fp32`; FSDP2 runs `MixedPrecisionPolicy(
param_dtype=bf16, reduce_dtype=fp32)`: both keep fp32 masters and AdamW state and reduce in fp32. The model is built
directly on the device from the same seed. At world size 1 FSDP2 still issues its all-gathers and reduce-scatters
(single-rank NCCL communicators), so zerotrain runs with ZEROTRAIN_SINGLE_RANK_COLLECTIVES=1 and issues its own
(`--zero-local` runs it without them as well). Each system's loss at every step must stay within --atol of
FSDP2's: bf16 rounding differs between the systems, a wrong update does not stay within it.

Model FLOPs per token follow PaLM's accounting, 6Ψ + 12·L·d·T (the attention score and value matmuls at full
sequence length), and the utilisation is against --peak-tflops (the H200's dense bf16 figure used in
docs/performance.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

# Its siblings and bench/compare's compare* modules, also for spawned ranks.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
from compare import LossDisagreement, _spawn, check_agreement, check_choices, check_steps, results_header
from compare_systems import RunSpec, System, ZeroSystem, _adamw, _init_group, _train
from torch import nn

from zerotrain.pod_contract import SINGLE_RANK_COLLECTIVES_ENV as SINGLE_RANK_ENV
from zerotrain.runtime.examples.gpt import GPT, VOCAB, build

SYSTEMS = ("zero3", "fsdp2", "fsdp2-keep", "zero3-local")
LABELS = {
    "zero3": "zerotrain stage 3",
    "zero3-local": "zerotrain stage 3, no collectives at world 1",
    "fsdp2": "FSDP2 (reshard after forward)",
    "fsdp2-keep": "FSDP2 (keep after forward)",
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class ThroughputSpec(RunSpec):
    """compare_systems' RunSpec with the compute precision."""

    precision: str = "bf16"


def parameter_count(d_model: int, layers: int, seq_len: int) -> int:
    """Ψ of zerotrain.runtime.examples.gpt.GPT (the head is tied to the embedding)."""
    block = 12 * d_model * d_model + 13 * d_model  # qkv, proj, fc_in, fc_out with biases; two LayerNorms
    return layers * block + (VOCAB + seq_len) * d_model + 2 * d_model


def flops_per_token(psi: int, layers: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token, PaLM's convention: 6Ψ for the weights, 12·L·d·T for attention."""
    return 6.0 * psi + 12.0 * layers * d_model * seq_len


def _system(spec: ThroughputSpec, model: nn.Module, unit_modules: list[str]) -> System:
    if spec.system.startswith("zero3"):
        from zerotrain.runtime import ZeroConfig, ZeroEngine

        # As compare_systems: decay on every parameter, no clipping; the masters and reduction in fp32.
        cfg = ZeroConfig(
            stage=3,
            unit_modules=unit_modules,
            precision=spec.precision,
            reduce_dtype="fp32",
            gradient_clipping=None,
            no_weight_decay=[],
        )
        return ZeroSystem(ZeroEngine(model, cfg, optimizer=_adamw))
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=DTYPES[spec.precision], reduce_dtype=torch.float32)
    keep = spec.system == "fsdp2-keep"
    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block, reshard_after_forward=not keep, mp_policy=policy)
    fully_shard(model, reshard_after_forward=not keep, mp_policy=policy)
    return System(model, _adamw(model.parameters()))


def run_rank(rank: int, spec: ThroughputSpec) -> None:
    """One rank of one system's run (the target of torch.multiprocessing.spawn)."""
    if spec.device == "cpu":
        torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    warnings.simplefilter("ignore", FutureWarning)
    if spec.system == "zero3-local":
        os.environ.pop(SINGLE_RANK_ENV, None)
    else:
        os.environ[SINGLE_RANK_ENV] = "1"
    _init_group(spec, rank)
    torch.manual_seed(0)
    # The batches (they depend on the seed, sequence length, batch and world size, not on the model).
    task = build(rank=rank, world_size=spec.world, seq_len=spec.seq_len, batch_size=spec.batch, d_model=8,
                 n_layers=1, n_heads=1, max_bytes=spec.max_bytes)  # fmt: skip
    torch.manual_seed(0)
    with torch.device(spec.device):  # initialised on the device: a billion parameters in milliseconds
        model = GPT(seq_len=spec.seq_len, d_model=spec.d_model, n_layers=spec.layers, n_heads=spec.heads)
    task.model = model
    psi = sum(p.numel() for p in model.parameters())
    system = _system(spec, model, task.unit_modules)
    cuda = spec.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    result = _train(system, task, spec, rank)
    result.update(rank=rank, parameters=psi, memory=system.memory(), spec=asdict(spec))
    result["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated() if cuda else None
    result["cuda_peak_reserved_bytes"] = torch.cuda.max_memory_reserved() if cuda else None
    Path(spec.out_dir, f"{rank}.json").write_text(json.dumps(result))
    del system, task, model
    gc.collect()
    dist.destroy_process_group()


def summarise(spec: ThroughputSpec, ranks: list[dict[str, Any]], peak_tflops: float) -> dict[str, Any]:
    r0 = ranks[0]
    step_s = statistics.median(max(col) for col in zip(*(r["step_seconds"] for r in ranks), strict=True))
    tokens = spec.batch * spec.seq_len / step_s
    fpt = flops_per_token(r0["parameters"], spec.layers, spec.d_model, spec.seq_len)
    return {
        "system": spec.system,
        "label": LABELS[spec.system],
        "world": spec.world,
        "precision": spec.precision,
        "parameters": r0["parameters"],
        "step_seconds": step_s,
        "step_seconds_all": r0["step_seconds"],
        "tokens_per_second": tokens,
        "model_tflops": tokens * fpt / 1e12,
        "mfu": tokens * fpt / (peak_tflops * 1e12) if spec.device == "cuda" else None,
        "cuda_peak_allocated_bytes": r0["cuda_peak_allocated_bytes"],
        "cuda_peak_reserved_bytes": r0["cuda_peak_reserved_bytes"],
        "memory": r0["memory"],
        "comm_bytes_per_step": r0["comm_bytes"],
        "comm_ops": r0["comm_ops"],
        "losses": [statistics.mean(col) for col in zip(*(r["losses"] for r in ranks), strict=True)],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--device", choices=["cpu", "cuda"], default="cuda")
    add("--systems", default="zero3,fsdp2,fsdp2-keep", help=f"subset of {','.join(SYSTEMS)}")
    add("--zero-local", action="store_true", help="also zero3 without single-rank collectives (zero3-local)")
    add("--precision", choices=sorted(DTYPES), default="bf16")
    add("--world", type=int, default=1, help="ranks per run (one per GPU)")
    add("--reps", type=int, default=1, help="repetitions; every other one runs the systems in reverse order")
    add("--steps", type=int, default=8, help="steps per run: warmup, timed, then one counted for communication")
    add("--warmup", type=int, default=3)
    add("--d-model", type=int, default=2048)
    add("--layers", type=int, default=20)
    add("--heads", type=int, default=16)
    add("--seq-len", type=int, default=1024)
    add("--batch", type=int, default=16, help="global batch in sequences")
    add("--max-bytes", type=int, default=4_000_000, help="bytes of text the batches are drawn from")
    add("--atol", type=float, default=5e-2, help="largest |loss - FSDP2's loss| at any step")
    add("--min-params", type=int, default=0, help="fail unless the model has at least this many parameters")
    add("--peak-tflops", type=float, default=790.0, help="the device's peak in the chosen precision, for the MFU")
    add("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "gpu_throughput.json")
    add("--inject-loss-offset", action="store_true", help=argparse.SUPPRESS)  # tests: zero3's losses made wrong
    args = parser.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s] + (["zero3-local"] if args.zero_local else [])
    check_choices(parser, "--systems", args.systems, SYSTEMS)
    check_steps(parser, args.steps, args.warmup)
    return args


def agreement(results: list[dict[str, Any]], atol: float) -> dict[str, str]:
    """Each system's losses against the first FSDP2 mode's (or, without one, the first system's): failures by system."""
    ref = next((r for r in results if r["system"].startswith("fsdp2")), results[0] if results else None)
    failures = {}
    for r in results:
        if ref is None or r is ref:
            continue
        r["loss_reference"] = ref["system"]
        r["max_loss_diff"] = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"], strict=False))
        try:
            check_agreement(r["system"], r["world"], r["losses"], ref["losses"], atol)
        except LossDisagreement as e:
            failures[r["system"]] = f"{e} (against {ref['system']})"
    return failures


def checks(doc: dict[str, Any]) -> list[tuple[str, bool, str, dict[str, Any]]]:
    """(name, ok, detail, figures) per system and for the comparison, as bench/gpu/gpu_check.py records them."""
    out: list[tuple[str, bool, str, dict[str, Any]]] = []
    cfg = doc["config"]
    psi = parameter_count(cfg["d_model"], cfg["layers"], cfg["seq_len"])
    big = psi >= cfg["min_params"]
    shape = f"d_model {cfg['d_model']}, {cfg['layers']} layers, seq {cfg['seq_len']}, batch {cfg['batch']}"
    short = "" if big else f", fewer than {cfg['min_params']:,}"
    out.append(("model", big, f"{psi:,} parameters ({shape}, {cfg['precision']}){short}", {"parameters": psi}))
    for r in doc["results"]:
        mfu = "" if r["mfu"] is None else f", {r['mfu']:.0%} of {cfg['peak_tflops']:.0f} TFLOP/s"
        mem = "" if r["cuda_peak_allocated_bytes"] is None else f", peak {r['cuda_peak_allocated_bytes'] / 1e9:.1f} GB"
        diff = r.get("max_loss_diff")
        agree = "" if diff is None else f", max |loss - {r['loss_reference']}| {diff:.1e} (<= {cfg['atol']:.0e})"
        failure = doc["failures"].get(r["system"])
        detail = f"{r['tokens_per_second']:,.0f} tokens/s, {r['step_seconds'] * 1e3:.0f} ms/step{mfu}{mem}{agree}"
        figures = {k: r[k] for k in ("tokens_per_second", "step_seconds", "mfu", "cuda_peak_allocated_bytes")}
        out.append(
            (f"{r['system']} ({r['label']})", failure is None, detail + (f" -- {failure}" if failure else ""), figures)
        )
    by = {r["system"]: r for r in doc["results"]}
    for peer in ("fsdp2", "fsdp2-keep"):
        if "zero3" in by and peer in by:
            ratio = by["zero3"]["tokens_per_second"] / by[peer]["tokens_per_second"]
            out.append((f"zero3 / {peer}", True, f"{ratio:.2f}x the tokens/s", {"ratio": ratio}))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore:Failed to initialize NumPy")
    base = ThroughputSpec(
        system="zero3", world=args.world, port=0, out_dir="", d_model=args.d_model, layers=args.layers,
        heads=args.heads, seq_len=args.seq_len, batch=args.batch, steps=args.steps, warmup=args.warmup,
        device=args.device, max_bytes=args.max_bytes, precision=args.precision,
    )  # fmt: skip
    reps: dict[str, list[dict[str, Any]]] = {}
    t0 = time.perf_counter()
    for rep in range(args.reps):
        for system in args.systems if rep % 2 == 0 else args.systems[::-1]:
            t = time.perf_counter()
            spec = replace(base, system=system)
            summary = summarise(spec, _spawn(run_rank, spec, args.world), args.peak_tflops)
            reps.setdefault(system, []).append(summary)
            print(
                f"{system}: {summary['tokens_per_second']:,.0f} tokens/s, {summary['step_seconds'] * 1e3:.0f} ms/step, "
                f"{time.perf_counter() - t:.0f} s in all",
                flush=True,
            )
    results = []
    for system in args.systems:
        runs = reps[system]
        r = dict(runs[-1])
        r["tokens_per_second_reps"] = [x["tokens_per_second"] for x in runs]
        r["tokens_per_second"] = statistics.median(r["tokens_per_second_reps"])
        r["step_seconds"] = statistics.median(x["step_seconds"] for x in runs)
        if r["mfu"] is not None:
            r["mfu"] = statistics.median(x["mfu"] for x in runs)
        if args.inject_loss_offset and system == "zero3":
            r["losses"] = [x + 1.0 for x in r["losses"]]
        results.append(r)
    failures = agreement(results, args.atol)
    doc = {
        **results_header("bench/gpu/gpu_throughput.py", argv, args),
        "seconds": time.perf_counter() - t0,
        "results": results,
        "failures": failures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    for name, ok, detail, _ in checks(doc):
        print(f"{'ok' if ok else 'FAILED':>6}  {name}: {detail}")
    print(f"wrote {args.out}")
    return 0 if all(ok for _, ok, _, _ in checks(doc)) else 1


if __name__ == "__main__":
    sys.exit(main())
