"""One rank's checkpointing, in one object: where the run resumes from, when it saves, and what it commits.

A pod gang restarted by the operator (or `zerotrain run --checkpoint-dir` run again) resumes from the
newest committed checkpoint that every rank can verify. A corrupt one is refused with a warning naming
it and why, and the previous good one is used: no rank ever loads a checkpoint another rank refused.
Data resumes at the saved micro-batch: through the task's own `load_state_dict` when its batch iterator has
one (O(1)), else by drawing and dropping the consumed micro-batches.

The Trainer holds one `Checkpointer` and calls `written` (its vote in the step's control all-reduce), `after_step`
and `close`; the rank's start calls `resume`; the mechanics are `checkpoint` (synchronous) and `async_save`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from zerotrain.errors import ConfigError
from zerotrain.runtime.checkpoints import base, checkpoint, model_record
from zerotrain.runtime.checkpoints.async_save import AsyncSaver, InFlight, check_directory_fsync
from zerotrain.runtime.checkpoints.checkpoint import Loaded
from zerotrain.runtime.rank_phase import RankPhase
from zerotrain.runtime.zero.engine_state import Checkpointable
from zerotrain.spec import CheckpointSpec

log = logging.getLogger(__name__)


class CheckpointMetrics(Protocol):
    """What the checkpointer reports to (the rank's metrics, or nothing)."""

    def phase(self, phase: RankPhase) -> None: ...
    def observe_save(self, step: int, seconds: float, nbytes: int) -> None: ...
    def observe_blocked(self, seconds: float) -> None: ...
    def observe_load(self, step: int, seconds: float, nbytes: int) -> None: ...


class HasBatches(Protocol):
    """A task: its iterator of this rank's micro-batches (moved to where a resumed run stopped)."""

    batches: Iterator[Any]


class Resumed(Enum):
    """Where a run's values came from."""

    CHECKPOINT = "checkpoint"
    """The job's own newest good checkpoint."""
    PRETRAINED = "pretrained"
    """The pretrained weights (every checkpoint of the job was refused, so they were read after all)."""
    FRESH = "fresh"
    """Nothing: the values the engine was built with (the model's own, or pretrained weights read at construction)."""


@dataclass(frozen=True)
class Resume:
    """What `Checkpointer.resume` did."""

    source: Resumed
    loaded: Loaded | None = None
    """The checkpoint loaded (source CHECKPOINT)."""

    @property
    def first_step(self) -> int:
        return (self.loaded.step if self.loaded is not None else 0) + 1


@dataclass(frozen=True)
class CheckpointPolicy:
    """Save every `interval` steps and at the end under `root`, keeping the newest `keep_last`; `asynchronous`: the
    interval saves are written in the background (`async_save`)."""

    root: Path
    interval: int
    keep_last: int
    asynchronous: bool = False
    origin: dict[str, Any] = field(default_factory=dict)
    """Where the model's weights first came from (`{"pretrained": path}`) and the frozen base the checkpoints refer
    to (`checkpoints.base`), recorded in every marker."""

    @classmethod
    def from_spec(cls, spec: CheckpointSpec, origin: dict[str, Any] | None = None) -> CheckpointPolicy | None:
        """The policy for this run, or None when spec.checkpoint.path is unset (a throw-away local run)."""
        if not spec.path:
            return None
        root = Path(spec.path)
        if spec.async_save:
            check_directory_fsync(root)
        return cls(root, spec.interval_steps, spec.keep_last, spec.async_save, origin or {})

    def due(self, step: int, last_step: int) -> bool:
        return step % self.interval == 0 or step == last_step


def has_own(spec: CheckpointSpec) -> bool:
    """Whether the job has a committed checkpoint of its own (decided before the engine is built: it then need not
    read pretrained weights)."""
    return spec.path is not None and checkpoint.latest(spec.path) is not None


class Checkpointer:
    """One rank's resumes and saves under `policy` (None: the run saves nothing and starts fresh)."""

    def __init__(self, engine: Checkpointable, policy: CheckpointPolicy | None, metrics: CheckpointMetrics) -> None:
        self.engine = engine
        self.policy = policy
        self.metrics = metrics
        self._saver = AsyncSaver() if policy is not None and policy.asynchronous else None

    def resume(self, task: HasBatches, refill: Callable[[], None] | None = None) -> Resume:
        """Load the newest good checkpoint and move the task's data to where it stopped. `refill`: reads the
        pretrained weights into the engine, called when the job had checkpoints and every one was refused."""
        loaded = self._load_newest() if self.policy is not None else None
        if loaded is not None:
            skip_data(task, self.engine.state_dict().position.micro_steps)
            return Resume(Resumed.CHECKPOINT, loaded)
        if refill is not None:
            refill()
            return Resume(Resumed.PRETRAINED)
        return Resume(Resumed.FRESH)

    def _load_newest(self) -> Loaded | None:
        """The newest checkpoint all ranks can verify; None (and a fresh start) if there is none. One trained on
        another base than this run's is refused outright (ConfigError naming both digests): an older one would
        have been too."""
        assert self.policy is not None
        self.metrics.phase(RankPhase.RESTORING)
        t0 = time.perf_counter()
        for path in reversed(checkpoint.committed(self.policy.root)):
            try:
                saved = checkpoint.read_marker(path).get("origin")
            except (OSError, ValueError):
                saved = None  # prepare says why
            problem = base.mismatch(saved, self.policy.origin, str(path))
            if problem is not None:
                raise ConfigError(problem)
            ready = checkpoint.prepare(self.engine, path)
            problem = checkpoint.agree(self.engine, ready)
            if problem is None and not isinstance(ready, str):
                loaded = checkpoint.apply(self.engine, ready)
                seconds = time.perf_counter() - t0
                self.metrics.observe_load(loaded.step, seconds, loaded.bytes_read)
                log.warning(
                    "resumed from %s at step %d (read %d bytes, largest read %d bytes, in %.3f s)",
                    loaded.path,
                    loaded.step,
                    loaded.bytes_read,
                    loaded.largest_read_bytes,
                    seconds,
                )
                return loaded
            log.warning("checkpoint %s refused (%s); falling back to the previous one", path, problem)
        return None

    def written(self) -> bool:
        """This rank's asynchronous write in flight is on disk: its vote in the step's control all-reduce, which
        counts the ranks that say so (`after_step`'s `written`)."""
        return self._saver is not None and self._saver.written()

    def after_step(self, step: int, last_step: int, written: int, stop: bool) -> list[tuple[int, Path]]:
        """After every step: commit the asynchronous save every rank has written (`written`: how many ranks said so
        in the step's all-reduce), then save if the step is due (or the run stops); the checkpoints committed now,
        as (step, path)."""
        if self.policy is None:
            return []
        done = []
        if self._saver is not None:
            started = self._saver.inflight.started if self._saver.inflight is not None else 0.0
            job = self._committed(self._saver.commit_if_agreed(self.engine, written))
            if job is not None:
                nbytes = model_record.rank_file_bytes(job.target, self.engine.layout.rank)
                self.metrics.observe_save(job.step, time.perf_counter() - started, nbytes)
                done.append((job.step, job.target))
        if self.policy.due(step, last_step) or stop:
            saved = self._save(step, last=stop or step == last_step)
            if saved is not None:
                done.append((step, saved))
        return done

    def close(self) -> None:
        """Commit a save still in flight (a collective on every rank), so nothing written is left uncommitted."""
        if self._saver is not None:
            self._committed(self._saver.finish(self.engine))

    def _save(self, step: int, last: bool) -> Path | None:
        """Save, timed for the metrics (the bytes are this rank's own file): committed now, and its path returned,
        unless the saves are asynchronous and this is not the `last` (then it commits at a later step)."""
        assert self.policy is not None
        self.metrics.phase(RankPhase.CHECKPOINTING)
        t0 = time.perf_counter()
        if self._saver is not None and not last:
            self._saver.start(self.engine, self.policy.root, self.policy.origin)
            self.metrics.observe_blocked(time.perf_counter() - t0)
            return None
        self.close()
        saved = checkpoint.save(self.engine, self.policy.root, self.policy.origin)
        self._prune()
        seconds = time.perf_counter() - t0
        self.metrics.observe_blocked(seconds)
        self.metrics.observe_save(step, seconds, model_record.rank_file_bytes(saved, self.engine.layout.rank))
        return saved

    def _committed(self, job: InFlight | None) -> InFlight | None:
        if job is not None:
            self._prune()
        return job

    def _prune(self) -> None:
        assert self.policy is not None
        if self.engine.layout.rank == 0:
            for gone in checkpoint.prune(self.policy.root, self.policy.keep_last):
                log.info("deleted old checkpoint %s (keepLast=%d)", gone, self.policy.keep_last)


def skip_data(task: HasBatches, micro_batches: int) -> None:
    """Put the task's batch iterator at micro-batch `micro_batches` (every rank consumed the same count)."""
    loader = getattr(task.batches, "load_state_dict", None)
    if callable(loader):
        loader({"micro_batches": micro_batches})
        return
    # Batches a task yields in a fixed order for its seed are reproduced by drawing them again.
    for _ in range(micro_batches):
        next(task.batches, None)
