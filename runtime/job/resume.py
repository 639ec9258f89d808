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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from zerotrain.runtime.checkpoints import checkpoint
from zerotrain.runtime.job.rank_metrics import RankMetrics, RankPhase
from zerotrain.spec import CheckpointSpec

if TYPE_CHECKING:
    from zerotrain.runtime.job.task import TrainingTask
    from zerotrain.runtime.zero.engine import ZeroEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointPolicy:
    """Save every `interval` steps and at the end under `root`, keeping the newest `keep_last`."""

    root: Path
    interval: int
    keep_last: int

    @classmethod
    def from_spec(cls, spec: CheckpointSpec) -> CheckpointPolicy | None:
        """The policy for this run, or None when spec.checkpoint.path is unset (a throw-away local run)."""
        if not spec.path:
            return None
        return cls(Path(spec.path), spec.interval_steps, spec.keep_last)

    def due(self, step: int, last_step: int) -> bool:
        return step % self.interval == 0 or step == last_step

    def save(self, engine: ZeroEngine) -> Path:
        """Save and commit on every rank; rank 0 then prunes older checkpoints."""
        path = checkpoint.save(engine, self.root)
        if engine.rank == 0:
            for gone in checkpoint.prune(self.root, self.keep_last):
                log.info("deleted old checkpoint %s (keepLast=%d)", gone, self.keep_last)
        return path

    def resume_newest(self, engine: ZeroEngine) -> checkpoint.Loaded | None:
        """Load the newest checkpoint all ranks can verify; None (and a fresh start) if there is none."""
        for path in reversed(checkpoint.committed(self.root)):
            ready = checkpoint.prepare(engine, path)
            problem = checkpoint.agree(engine, ready)
            if problem is None and not isinstance(ready, str):
                return checkpoint.apply(engine, ready)
            log.warning("checkpoint %s refused (%s); falling back to the previous one", path, problem)
        return None


def save_checkpoint(engine: ZeroEngine, policy: CheckpointPolicy, step: int, metrics: RankMetrics | None) -> Path:
    """Save and commit, timed for the metrics (the bytes are this rank's own file)."""
    if metrics is not None:
        metrics.phase(RankPhase.CHECKPOINTING)
    t0 = time.perf_counter()
    saved = policy.save(engine)
    if metrics is not None:
        metrics.observe_save(step, time.perf_counter() - t0, checkpoint.rank_file_bytes(saved, engine.rank))
    return saved


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
    engine: ZeroEngine, task: TrainingTask, policy: CheckpointPolicy | None, metrics: RankMetrics | None = None
) -> checkpoint.Loaded | None:
    """Load the newest good checkpoint and move the data to where it stopped; what was loaded, if anything."""
    if policy is None:
        return None
    if metrics is not None:
        metrics.phase(RankPhase.RESTORING)
    t0 = time.perf_counter()
    loaded = policy.resume_newest(engine)
    if loaded is None:
        return None
    if metrics is not None:
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
