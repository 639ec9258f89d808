"""bench/gpu/gpu_check.py started again as one phase's process, and what a failed process's output says."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent / "gpu_check.py"
"""The entry point every phase process runs (`--phase NAME`)."""


def child_args(args: argparse.Namespace) -> list[str]:
    out = ["--device", args.device, "--out", str(args.out), "--size", args.size]
    for fault in args.inject:
        out += ["--inject", fault]
    return out


def phase_command(args: argparse.Namespace, phase: str, **extra: Any) -> list[str]:
    """The command line of bench/gpu/gpu_check.py running `phase`, with `extra` as `--key value` options."""
    cmd = [sys.executable, str(SCRIPT), "--phase", phase, *child_args(args)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def run_child(
    args: argparse.Namespace, phase: str, log: Path, timeout: float, env: dict[str, str] | None = None, **extra: Any
) -> tuple[int | None, str]:
    """This script as another phase process; (exit status, None when it timed out; its output)."""
    cmd = phase_command(args, phase, **extra)
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
    return rc, log.read_text(errors="replace")


def first_line(e: BaseException) -> str:
    """An exception's type, its first line and NCCL's "Last error" line when it has one."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    last = [lines[i + 1] for i, ln in enumerate(lines[:-1]) if ln.startswith("Last error")]
    return f"{type(e).__name__}: {text}{' -- ' + last[0] if last else ''}"[:400]


def last_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^(\[rank\d+\]: )?\w*(Error|Exception)\b", ln)]
    return (errors or lines or ["no output"])[-1][:300]
