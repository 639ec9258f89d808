"""When a training run saves checkpoints and where it resumes from: the policy over `checkpoint`'s mechanics.

A pod gang restarted by the operator (or `zerotrain run --checkpoint-dir` run again) resumes from the
newest committed checkpoint that every rank can verify. A corrupt one is refused with a warning naming
it and why, and the previous good one is used: no rank ever loads a checkpoint another rank refused.
Data resumes at the saved micro-batch: through the task's own `load_state_dict` when its batch iterator has
one (O(1)), else by drawing and dropping the consumed micro-batches.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerotrain.errors import ConfigError
from zerotrain.runtime.checkpoints import base, checkpoint
from zerotrain.runtime.checkpoints.async_save import AsyncSaver, InFlight, check_directory_fsync
from zerotrain.runtime.job.rank_metrics import MetricsSink, RankPhase
from zerotrain.spec import CheckpointSpec

if TYPE_CHECKING:
    from zerotrain.runtime.job.task import TrainingTask
    from zerotrain.runtime.zero.engine import ZeroEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointPolicy:
    """Save every `interval` steps and at the end under `root`, keeping the newest `keep_last`; with `saver`, the
    interval saves are asynchronous (`async_save`)."""

    root: Path
    interval: int
    keep_last: int
    saver: AsyncSaver | None = None
    origin: dict[str, Any] = field(default_factory=dict)
    """Where the model's weights first came from (`{"pretrained": path}`) and the frozen base the checkpoints refer
    to (`checkpoints.base`), recorded in every marker."""

    @classmethod
    def from_spec(cls, spec: CheckpointSpec, origin: dict[str, Any] | None = None) -> CheckpointPolicy | None:
        """The policy for this run, or None when spec.checkpoint.path is unset (a throw-away local run)."""
        if not spec.path:
            return None
        root = Path(spec.path)
        saver = None
        if spec.async_save:
            check_directory_fsync(root)
            saver = AsyncSaver()
        return cls(root, spec.interval_steps, spec.keep_last, saver, origin or {})

    def due(self, step: int, last_step: int) -> bool:
        return step % self.interval == 0 or step == last_step

    def save(self, engine: ZeroEngine) -> Path:
        """Save and commit on every rank (a save in flight is committed first); rank 0 then prunes."""
        if self.saver is not None:
            self.committed(engine, self.saver.finish(engine))
        path = checkpoint.save(engine, self.root, self.origin)
        self.pruned(engine)
        return path

    def pruned(self, engine: ZeroEngine) -> None:
        if engine.rank == 0:
            for gone in checkpoint.prune(self.root, self.keep_last):
                log.info("deleted old checkpoint %s (keepLast=%d)", gone, self.keep_last)

    def committed(self, engine: ZeroEngine, job: InFlight | None) -> InFlight | None:
        if job is not None:
            self.pruned(engine)
        return job

    def resume_newest(self, engine: ZeroEngine) -> checkpoint.Loaded | None:
        """Load the newest checkpoint all ranks can verify; None (and a fresh start) if there is none. One trained on
        another base than this run's is refused outright (ConfigError naming both digests): an older one would
        have been too."""
        for path in reversed(checkpoint.committed(self.root)):
            try:
                saved = checkpoint.read_marker(path).get("origin")
            except (OSError, ValueError):
                saved = None  # prepare says why
            problem = base.mismatch(saved, self.origin, str(path))
            if problem is not None:
                raise ConfigError(problem)
            ready = checkpoint.prepare(engine, path)
            problem = checkpoint.agree(engine, ready)
            if problem is None and not isinstance(ready, str):
                return checkpoint.apply(engine, ready)
            log.warning("checkpoint %s refused (%s); falling back to the previous one", path, problem)
        return None


def save_checkpoint(
    engine: ZeroEngine, policy: CheckpointPolicy, step: int, metrics: MetricsSink, last: bool = True
) -> Path | None:
    """Save, timed for the metrics (the bytes are this rank's own file): committed now, and its path returned, unless
    the policy is asynchronous and this is not the `last` save (then it commits at a later step: `settle`)."""
    metrics.phase(RankPhase.CHECKPOINTING)
    t0 = time.perf_counter()
    if policy.saver is not None and not last:
        policy.saver.start(engine, policy.root, policy.origin)
        metrics.observe_blocked(time.perf_counter() - t0)
        return None
    saved = policy.save(engine)
    seconds = time.perf_counter() - t0
    metrics.observe_blocked(seconds)
    metrics.observe_save(step, seconds, checkpoint.rank_file_bytes(saved, engine.rank))
    return saved


def settle(engine: ZeroEngine, policy: CheckpointPolicy | None, written: int, metrics: MetricsSink) -> Path | None:
    """After a step: commit the asynchronous save in flight when every rank's write is done (`written`, counted by
    the step's control all-reduce); its path, if it committed now."""
    if policy is None or policy.saver is None:
        return None
    started = policy.saver.inflight.started if policy.saver.inflight is not None else 0.0
    job = policy.committed(engine, policy.saver.commit_if_agreed(engine, written))
    if job is None:
        return None
    nbytes = checkpoint.rank_file_bytes(job.target, engine.rank)
    metrics.observe_save(job.step, time.perf_counter() - started, nbytes)
    return job.target


def skip_data(task: TrainingTask, micro_batches: int) -> None:
    """Put the task's batch iterator at micro-batch `micro_batches` (every rank consumed the same count)."""
    loader = getattr(task.batches, "load_state_dict", None)
    if callable(loader):
        loader({"micro_batches": micro_batches})
        return
    # Batches a task yields in a fixed order for its seed are reproduced by drawing them again.
    for _ in range(micro_batches):
        next(task.batches, None)


def resume(
    engine: ZeroEngine, task: TrainingTask, policy: CheckpointPolicy | None, metrics: MetricsSink
) -> checkpoint.Loaded | None:
    """Load the newest good checkpoint and move the data to where it stopped; what was loaded, if anything."""
    if policy is None:
        return None
    metrics.phase(RankPhase.RESTORING)
    t0 = time.perf_counter()
    loaded = policy.resume_newest(engine)
    if loaded is None:
        return None
    metrics.observe_load(loaded.step, time.perf_counter() - t0, loaded.bytes_read)
    # A checkpoint ends a step; in a gang of another size (spec.elastic) a step holds another count of micro-batches.
    engine.restore_counters(engine.steps, loaded.step * engine.config.gradient_accumulation_steps)
    skip_data(task, engine.micro_steps)
    log.warning(
        "resumed from %s at step %d (read %d bytes, largest read %d bytes)",
        loaded.path,
        loaded.step,
        loaded.bytes_read,
        loaded.largest_read_bytes,
    )
    return loaded
