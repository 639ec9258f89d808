"""When a training run saves checkpoints and where it resumes from: the policy over `checkpoint`'s mechanics.

A pod gang restarted by the operator (or `zerotrain run --checkpoint-dir` run again) resumes from the
newest committed checkpoint that every rank can verify. A corrupt one is refused with a warning naming
it and why, and the previous good one is used: no rank ever loads a checkpoint another rank refused.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from zerotrain.runtime import checkpoint
from zerotrain.spec import CheckpointSpec

if TYPE_CHECKING:
    from zerotrain.runtime.engine import ZeroEngine

log = logging.getLogger(__name__)

# Set by the operator in every pod (the mounted checkpoint volume) and by `zerotrain run --checkpoint-dir`.
CHECKPOINT_DIR_ENV = "ZEROTRAIN_CHECKPOINT_DIR"


@dataclass(frozen=True)
class CheckpointPolicy:
    """Save every `interval` steps and at the end under `root`, keeping the newest `keep_last`."""

    root: Path
    interval: int
    keep_last: int

    @classmethod
    def from_env(cls, spec: CheckpointSpec) -> CheckpointPolicy | None:
        """The policy for this run, or None when no checkpoint directory is given (a throw-away local run)."""
        root = os.environ.get(CHECKPOINT_DIR_ENV)
        if not root:
            return None
        return cls(Path(root), spec.interval_steps, spec.keep_last)

    def due(self, step: int, last_step: int) -> bool:
        return step % self.interval == 0 or step == last_step

    def save(self, engine: ZeroEngine) -> Path:
        """Save and commit on every rank; rank 0 then prunes older checkpoints."""
        path = checkpoint.save(engine, self.root)
        if engine.rank == 0:
            for gone in checkpoint.prune(self.root, self.keep_last):
                log.info("deleted old checkpoint %s (keepLast=%d)", gone, self.keep_last)
        return path

    def resume_newest(self, engine: ZeroEngine) -> tuple[Path, int] | None:
        """Load the newest checkpoint all ranks can verify: its path and the bytes this rank read; None (and a
        fresh start) if there is none."""
        for path in reversed(checkpoint.committed(self.root)):
            problem = checkpoint.check(engine, path)
            refusals = torch.tensor([0.0 if problem is None else 1.0], device=engine.units[0].master.device)
            engine.comm.all_reduce(refusals, "<checkpoint>")
            if refusals.item() == 0:
                return path, engine.load_checkpoint(path)
            log.warning(
                "checkpoint %s refused (%s); falling back to the previous one",
                path,
                problem or f"{int(refusals.item())} other rank(s) could not verify their files",
            )
        return None
