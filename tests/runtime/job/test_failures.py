"""NCCL's watchdog takes a rank down with SIGABRT and records nothing: its stderr says it was a collective timeout,
a consequence, so the peer that was killed (the OOM killer's SIGKILL) stays the root cause."""

from __future__ import annotations

from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from zerotrain.runtime.job.failures import nccl_watchdog_abort
from zerotrain.runtime.job.launch import outcome_of_failures, rank_log_folders

# As torch 2.x's ProcessGroupNCCL prints it before aborting the process.
WATCHDOG = (
    "[rank0]:[E1201 10:00:00.000000 4242 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=57, OpType=_REDUCE_SCATTER_BASE, NumelIn=4194304, NumelOut=2097152, "
    "Timeout(ms)=600000) ran for 600070 milliseconds before timing out.\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n"
)

SIGKILL_SAID = (
    "it was killed by SIGKILL from outside (most often the kernel's OOM killer: its memory limit ran out; "
    "`zerotrain plan -f JOB` shows the resources.memory that holds it)"
)


def _rank(tmp: Path, rank: int, exitcode: int, stderr: str | None) -> ProcessFailure:
    """A rank that recorded no error file (killed or aborted), with its output captured where the launcher puts it."""
    folder = tmp / "quickstart_ab12" / "attempt_0" / str(rank)
    folder.mkdir(parents=True)
    if stderr is not None:
        (folder / "stderr.log").write_text("[rank0]: step 10 loss 2.3\n" + stderr)
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=exitcode, error_file=str(folder / "error.json"))


def test_a_watchdog_abort_is_a_timeout_and_the_killed_peer_the_root_cause(tmp_path: Path) -> None:
    aborted, killed = _rank(tmp_path, 0, -6, WATCHDOG), _rank(tmp_path, 1, -9, None)
    failures = {0: aborted, 1: killed}
    logs = rank_log_folders(tmp_path, failures)
    assert logs == {r: tmp_path / "quickstart_ab12" / "attempt_0" / str(r) for r in (0, 1)}
    assert nccl_watchdog_abort(aborted, logs[0])
    out = outcome_of_failures(failures, logs)
    assert out.message == "rank 1 failed first: " + SIGKILL_SAID, out
    assert out.details == ("rank 0 stopped: a collective timed out waiting for its peers (NCCL's watchdog aborted it)",)
    assert outcome_of_failures(failures).message == "rank 0 failed first: it was killed by SIGABRT"  # logs unread


def test_a_sigabrt_without_the_watchdogs_words_is_a_crash_and_the_root_cause(tmp_path: Path) -> None:
    crashed = _rank(tmp_path, 0, -6, "Assertion `index < size' failed.\n")
    uncaptured = _rank(tmp_path, 2, -6, None)  # no stderr captured: nothing says it was the watchdog
    failures = {0: crashed, 1: _rank(tmp_path, 1, -9, None), 2: uncaptured}
    logs = rank_log_folders(tmp_path, failures)
    assert not nccl_watchdog_abort(crashed, logs[0]) and not nccl_watchdog_abort(uncaptured, logs[2])
    out = outcome_of_failures(failures, logs)
    assert out.message == "rank 0 failed first: it was killed by SIGABRT", out


def test_a_cuda_error_the_watchdog_caught_stays_a_crash(tmp_path: Path) -> None:
    # The watchdog's general lines follow a CUDA error too: that rank crashed, it did not wait for a peer.
    error = (
        "[rank0]:[E1201 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog "
        "thread terminated with exception: CUDA error: an illegal memory access was encountered\n"
        "Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent "
        "GPU operations might run on corrupted/incomplete data.\n"
    )
    failures = {0: _rank(tmp_path, 0, -6, error), 1: _rank(tmp_path, 1, -6, WATCHDOG)}
    logs = rank_log_folders(tmp_path, failures)
    assert not nccl_watchdog_abort(failures[0], logs[0]) and nccl_watchdog_abort(failures[1], logs[1])
    assert outcome_of_failures(failures, logs).message == "rank 0 failed first: it was killed by SIGABRT"
