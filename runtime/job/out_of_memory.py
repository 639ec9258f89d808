"""Out of memory as a diagnosis: a rank that cannot allocate ends with one line saying where and with what.

Three allocators refuse the same way to the user: CUDA's caching allocator raises `torch.OutOfMemoryError`
("Tried to allocate 2.00 GiB"), torch's CPU allocator a RuntimeError ("DefaultCPUAllocator: can't allocate memory:
you tried to allocate N bytes") when the process's memory limit refuses (a container's, or `zerotrain run`'s
RLIMIT_DATA standing in for one, `apply_memory_limit`), and Python a MemoryError. Each becomes `RankOutOfMemory`,
whose message names the rank, what it was doing (its metrics' phase), the unit in progress, the bytes it asked
for and what it held by category (measured at the failure, else at the last step); the launcher passes it on as
the rank's failure (the pod's termination message). The kernel's OOM killer leaves no such line: that is SIGKILL,
which `failures` reports.
"""

from __future__ import annotations

import errno
import re
import resource
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from zerotrain.pod_contract import RANK_MEMORY_LIMIT_ENV
from zerotrain.quantity import format_bytes
from zerotrain.runtime.job.process_memory import status_bytes
from zerotrain.runtime.rank_phase import RankPhase

if TYPE_CHECKING:
    from zerotrain.runtime.job.rank_metrics import RankMetrics
    from zerotrain.runtime.zero.engine import ZeroEngine
    from zerotrain.runtime.zero.memory import MemoryReport

_CPU = re.compile(r"can't allocate memory: you tried to allocate (\d+) bytes")
_CUDA = re.compile(r"Tried to allocate ([\d.]+) ([KMGT]i?B)")
_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


class RankOutOfMemory(RuntimeError):
    """This rank could not allocate memory; the message is the whole account."""


# Other ways a process out of memory fails: a thread's stack that cannot be mapped (Python's "can't start new
# thread", which the gloo process group and the metrics server meet first at a small limit), C++'s new (bad_alloc,
# from torch's and gloo's own code), and mmap or fork refused by the kernel (ENOMEM).
AT_LIMIT_BYTES = 16 << 20
"""How near its limit a failing process's data segment counts as out of memory (a thread stack is 8 MiB)."""
_OTHER = re.compile(r"can't start new thread|std::bad_alloc|Cannot allocate memory")


def is_allocation_failure(error: BaseException) -> bool:
    """Whether `error` is the process running out of memory, whichever layer met it first."""
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    if isinstance(error, OSError) and error.errno == errno.ENOMEM:
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (_CPU.search(text) is not None or _OTHER.search(text) is not None)


def at_limit(limit: int | None, status: Path = Path("/proc/self/status")) -> bool:
    """Whether this process's data segment is within a few MB of `zerotrain run`'s limit on it: there, Python and
    torch fail in ways that do not say memory (a SystemError from the import system, a segfault in a thread), so
    an unexplained failure at the limit is the limit's."""
    if limit is None:
        return False
    data = status_bytes(status).get("VmData")
    return data is not None and data >= limit - AT_LIMIT_BYTES


def before_training(error: BaseException, rank: int, limit: int | None) -> str:
    """The account of a rank out of memory before its model exists: at a limit this small, the process itself (the
    interpreter, torch, gloo, the metrics server) does not fit, which the host line of the plan counts."""
    at = f" at its limit of {format_bytes(limit)}" if limit is not None else ""
    return (
        f"out of memory: rank {rank} while starting its process{at}, before building the model "
        f"({type(error).__name__}: {str(error) or 'no memory left'}); its share of resources.memory cannot hold the "
        "rank process itself: set resources.memory to at least what the host memory line of "
        "`zerotrain plan -f JOB` shows"
    )


def tried_bytes(error: BaseException) -> int | None:
    """The bytes the failed allocation asked for, as the allocator's message says."""
    text = str(error)
    if m := _CPU.search(text):
        return int(m.group(1))
    if m := _CUDA.search(text):
        return round(float(m.group(1)) * _UNITS[m.group(2)])
    return None


def account(
    error: BaseException,
    rank: int,
    metrics: RankMetrics | None,
    engine: ZeroEngine | None,
    built_whole: bool = False,
) -> str:
    """One line: rank, phase, unit, the bytes tried, the last measured categories, and the fix that applies there:
    at start-up (`constructing`: building the model, reading its starting values) the stage cannot help."""
    phase = metrics.current_phase.value if metrics is not None else "unknown phase"
    if metrics is not None and metrics.current_phase is RankPhase.CONSTRUCTING:
        return _at_start_up(error, rank, built_whole)
    where = (
        f" in unit {engine.accounting().unit_in_progress}"
        if engine is not None and engine.accounting().unit_in_progress
        else ""
    )
    tried = tried_bytes(error)
    asked = f"; it asked for {format_bytes(tried)}" if tried is not None else ""
    held = ""
    report = _held_now(engine) or (metrics.snapshot.memory if metrics is not None else None)
    if report is not None:
        parts = {
            "parameters": report.parameter_bytes,
            "gradients": report.gradient_bytes,
            "optimizer states": report.optimizer_bytes,
            "activations": report.activation_peak_bytes,
            "communication buffers": report.comm_buffer_peak_bytes,
        }
        held = "; it held " + ", ".join(f"{k} {format_bytes(v)}" for k, v in parts.items())
    return (
        f"out of memory: rank {rank} during {phase}{where}{asked}{held}; raise zero.stage (or use stage: auto), "
        "turn on zero.activationCheckpointing, lower the micro-batch, or give the ranks more memory"
    )


def _at_start_up(error: BaseException, rank: int, built_whole: bool) -> str:
    tried = tried_bytes(error)
    asked = f"; it asked for {format_bytes(tried)}" if tried is not None else ""
    if built_whole:
        how = (
            "the model was built whole on every rank (its construction cannot be partitioned: the first progress "
            "line says why), so each rank held all of its parameters; make the model's construction partitionable, "
            "or give each rank the whole model's memory"
        )
    else:
        how = (
            "it held its slice of every parameter and one unit whole; set resources.memory to at least what the host "
            "memory line of `zerotrain plan -f JOB` shows"
        )
    return f"out of memory: rank {rank} during constructing (building the model){asked}; {how}"


def _held_now(engine: ZeroEngine | None) -> MemoryReport | None:
    """What the rank holds at the failure, if even that small report can still be made."""
    if engine is None:
        return None
    try:
        return engine.accounting().memory_report()
    except (MemoryError, RuntimeError):
        return None


def apply_memory_limit(env: Mapping[str, str]) -> int | None:
    """`zerotrain run`: limit this rank's data memory to its share of spec.resources.memory, as a container limit
    would (RLIMIT_DATA: private writable memory, what tensors take; libraries' mappings are not counted)."""
    raw = env.get(RANK_MEMORY_LIMIT_ENV)
    if not raw:
        return None
    limit = int(raw)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return limit
