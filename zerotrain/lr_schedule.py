"""The learning rate of a step (`spec.training.lrSchedule`): a pure function of the step, so a run resumed from a
checkpoint (which holds its step), at any world size or after an elastic resize, trains every step at the rate an
uninterrupted run would.

The semantics are `transformers`' `get_cosine_with_min_lr_schedule_with_warmup` (and its linear and constant
siblings) with one difference, stated: step t here takes the factor transformers' LambdaLR reaches after t scheduler
steps, so the first step of a warm-up trains at lr/warmupSteps, not at 0 (torchtitan shifts its warm-up for the same
reason).
"""

from __future__ import annotations

import math

from zerotrain.spec import LrDecay, LrSchedule, TrainingSpec


def lr_factor(schedule: LrSchedule, step: int, steps: int) -> float:
    """The multiple of optimizer.lr that step `step` (1-based) of a `steps`-step run trains at."""
    warmup = schedule.warmup_steps
    if step <= warmup:
        return step / warmup
    if schedule.decay is LrDecay.CONSTANT:
        return 1.0
    decay_steps = schedule.decay_steps if schedule.decay_steps is not None else max(1, steps - warmup)
    progress = min((step - warmup) / decay_steps, 1.0)
    falling = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule.decay is LrDecay.COSINE else 1.0 - progress
    return schedule.min_lr_ratio + (1.0 - schedule.min_lr_ratio) * falling


def learning_rate(training: TrainingSpec, step: int) -> float:
    """The learning rate of step `step`: optimizer.lr, times the schedule's factor when there is one."""
    lr = training.optimizer.lr
    if training.lr_schedule is None:
        return lr
    return lr * lr_factor(training.lr_schedule, step, training.steps)
