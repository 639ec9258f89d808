"""Which rank failed first, and why the others stopped: one account of a failed launch, root cause first.

A rank that fails records itself (torch elastic's error file, with a sub-second time and what kind of failure it
was). When ranks fail, the root cause is chosen in this order: a rank that exited with its own error, then one
that crashed on a signal (SIGSEGV, SIGABRT), then one killed by SIGKILL from outside (the OOM killer), then a
rank that only saw the consequence (its peer gone, a collective timed out), then one the launcher stopped
(SIGTERM, SIGINT); within a kind, one that recorded itself, then the earliest, then the lowest rank. The others
are listed in a line each, saying what they did in consequence.

On NCCL a stuck or failed collective never raises in Python: ProcessGroupNCCL's watchdog thread aborts the
communicator and the process (SIGABRT), and no error file is written. A SIGABRT whose captured stderr carries the
watchdog's words is therefore read as a collective timeout, a consequence, so a peer's SIGKILL (the OOM killer)
or its own error stays the root cause.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

_TIME_KEY = "zerotrainTime"
_KIND_KEY = "zerotrainKind"
TRACEBACK_FILE = "traceback.txt"


class FailureKind(str, Enum):
    """What a rank's own failure was, as it recorded it."""

    ERROR = "error"
    """An exception of its own: the entry point, the model, a bug."""
    CONFIG = "config"
    """The configuration cannot run (exit status 2)."""
    DIVERGED = "diverged"
    """Its ranks ran different units (RankDivergenceError)."""
    PEER_LOST = "peer-lost"
    """A collective failed because another rank was gone: a consequence."""
    TIMEOUT = "timeout"
    """A collective timed out waiting for its peers: usually a consequence of a stuck or dead rank."""
    PREEMPTED = "preempted"
    """Stopped on SIGTERM after committing a checkpoint."""
    OUT_OF_MEMORY = "out-of-memory"
    """It could not allocate memory (`out_of_memory`): the message says where and with what."""


CONSEQUENCES = (FailureKind.PEER_LOST, FailureKind.TIMEOUT)


def classify(error: BaseException) -> tuple[FailureKind, int, bool]:
    """A rank's exception as (kind, exit status, whether the runtime understands it: no traceback needed)."""
    from zerotrain.errors import EXIT_BAD_INPUT, UserError
    from zerotrain.runtime.job.out_of_memory import RankOutOfMemory
    from zerotrain.runtime.zero.engine_errors import CollectiveTimeoutError, PeerLostError, RankDivergenceError

    if isinstance(error, UserError):
        return FailureKind.CONFIG, EXIT_BAD_INPUT, True
    if isinstance(error, PeerLostError):
        return FailureKind.PEER_LOST, 1, True
    if isinstance(error, CollectiveTimeoutError):
        return FailureKind.TIMEOUT, 1, True
    if isinstance(error, RankDivergenceError):
        return FailureKind.DIVERGED, 1, True
    if isinstance(error, RankOutOfMemory):
        return FailureKind.OUT_OF_MEMORY, 1, True
    return FailureKind.ERROR, 1, False


def write_failure_record(
    message: str, kind: FailureKind = FailureKind.ERROR, error: BaseException | None = None
) -> None:
    """In a rank: leave torch elastic's error file (a sub-second time, the kind) and, for an exception, its full
    traceback in TRACEBACK_FILE next to it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    now = time.time()
    extra = {"timestamp": str(int(now)), _TIME_KEY: now, _KIND_KEY: kind.value}
    Path(path).write_text(json.dumps({"message": {"message": message, "extraInfo": extra}}))
    if error is not None:
        text = "".join(traceback.format_exception(error))
        Path(path).with_name(TRACEBACK_FILE).write_text(text)


def recorded(failure: Any) -> bool:
    """The rank wrote an error file (a failure it saw itself, with a precise time)."""
    return Path(failure.error_file).is_file()


def _extra(failure: Any) -> dict[str, Any]:
    message = failure.error_file_data.get("message", {}) if recorded(failure) else {}
    extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
    return extra if isinstance(extra, dict) else {}


def failure_time(failure: Any) -> float:
    return float(_extra(failure).get(_TIME_KEY, failure.timestamp))


# What ProcessGroupNCCL prints when it takes the process down over a *timed-out* collective (torch 2.4-2.13). Its
# general lines ("Some NCCL operations have failed or timed out", "watchdog thread terminated with exception") also
# follow a CUDA error the watchdog caught (an illegal memory access): those stay crashes, the root cause.
NCCL_WATCHDOG_MARKERS = (
    "Watchdog caught collective operation timeout",
    "ProcessGroupNCCL's watchdog got stuck",
    "Received a dump signal due to a collective timeout",
)
_STDERR_TAIL = 256 * 1024


def nccl_watchdog_abort(failure: Any, logs: Path | None) -> bool:
    """The rank died on SIGABRT and its captured stderr (in `logs`, its log folder) says NCCL's watchdog did it."""
    if failure.exitcode != -int(signal.SIGABRT) or logs is None:
        return False
    stderr = logs / "stderr.log"
    return stderr.is_file() and watchdog_text(_tail(stderr))


def watchdog_text(text: str) -> bool:
    return any(marker in text for marker in NCCL_WATCHDOG_MARKERS)


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - _STDERR_TAIL))
        return f.read().decode("utf-8", "replace")


def kind_of(failure: Any, logs: Path | None = None) -> FailureKind | None:
    """What the rank recorded about itself (or, for NCCL's watchdog abort, what its stderr in `logs` says); None
    when it recorded nothing (killed, crashed)."""
    value = _extra(failure).get(_KIND_KEY)
    if value in {k.value for k in FailureKind}:
        return FailureKind(value)
    return FailureKind.TIMEOUT if nccl_watchdog_abort(failure, logs) else None


def last_line(failure: Any) -> str:
    """The last line of the error the rank recorded itself; empty when it recorded none."""
    if not recorded(failure):
        return ""  # torch substitutes a link to its docs: no information about this failure
    detail = failure.message if isinstance(failure.message, str) else str(failure.message.get("message", ""))
    return detail.strip().splitlines()[-1] if detail.strip() else ""


def _priority(failure: Any, logs: Path | None) -> int:
    if kind_of(failure, logs) in CONSEQUENCES:
        return 3
    if failure.exitcode > 0:
        return 0
    sig = -failure.exitcode
    if sig == signal.SIGKILL:
        return 2
    return 4 if sig in (signal.SIGTERM, signal.SIGINT) else 1


def root_cause(failures: Mapping[int, Any], logs: Mapping[int, Path] | None = None) -> int:
    """The rank whose failure explains the others (see the module docstring); `logs`: ranks' log folders."""
    logs = logs or {}

    def order(r: int) -> tuple[int, bool, float, int]:
        return _priority(failures[r], logs.get(r)), not recorded(failures[r]), failure_time(failures[r]), r

    return min(failures, key=order)


def exit_code(failure: Any) -> int:
    """A rank's status as a shell reports it: its exit status, or 128 + the signal that killed it."""
    return int(failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode)


def how(failure: Any) -> str:
    if failure.exitcode > 0:
        return f"exited with status {failure.exitcode}"
    if -failure.exitcode == signal.SIGKILL:  # no rank sends it: the kernel's OOM killer, or someone's kill -9
        return (
            "was killed by SIGKILL from outside (most often the kernel's OOM killer: its memory limit ran out; "
            "`zerotrain plan -f JOB` shows the resources.memory that holds it)"
        )
    return f"was killed by {failure.signal_name()}"


def consequence(rank: int, failure: Any, logs: Path | None = None) -> str:
    """One line on a rank that failed after the root cause."""
    kind = kind_of(failure, logs)
    if kind is FailureKind.PEER_LOST:
        return f"rank {rank} stopped: its peer was gone"
    if kind is FailureKind.TIMEOUT:
        by = " (NCCL's watchdog aborted it)" if failure.exitcode < 0 else ""
        return f"rank {rank} stopped: a collective timed out waiting for its peers{by}"
    if failure.exitcode < 0 and -failure.exitcode in (signal.SIGTERM, signal.SIGINT):
        return f"rank {rank} was stopped by the launcher ({failure.signal_name()})"
    line = last_line(failure)
    return f"rank {rank} {how(failure)}" + (f": {line}" if line else "")


def log_files(failure: Any, logs: Path | None = None) -> list[Path]:
    """The rank's captured output and traceback, when the launcher captured them (`logs`, else next to its error
    file)."""
    folder = logs if logs is not None else Path(failure.error_file).parent
    return [folder / n for n in ("stderr.log", "stdout.log", TRACEBACK_FILE) if (folder / n).is_file()]
