"""bench/gpu/gpu_check.py's throughput phase: bench/gpu/gpu_throughput.py (bf16 tokens/s of zerotrain stage 3 against
FSDP2 in both modes, losses checked against FSDP2's), its checks recorded as this phase's."""

from __future__ import annotations

import argparse
import json

from gpu_check_config import SIZES
from gpu_check_records import Checks


def phase_throughput(args: argparse.Namespace, checks: Checks) -> None:
    import gpu_throughput

    size = SIZES[args.size]
    out = args.out / "throughput.json"
    argv = ["--device", args.device, "--out", str(out), "--min-params", str(size.min_params), *size.throughput.split()]
    if "throughput-loss" in args.inject:
        argv.append("--inject-loss-offset")
    gpu_throughput.main(argv)
    doc = json.loads(out.read_text())
    for name, ok, detail, figures in gpu_throughput.checks(doc):
        checks.add(name, ok, detail, **figures)
