"""bench/gpu/gpu_check.py's two_ranks phase: two processes on the same device. NCCL refuses two ranks on one GPU
("Duplicate GPU detected"), reported as "not possible" with NCCL's reason; where they run (gloo), the raw
collectives and parity at 2 ranks."""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from typing import Any

import torch
import torch.distributed as dist
from gpu_check_collectives import raw_collectives
from gpu_check_config import SIZES
from gpu_check_parity import parity_runs
from gpu_check_procs import first_line, phase_command
from gpu_check_records import FAILED, NOT_POSSIBLE, OK, Checks, read_records
from gpu_check_train import device_of, exact_fp32, init_group, math_attention, teardown

from zerotrain.runtime.job.launch import free_port


def phase_two_ranks_rank(args: argparse.Namespace, checks: Checks) -> None:
    """One of two ranks on the same device: a probe, then raw collectives and parity at 2 ranks."""
    device = device_of(args)
    exact_fp32(device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # two ranks share the cores
    try:
        init_group(device, args.rank, 2, args.port)
        t = torch.ones(4, device=device)
        dist.all_reduce(t)
        probe = t.cpu().tolist()
    except Exception as e:
        # NCCL refuses two ranks on one GPU; gloo on the CPU never should.
        checks.add("probe", NOT_POSSIBLE if device.type == "cuda" else FAILED, first_line(e))
        os._exit(0)  # no teardown: a communicator that failed to form can hang it
    if probe != [2.0] * 4:
        checks.add("probe", False, f"all_reduce of ones over 2 ranks gave {probe}")
        return
    checks.add("probe", OK, f"2 ranks on {device}: all_reduce of ones gave 2")
    raw_collectives(checks, device, args.rank, 2, set(args.inject))
    size = SIZES[args.size]
    with math_attention():
        parity_runs(checks, device, size.gpt, size.steps, set(args.inject), args.rank, 2)
    teardown()


def run_ranks(args: argparse.Namespace, timeout: float) -> list[int | None]:
    """Both ranks' processes, each logging to phases/two_ranks.rankR.log; their exit statuses (None: killed)."""
    port = free_port()
    phases = args.out / "phases"
    cmds = [phase_command(args, "two_ranks_rank", rank=r, port=port) for r in range(2)]
    logs = [(phases / f"two_ranks.rank{r}.log").open("w") for r in range(2)]
    env = {**os.environ, "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")}  # NCCL's reason, in the ranks' logs
    procs = [subprocess.Popen(c, stdout=f, stderr=subprocess.STDOUT, env=env) for c, f in zip(cmds, logs, strict=True)]
    deadline = time.monotonic() + timeout
    rcs: list[int | None] = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rcs.append(None)
    for f in logs:
        f.close()
    return rcs


def phase_two_ranks(args: argparse.Namespace, checks: Checks) -> None:
    rcs = run_ranks(args, max(10.0, args.timeout - 5))
    phases = args.out / "phases"
    recs = [read_records(phases / f"two_ranks_rank.rank{r}.jsonl") for r in range(2)]
    probes: list[dict[str, Any] | None] = [next((x for x in rec if x["name"] == "probe"), None) for rec in recs]
    name = f"2 ranks on one {'GPU' if args.device == 'cuda' else 'CPU'}"
    if any(p is None or p["status"] != OK for p in probes):
        reasons = []
        for r, (probe, rc) in enumerate(zip(probes, rcs, strict=True)):
            if probe is None:
                reasons.append(f"rank {r}: " + ("hung" if rc is None else f"exited with status {rc}") + " in its probe")
            elif probe["status"] != OK:
                reasons.append(f"rank {r}: {probe['detail']}")
        failed = any(probe is not None and probe["status"] == FAILED for probe in probes)
        checks.add(name, FAILED if failed else NOT_POSSIBLE, "; ".join(reasons))
        return
    checks.add(name, OK, f"both ranks on {'cuda:0' if args.device == 'cuda' else 'cpu'}")
    checks.extend([x for x in recs[0] if x["name"] != "probe"])
    checks.extend([x for x in recs[1] if x["name"] != "probe" and x["status"] == FAILED], prefix="rank 1: ")
    for r, rc in enumerate(rcs):
        if rc != 0:
            checks.add(f"rank {r}", False, "timed out" if rc is None else f"exited with status {rc}")
