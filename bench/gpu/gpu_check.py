"""The GPU paths in one call: NCCL collectives, stage 0-3 parity, the sanitizer, the allocator, bf16 throughput and
offload.

    bash bench/gpu/gpu_check.sh OUTDIR               # on the GPU machine: installs .gpu-bundle, then runs this
    python bench/gpu/gpu_check.py --device cpu       # the same checks on gloo with small sizes, to try the script
    python bench/gpu/gpu_check.py --device cpu --phases parity --out /tmp/gc

Each phase runs in its own process with its own timeout, all within one budget (`--budget-s`), and records one line
per check (printed, and in OUTDIR/gpu_check.json; every phase's full output is in OUTDIR/phases/). The exit status
is 1 when any check failed, 2 when the machine cannot run the checks at all. Phases:

- collectives: raw all_gather_into_tensor, reduce_scatter_tensor (SUM, AVG) and all_reduce (SUM, AVG) on the
  one-rank group (`cpu:gloo,cuda:nccl`, as zerotrain creates it), exact against the expected values, with the
  profiler showing the backend ran them; the stage-3 engine with ZEROTRAIN_SINGLE_RANK_COLLECTIVES=1 issuing real
  all-gathers and reduce-scatters at world size 1, and without it none.
- parity (single-rank collectives): fp32 stages 0-3 against torch.optim.AdamW (TF32 off, deterministic kernels,
  the math attention kernel), also with chunked buckets and with overlap_comm false; bf16 stages 1-3 (also chunked
  and overlap_comm false) against bf16 stage 0 on the same data, and bf16 stage 0 against fp32 AdamW loosely.
- two_ranks: two processes on the same device. NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), which
  is reported as "not possible" with NCCL's reason; where they run (gloo), raw collectives and parity at 2 ranks.
- sanitizer: a short bf16 stage-2 and stage-3 run (and fp32 chunked stage 3) under TORCH_CUDA_SANITIZER=1, failing
  on "CSAN detected a possible data race"; a planted race must be reported, or the sanitizer proves nothing.
- allocator: bf16 stages 0-3 on a mid-size model: torch.cuda.memory_stats (allocated, reserved, retries,
  fragmentation at peak) beside memory_report()'s measured and predicted (ZeRO formula) model states.
- device: what a rank holds beyond its tensors (the CUDA context, cuBLAS's workspaces, NCCL's buffers, the
  allocator's reserve), each measured beside the plan's figure (`zerotrain.plan.device`); skipped on the CPU.
- throughput: bench/gpu/gpu_throughput.py, bf16 tokens/s of zerotrain stage 3 against FSDP2 in both modes (a 1.01 B
  parameter GPT on CUDA), losses checked against FSDP2's.
- offload: bf16 stage 3 on the allocator's model, plain, with zero.offload.optimizer: cpu and with parameters: cpu
  too: memory_report()'s device and host categories against the plan, the offloaded tensors on the host (pinned
  on CUDA), peak allocated, losses against the plain run; FSDP2 with CPUOffloadPolicy beside them on CUDA; step
  times as ratios, not asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

# The gpu_check_* phases, gpu_throughput and gpu_bundle beside it; compare* (the benchmarks' runs) in bench/compare.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_allocator import phase_allocator
from gpu_check_collectives import phase_collectives
from gpu_check_config import FAULTS, PHASES
from gpu_check_device import phase_device
from gpu_check_driver import drive
from gpu_check_offload import phase_offload
from gpu_check_parity import phase_parity
from gpu_check_records import Checks
from gpu_check_sanitizer import phase_csan_control, phase_sanitized_training, phase_sanitizer
from gpu_check_throughput import phase_throughput
from gpu_check_two_ranks import phase_two_ranks, phase_two_ranks_rank

BENCH = Path(__file__).resolve().parents[1]  # bench/: results go to bench/results
PHASE_FUNCS: dict[str, Callable[[argparse.Namespace, Checks], None]] = {
    "collectives": phase_collectives,
    "parity": phase_parity,
    "two_ranks": phase_two_ranks,
    "two_ranks_rank": phase_two_ranks_rank,
    "sanitizer": phase_sanitizer,
    "sanitized_training": phase_sanitized_training,
    "allocator": phase_allocator,
    "device": phase_device,
    "throughput": phase_throughput,
    "offload": phase_offload,
}
"""What `--phase NAME` runs in this process (the driver starts these; csan_control is handled apart)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--device", choices=["cuda", "cpu"], default="cuda")
    add("--out", type=Path, default=BENCH / "results" / "gpu_check", help="folder for gpu_check.json and the logs")
    add("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    add("--quick", action="store_true", help="the smallest sizes (the tests' CPU run)")
    add("--budget-s", type=float, default=None, help="seconds for all phases (default 450 on cuda, 3600 on cpu)")
    add("--expect-site", type=Path, default=None, help="fail unless zerotrain was imported from this folder")
    add("--inject", action="append", default=[], choices=FAULTS, help="a fault that must make a check fail")
    # Internal: one phase in this process (the driver starts these).
    add("--phase", default=None, help=argparse.SUPPRESS)
    add("--size", default=None, help=argparse.SUPPRESS)
    add("--timeout", type=float, default=0.0, help=argparse.SUPPRESS)
    add("--rank", type=int, default=0, help=argparse.SUPPRESS)
    add("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.phases = [p for p in args.phases.split(",") if p]
    unknown = set(args.phases) - set(PHASES)
    if unknown:
        parser.error(f"--phases: unknown {', '.join(sorted(unknown))}; choose from {','.join(PHASES)}")
    if args.size is None:
        args.size = "quick" if args.quick else args.device
    if args.budget_s is None:
        args.budget_s = 450.0 if args.device == "cuda" else 3600.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # torch's renamed collectives, per process
    if args.phase is None:
        return drive(args)
    if args.phase == "csan_control":
        phase_csan_control()
        return 0
    name = f"{args.phase}.rank{args.rank}" if args.phase == "two_ranks_rank" else args.phase
    checks = Checks(args.phase, args.out / "phases" / f"{name}.jsonl")
    PHASE_FUNCS[args.phase](args, checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
