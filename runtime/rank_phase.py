"""What a rank is doing, in one enum every room reports to (the metrics export it): the checkpointer's saves and
restores as much as the training loop's phases."""

from __future__ import annotations

from enum import Enum


class RankPhase(str, Enum):
    """What the rank is doing; exported as `zerotrain_phase{phase=...}` (1 for the current one, 0 for the rest)."""

    STARTING = "starting"
    CONSTRUCTING = "constructing"
    """Building the model and filling its units with their starting values (construction, pretrained weights)."""
    RESTORING = "restoring"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    CHECKPOINTING = "checkpointing"
    EVALUATING = "evaluating"
    """Forward-only on the held-out micro-batches (spec.training.evaluation)."""
    FINISHED = "finished"
