"""Forward-only evaluation between steps (`spec.training.evaluation`).

Every rank runs the first `batches` of its task's evaluation micro-batches through the engine in eval mode under
`torch.no_grad()` (stage 3 gathers and frees each unit as in a training forward; nothing is reduced), then one
all-reduce of (sum of losses, count) gives the mean over every rank's micro-batches. Each micro-batch's loss is the
task's own mean over it and every rank holds the same number of rows, so this is the mean over the evaluation
samples (over tokens too, when every row has the same number of counted tokens, as token files give). A task whose
loss is a `LossSum` is averaged over every counted token of every rank instead, whatever each micro-batch counts.

It changes nothing of the training: the model goes back to train mode, and the random generators (torch's CPU and
CUDA ones, which dropout or a model's own sampling would draw from) are put back as they were, so a run with
evaluation trains bit-identically to one without.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from zerotrain.runtime.job.task import ConfigError, LossSum, TrainingTask, call_model
from zerotrain.spec import EvaluationSpec

if TYPE_CHECKING:
    from zerotrain.runtime.zero.engine import ZeroEngine


@dataclass(frozen=True)
class Evaluation:
    """One evaluation's result, the same on every rank."""

    step: int
    """The optimizer step it followed."""
    loss: float
    """Mean loss over every rank's evaluation micro-batches."""
    batches: int
    """Micro-batches each rank ran."""
    seconds: float
    """Wall time of the evaluation on this rank."""


def check_task(task: TrainingTask, evaluation: EvaluationSpec | None, entrypoint: str) -> None:
    """Refuse, before the first step, a manifest asking for evaluation of a task that has no evaluation data."""
    if evaluation is not None and task.eval_batches is None:
        raise ConfigError(
            f"spec.training.evaluation: set, but {entrypoint} returned a TrainingTask without eval_batches; "
            "return eval_batches (a callable giving a fresh iterator over this rank's held-out micro-batches; the "
            "built-in GPT holds text out with entrypointArgs.eval_bytes, the Hugging Face entry point reads "
            "entrypointArgs.eval), or drop spec.training.evaluation"
        )


def too_few(wanted: int, held: int, batches: object = None) -> ConfigError:
    """The refusal of evaluation asking for more micro-batches than the data holds (the launcher's and the ranks'),
    saying why in the data's terms when `batches` (the task's evaluation batches) can (`describe()`)."""
    describe = getattr(batches, "describe", None)
    why = f": {describe()}" if callable(describe) else ""
    ask = f"ask for at most {held}, " if held else "drop spec.training.evaluation, "
    return ConfigError(
        f"spec.training.evaluation.batches: got {wanted}, but the task's evaluation data holds only {held} "
        f"micro-batches per rank{why}; {ask}or give the task more evaluation data (hold out more with `zerotrain "
        "data prepare --val-fraction`, or lower entrypointArgs.batch_size)"
    )


def due(evaluation: EvaluationSpec | None, step: int, steps: int) -> bool:
    """Whether step `step` of `steps` is followed by an evaluation."""
    return evaluation is not None and (step % evaluation.every_steps == 0 or step == steps)


@contextmanager
def _untouched(engine: ZeroEngine) -> Iterator[None]:
    """Eval mode and no_grad inside; the training mode and every random generator as they were after."""
    was_training = engine.module.training
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    engine.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        engine.train(was_training)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def evaluate(
    engine: ZeroEngine, task: TrainingTask, evaluation: EvaluationSpec, step: int, device: torch.device
) -> Evaluation:
    """Run `evaluation.batches` of this rank's evaluation micro-batches; every rank must call it at the same step."""
    from zerotrain.runtime.job.train import to_device  # the loop imports this module

    assert task.eval_batches is not None, "check_task refuses a task without eval_batches"
    start = time.perf_counter()
    # (sum of losses, what they average over: micro-batches, or the counted tokens of summed losses, micro-batches)
    total = torch.zeros(3, dtype=torch.float64, device=device)
    with _untouched(engine):
        for batch in itertools.islice(task.eval_batches(), evaluation.batches):
            batch = to_device(batch, device)
            loss = task.loss(call_model(engine, task.inputs(batch)), batch)
            if isinstance(loss, LossSum):
                total[0] += loss.total.detach().double()
                total[1] += torch.as_tensor(loss.count, dtype=torch.float64, device=device)
            else:
                total[0] += loss.detach().double()
                total[1] += 1
            total[2] += 1
    ran = int(total[2].item())
    if ran < evaluation.batches:  # every rank holds the same number of micro-batches, so all refuse together
        raise too_few(evaluation.batches, ran, task.eval_batches)
    engine.comm.all_reduce(total, "evaluation", label="evaluation")
    mean = float(total[0] / total[1]) if total[1] > 0 else 0.0
    return Evaluation(step, mean, ran, time.perf_counter() - start)
