"""torch's process context for ranks forked from the preloaded server (`rank_fork`), failing as a subprocess gang
fails.

torch's elastic launcher watches function entry points (what a forked rank is) through `MultiprocessContext`,
which reports only the first failed process it happens to look at, while a gang of subprocesses
(`SubprocessContext`) reports every rank that has failed by the time it looks. The root cause of a failure is
chosen from all of them (`failures.root_cause`: the earliest failure record, and a rank killed outright before the
ones it took down), so `ForkedRanks` reports them all too; everything else is torch's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch.distributed.elastic.agent.server import local_elastic_agent
from torch.distributed.elastic.multiprocessing.api import (
    MultiprocessContext,
    PContext,
    ProcessFailure,
    RunProcsResult,
)


class ForkedRanks(MultiprocessContext):
    """MultiprocessContext that reports every rank failed so far, each with its own exit status and record."""

    def _poll(self) -> RunProcsResult | None:
        assert self._pc is not None
        failed = {i: p for i, p in enumerate(self._pc.processes) if p.exitcode not in (None, 0)}
        if not failed:
            return super()._poll()
        self.close()  # the others stop, as torch stops a failed gang
        return RunProcsResult(
            failures={
                i: ProcessFailure(local_rank=i, pid=p.pid, exitcode=p.exitcode, error_file=self.error_files[i])
                for i, p in failed.items()
            },
            stdouts=self.stdouts,
            stderrs=self.stderrs,
        )


@contextmanager
def forked_ranks() -> Iterator[None]:
    """torch's local agent starts function entry points as `ForkedRanks` inside the block."""
    original: Callable[..., PContext] = local_elastic_agent.start_processes

    def start(*, entrypoint: Any, start_method: str = "spawn", **kwargs: Any) -> PContext:
        if isinstance(entrypoint, str):
            return original(entrypoint=entrypoint, start_method=start_method, **kwargs)
        kwargs.pop("local_ranks_filter", None)
        context = ForkedRanks(entrypoint=entrypoint, start_method=start_method, **kwargs)
        try:
            context.start()
        except Exception:
            context.close()
            raise
        return context

    local_elastic_agent.start_processes = start  # type: ignore[assignment]
    try:
        yield
    finally:
        local_elastic_agent.start_processes = original
