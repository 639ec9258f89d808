"""bench/gpu/gpu_check.py's sanitizer phase: short bf16 stage-2 and stage-3 runs (and fp32 chunked stage 3) under
TORCH_CUDA_SANITIZER=1, failing on "CSAN detected a possible data race"; a planted race must be reported, or the
sanitizer proves nothing."""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
from gpu_check_config import SIZES
from gpu_check_procs import first_line, last_error, run_child
from gpu_check_records import FAILED, SKIPPED, Checks, read_records
from gpu_check_train import batches, chunk_elements, device_of, init_group, make_task, teardown, train_engine

from zerotrain.pod_contract import SINGLE_RANK_COLLECTIVES_ENV as SINGLE_RANK_ENV

CSAN_MARK = "CSAN detected a possible data race"


def csan_summary(output: str) -> str:
    """The kernels of the first race CSAN reported."""
    lines = output.splitlines()
    start = next(i for i, ln in enumerate(lines) if CSAN_MARK in ln)
    kernels = [
        lines[i + 1].strip() for i in range(start, min(len(lines) - 1, start + 200)) if "during kernel" in lines[i]
    ]
    return f"{lines[start].strip()}: {' vs '.join(kernels[:2]) or 'see the log'}"


def sanitizer_verdict(rc: int | None, output: str) -> tuple[bool, str]:
    """A sanitized run passes when it exited 0 and CSAN reported no race."""
    if CSAN_MARK in output:
        return False, f"{output.count(CSAN_MARK)} race report(s); first: {csan_summary(output)}"
    if rc is None:
        return False, "timed out"
    if rc != 0:
        return False, f"exited with status {rc}: {last_error(output)}"
    return True, "no race reported"


def phase_sanitized_training(args: argparse.Namespace, checks: Checks) -> None:
    """Short stage-2/3 runs; on CUDA, TORCH_CUDA_SANITIZER=1 is set by the parent (CSAN must start with torch)."""
    device = device_of(args)
    if device.type == "cuda":
        from torch.cuda import _sanitizer

        active = bool(getattr(_sanitizer.cuda_sanitizer, "enabled", True))
        checks.add("CSAN active", active, "TORCH_CUDA_SANITIZER=1: every kernel's stream accesses are tracked")
    os.environ[SINGLE_RANK_ENV] = "1"
    init_group(device)
    size = SIZES[args.size]
    gpt = size.gpt.copy()
    gpt["n_layers"] = 2  # CSAN's cost is per kernel: two blocks exercise every path
    task = make_task(device, gpt)
    chunk = chunk_elements(task)
    data = batches(task, device, size.sanitizer_steps)
    runs = [
        ("bf16 stage 2", 2, "bf16", {}),
        ("bf16 stage 3", 3, "bf16", {}),
        ("fp32 stage 3 chunked", 3, "fp32", {"reduce_bucket_elements": chunk, "allgather_bucket_elements": chunk}),
    ]
    for label, stage, precision, cfg in runs:
        try:
            run = train_engine(make_task(device, gpt), data, stage, precision, **cfg)
        except Exception as e:  # CSAN raises CUDASanitizerErrors from the racing kernel's dispatch
            checks.add(f"{label} ran", False, first_line(e))
            continue
        finite = all(math.isfinite(x) for x in run.losses)
        checks.add(f"{label} ran", finite, f"{len(run.losses)} steps, loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f}")
    teardown()


def phase_csan_control() -> None:
    """A planted race: written on the default stream, read on another without waiting. CSAN must report it."""
    a = torch.empty(1 << 20, device="cuda")
    a.fill_(1.0)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a.mul(2.0)
    torch.cuda.synchronize()


def phase_sanitizer(args: argparse.Namespace, checks: Checks) -> None:
    phases = args.out / "phases"
    cuda = args.device == "cuda"
    env = {"TORCH_CUDA_SANITIZER": "1"} if cuda else {}
    budget = max(10.0, args.timeout - 5)
    t0 = time.monotonic()
    rc, output = run_child(args, "sanitized_training", phases / "sanitizer.training.log", budget * 0.8, env)
    checks.extend(read_records(phases / "sanitized_training.jsonl"))
    if not cuda:
        ok = rc == 0
        why = "CSAN watches CUDA streams only: the runs above ran unsanitized" if ok else f"exited with status {rc}"
        checks.add("sanitized run", SKIPPED if ok else FAILED, why)
        checks.add("CSAN catches a planted race", SKIPPED, "CPU")
        return
    ok, detail = sanitizer_verdict(rc, output)
    checks.add("bf16 stage 2/3 and chunked stage 3 under TORCH_CUDA_SANITIZER=1", ok, detail, exit_status=rc)
    left = budget - (time.monotonic() - t0)
    rc, output = run_child(args, "csan_control", phases / "sanitizer.control.log", max(5.0, left), env)
    caught = CSAN_MARK in output
    checks.add(
        "CSAN catches a planted race",
        caught,
        "reported (so a clean run above means no race CSAN can see)"
        if caught
        else f"not reported (exit {rc}): the sanitized run proves nothing",
    )
