"""bench/gpu/gpu_check.py's driver: the environment checks, each phase in its own process group within its timeout and
the whole budget, and the results in OUTDIR/gpu_check.json."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from gpu_bundle import release
from gpu_check_config import CPU_SLOWDOWN, MIN_TORCH, SIZES, TIMEOUTS, TOLERANCES
from gpu_check_procs import last_error, phase_command
from gpu_check_records import FAILED, NOT_POSSIBLE, OK, SKIPPED, Checks, read_records


def environment(args: argparse.Namespace, checks: Checks) -> dict[str, Any]:
    """The machine's torch (it must be its own, CUDA, 2.11 or newer) and where zerotrain was imported from."""
    import zerotrain

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "torch": torch.__version__,
        "torch_file": torch.__file__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "zerotrain_file": zerotrain.__file__,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
    }
    try:
        import pydantic

        info.update(pydantic=pydantic.VERSION, pydantic_file=pydantic.__file__)
    except ImportError:
        info["pydantic"] = None
    new_enough = release(torch.__version__) >= MIN_TORCH
    cuda_ok = args.device != "cuda" or (torch.version.cuda is not None and torch.cuda.is_available())
    checks.add(
        "torch",
        new_enough and cuda_ok,
        f"{torch.__version__} (CUDA {torch.version.cuda}, available {torch.cuda.is_available()}) from {torch.__file__}"
        + ("" if new_enough else f"; {'.'.join(map(str, MIN_TORCH))} or newer needed"),
    )
    if args.expect_site is not None:
        site = args.expect_site.resolve()
        zt = Path(zerotrain.__file__).resolve().is_relative_to(site)
        tr = not Path(torch.__file__).resolve().is_relative_to(site)
        checks.add("zerotrain from the bundle", zt, f"{zerotrain.__file__} ({'under' if zt else 'NOT under'} {site})")
        checks.add("torch is the machine's own", tr, f"{torch.__file__} ({'outside' if tr else 'INSIDE'} {site})")
    return info


def follow(proc: subprocess.Popen[bytes], records: Path, timeout: float, t0: float, sink: Checks) -> tuple[bool, int]:
    """Pass the phase's records on as they come until it exits, killing its process group past `timeout`:
    (whether it was killed, how many records were passed on)."""
    shown = 0
    while proc.poll() is None:
        if time.monotonic() - t0 > timeout:
            os.killpg(proc.pid, signal.SIGKILL)  # the phase and every rank it started
            proc.wait()
            return True, shown
        new = read_records(records)
        sink.extend(new[shown:])
        shown = len(new)
        time.sleep(0.25)
    return False, shown


def run_phase(args: argparse.Namespace, phase: str, timeout: float, sink: Checks) -> dict[str, Any]:
    """One phase in its own process group, its records printed as they come; a FAILED record if it broke."""
    phases = args.out / "phases"
    log, records = phases / f"{phase}.log", phases / f"{phase}.jsonl"
    records.unlink(missing_ok=True)
    cmd = phase_command(args, phase, timeout=timeout)
    t0 = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out, shown = follow(proc, records, timeout, t0, sink)
    new = read_records(records)
    sink.extend(new[shown:])
    seconds = time.monotonic() - t0
    rc = proc.returncode
    broke = None
    if timed_out:
        broke = f"timed out after {timeout:.0f} s"
    elif rc != 0:
        broke = f"exited with status {rc}: {last_error(log.read_text(errors='replace'))}"
    elif not new:
        broke = "recorded no checks"
    if broke:
        sink.add("phase", False, f"{broke} (log: {log})")
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print("\n".join("      | " + ln for ln in tail), flush=True)
    return {"seconds": round(seconds, 1), "timeout": round(timeout, 1), "exit_status": rc, "timed_out": timed_out}


def drive(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "phases").mkdir(exist_ok=True)
    records: list[dict[str, Any]] = []
    env_checks = Checks("environment", None)
    env = environment(args, env_checks)
    records += env_checks.records
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device; run on a GPU machine or pass --device cpu", file=sys.stderr)
        write_results(args, records, {}, env, t0)
        return 2
    scale = 1 if args.device == "cuda" else CPU_SLOWDOWN
    phases: dict[str, Any] = {}
    for phase in args.phases:
        left = args.budget_s - (time.monotonic() - t0)
        sink = Checks(phase, None)
        if left < 5:
            sink.add("phase", False, f"not run: the {args.budget_s:.0f} s budget is spent")
        else:
            print(f"--- {phase} (at most {min(TIMEOUTS[phase] * scale, left):.0f} s)", flush=True)
            phases[phase] = run_phase(args, phase, min(TIMEOUTS[phase] * scale, left), sink)
        records += sink.records
    return write_results(args, records, phases, env, t0)


def write_results(
    args: argparse.Namespace, records: list[dict[str, Any]], phases: dict[str, Any], env: dict[str, Any], t0: float
) -> int:
    counts = {s: sum(r["status"] == s for r in records) for s in (OK, FAILED, NOT_POSSIBLE, SKIPPED)}
    ok = counts[FAILED] == 0 and bool(records)
    throughput = args.out / "throughput.json"
    doc = {
        "ok": ok,
        "device": args.device,
        "size": args.size,
        "seconds": round(time.monotonic() - t0, 1),
        "budget_s": args.budget_s,
        "counts": counts,
        "environment": env,
        "phases": phases,
        "checks": records,
        "throughput": json.loads(throughput.read_text()).get("results") if throughput.is_file() else None,
        "tolerances": dict(TOLERANCES),
        "sizes": asdict(SIZES[args.size]),
    }
    (args.out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    print(
        f"gpu_check: {'PASSED' if ok else 'FAILED'}: {summary} in {doc['seconds']:.0f} s; {args.out / 'gpu_check.json'}"
    )
    return 0 if ok else 1
