"""One rank's training loop (the rank process that runs it is `rank`).

The rank builds the job's TrainingTask, wraps the model in a ZeroEngine and runs `spec.training.steps` optimizer
steps, each over `spec.zero.gradientAccumulationSteps` micro-batches (`engine(...)`, `engine.backward(loss)` per
micro-batch, then one `engine.step()`, which applies the update at that accumulation boundary).

Outputs (rank 0):
- progress: one JSON object per logged step (`step`, `steps`, `loss`, `grad_norm`, `tokens_per_s`,
  `elapsed_s`), appended to $ZEROTRAIN_PROGRESS_FILE, or printed to stdout when it is unset (pod logs).
  `loss` is rank 0's mean over its micro-batches of the step: no extra collective on the hot path.
- summary: at the end every rank's memory_report() and comm_report(), gathered to rank 0, written as one JSON
  object to $ZEROTRAIN_SUMMARY_FILE (or printed to stdout).

"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zerotrain.goodput import GoodputSeconds
from zerotrain.lr_schedule import learning_rate
from zerotrain.pod_contract import PROGRESS_ENV, SUMMARY_ENV
from zerotrain.runtime.checkpoints.checkpointer import Checkpointer
from zerotrain.runtime.job import evaluation, out_of_memory
from zerotrain.runtime.job.host_memory import returned_while_starting, training_threshold
from zerotrain.runtime.job.model_start import Built, EngineFactory, StartProgress, gathered_unit_bytes, start_engine
from zerotrain.runtime.job.preemption import NoPreemption, Preempted, Preemption, StopRequests
from zerotrain.runtime.job.progress import NoProgress, ProgressLog, ProgressSink, throughput
from zerotrain.runtime.job.rank_metrics import MetricsSink, NoMetrics, RankMetrics, StepValues
from zerotrain.runtime.job.reports import gather_reports, summary_record
from zerotrain.runtime.job.spec_bindings import device_for
from zerotrain.runtime.job.step_split import Phase
from zerotrain.runtime.job.step_watch import StepWatch
from zerotrain.runtime.job.task import ConfigError, LossSum, TrainingTask, call_model, is_script
from zerotrain.runtime.rank_phase import RankPhase
from zerotrain.runtime.zero.process_group import init_from_env
from zerotrain.spec import ZeroTrainingJobSpec

if TYPE_CHECKING:
    from zerotrain.runtime.zero.engine import ZeroEngine
    from zerotrain.runtime.zero.engine_state import StepResult

logger = logging.getLogger(__name__)


def to_device(batch: Any, device: torch.device) -> Any:
    """Move the tensors of a (nested tuple/list/dict) batch to `device`. Host tensors bound for a GPU are pinned
    first: a `non_blocking` copy from pageable memory is synchronous, so the host would wait for it."""
    if isinstance(batch, torch.Tensor):
        if device.type == "cuda" and batch.device.type == "cpu" and not batch.is_pinned():
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


@dataclass
class RankContext:
    """Where this rank stands in the job (from the torchrun environment)."""

    rank: int
    """Global rank (RANK)."""
    world_size: int
    """Total ranks (WORLD_SIZE)."""
    local_rank: int
    """Rank within this node (LOCAL_RANK): the GPU it drives."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankContext:
        e = os.environ if env is None else env
        try:
            return cls(int(e["RANK"]), int(e["WORLD_SIZE"]), int(e.get("LOCAL_RANK", "0")))
        except (KeyError, ValueError) as err:
            raise ConfigError(
                f"environment: RANK/WORLD_SIZE missing or not integers ({err}); start ranks through "
                "`python -m zerotrain.runtime` or `zerotrain run`, which set them"
            ) from None


@dataclass
class TrainResult:
    """What one rank's loop produced."""

    losses: list[float] = field(default_factory=list)
    """Every step's loss: the mean over micro-batches and ranks, i.e. over the global batch at any world size (over
    its counted tokens, when the task's loss is a `LossSum`)."""
    grad_norms: list[float] = field(default_factory=list)
    """Global gradient norm of every step, as the engine returned it."""
    learning_rates: list[float] = field(default_factory=list)
    """The learning rate every step trained at."""
    elapsed_s: float = 0.0
    """Wall time of the loop."""
    tokens: int = 0
    """Tokens all ranks processed together (0 when the task reports none)."""
    samples: int = 0
    """Samples all ranks processed together (0 when the task reports none)."""
    steps: int = 0
    """Steps this run took (after any it resumed past)."""
    first_step: int = 1
    """The first step this run took: 1, or the one after the checkpoint it resumed from."""
    skipped_steps: int = 0
    """fp16 steps skipped because gradients overflowed."""
    last_log: dict[str, Any] = field(default_factory=dict)
    """The progress record of the latest step."""
    evaluations: list[evaluation.Evaluation] = field(default_factory=list)
    """Every evaluation this run made (spec.training.evaluation), in step order."""
    eval_seconds: float = 0.0
    """Seconds those evaluations took: left out of the throughput, which is the training's."""
    train_seconds: float = 0.0
    """Seconds of the loop up to the latest step, evaluations left out: what the throughput is over."""
    goodput: GoodputSeconds | None = None
    """The run's time from its launcher's start by goodput bucket, read when its summary is written."""
    stragglers: list[dict[str, object]] = field(default_factory=list)
    """Every rank named a straggler: rank, cause, from step, to step (`StepWatch.stragglers`)."""


@dataclass
class Trainer:
    """One rank's training loop and the helpers it reports to, each defaulting to one that does nothing: the
    progress (rank 0's `ProgressLog`), the metrics, the stop signals, the checkpoints (none saved by default)."""

    engine: ZeroEngine
    task: TrainingTask
    spec: ZeroTrainingJobSpec
    ctx: RankContext
    device: torch.device
    log: ProgressSink = field(default_factory=NoProgress)
    checkpointer: Checkpointer | None = None
    """Resumes and saves (None: one under no policy, which saves nothing: spec.checkpoint.path unset)."""
    metrics: MetricsSink = field(default_factory=NoMetrics)
    preemption: StopRequests = field(default_factory=NoPreemption)
    watch: StepWatch = field(init=False)
    """Each step's split by phase, and the gang's stragglers (made by `run`)."""

    def run(self, first_step: int = 1) -> TrainResult:
        """The loop from `first_step`: accumulate micro-batches, step, checkpoint, log from rank 0, metrics.

        Raises Preempted after the step at which any rank got SIGTERM or SIGINT, once that step's checkpoint is
        committed."""
        spec, engine = self.spec, self.engine
        checkpointer = self.checkpointer or Checkpointer(engine, None, self.metrics)
        steps = spec.training.steps
        result = TrainResult(first_step=first_step)
        self.watch = StepWatch(engine, spec.stragglers, self.device, self.metrics, self.log)
        start = time.perf_counter()
        for step in range(first_step, steps + 1):
            step_start = time.perf_counter()
            self.watch.begin()
            set_learning_rate(engine, spec, step)
            self.micro_batches(step)
            self.metrics.phase(RankPhase.OPTIMIZER)
            logged = step % spec.training.log_every == 0 or step in (1, steps)
            # The loss mean, the stop vote (every rank stops after the same step) and the norm ride the step's one
            # control all-reduce; the norm is computed only for the steps that are logged (or clipped).
            written = checkpointer.written()
            outcome = engine.step(vote=self.preemption.requested, report_grad_norm=logged, written=written)
            stepped(outcome, step, spec.zero.gradient_accumulation_steps)
            stop = outcome.votes > 0
            saved = None
            with self.watch.timing(Phase.CHECKPOINT):
                committed = checkpointer.after_step(step, steps, outcome.written, stop)
            for at, path in committed:
                self.watch.committed(at)
                self.log.checkpoint(at, str(path))
                saved = path if at == step else saved
            self.record(result, step, outcome, time.perf_counter() - step_start)
            elapsed = time.perf_counter() - start
            result.train_seconds = elapsed - result.eval_seconds
            if logged:
                # The bar shows the run's throughput so far: at the last step, the summary's figure exactly.
                so_far = throughput(result.tokens, result.samples, result.steps, result.train_seconds)
                self.log.write({**result.last_log, "elapsed_s": elapsed, **so_far})
            if not stop and evaluation.due(spec.training.evaluation, step, steps):
                with self.watch.timing(Phase.EVALUATION):
                    self.evaluate(result, step)
            self.watch.end(step)
            if stop:
                result.elapsed_s = time.perf_counter() - start
                where = None if saved is None else str(saved)
                self.log.stopped(step, where, self.preemption.cause)
                raise Preempted(step, where, self.preemption.elapsed(), self.preemption.cause)
        checkpointer.close()
        result.elapsed_s = time.perf_counter() - start
        return result

    def micro_batches(self, step: int) -> None:
        """Forward and backward of one optimizer step's micro-batches (the engine keeps their losses for the
        step)."""
        for _ in range(self.spec.zero.gradient_accumulation_steps):
            self.metrics.phase(RankPhase.FORWARD)
            try:
                with self.watch.timing(Phase.DATA_WAIT):
                    batch = to_device(next(self.task.batches), self.device)
            except StopIteration:
                raise ConfigError(
                    f"spec.training.steps: got {self.spec.training.steps}, but the entry point's batches ran out at "
                    f"step {step}; give it more data or train fewer steps"
                ) from None
            output = call_model(self.engine, self.task.inputs(batch))
            loss = self.task.loss(output, batch)
            self.metrics.phase(RankPhase.BACKWARD)
            if isinstance(loss, LossSum):
                # Sum and count over one fixed figure: the gradients keep a mean's magnitude (fp16's loss scale).
                per = max(1, self.task.tokens_per_batch)
                self.engine.backward(loss.total / per, tokens=loss.count / per)
            else:
                self.engine.backward(loss)

    def evaluate(self, result: TrainResult, step: int) -> None:
        """The evaluation after `step`, into the result, the metrics and the progress record (rank 0)."""
        assert self.spec.training.evaluation is not None
        self.metrics.phase(RankPhase.EVALUATING)
        done = evaluation.evaluate(self.engine, self.task, self.spec.training.evaluation, step, self.device)
        result.evaluations.append(done)
        result.eval_seconds += done.seconds
        self.metrics.observe_evaluation(done.step, done.loss)
        self.log.evaluation(done.step, done.loss, done.seconds)

    def record(self, result: TrainResult, step: int, outcome: StepResult, step_s: float) -> None:
        """One finished step into the result, the metrics and the progress record."""
        assert outcome.loss is not None  # stepped() said so
        per_rank = self.spec.zero.gradient_accumulation_steps
        grad_norm = outcome.grad_norm if outcome.grad_norm is not None else float("nan")  # the record's lists
        step_tokens = self.task.tokens_per_batch * per_rank * self.ctx.world_size
        step_samples = self.task.samples_per_batch * per_rank * self.ctx.world_size
        lr = float(self.engine.optimizer.param_groups[0]["lr"])
        values = StepValues(
            step=step,
            seconds=step_s,
            loss=outcome.loss,
            grad_norm=outcome.grad_norm,
            learning_rate=lr,
            loss_scale=float(outcome.loss_scale),
            applied=bool(outcome.applied),
            skipped=bool(outcome.overflow),
            tokens=self.task.tokens_per_batch * per_rank,
        )
        self.metrics.observe_step(self.engine, values)
        result.losses.append(outcome.loss)
        result.grad_norms.append(grad_norm)
        result.learning_rates.append(lr)
        result.tokens += step_tokens
        result.samples += step_samples
        result.steps += 1
        result.skipped_steps += int(outcome.overflow)
        result.last_log = {
            "step": step,
            "steps": self.spec.training.steps,
            "loss": outcome.loss,
            "grad_norm": grad_norm,
            "skipped": bool(outcome.overflow),
            "lr": lr,
            "tokens_per_s": step_tokens / step_s if step_tokens and step_s > 0 else None,
            **throughput(step_tokens, step_samples, 1, step_s),
        }


def stepped(outcome: StepResult, step: int, accumulation: int) -> None:
    """The engine applied (or, fp16, skipped) an update at this step's last micro-batch, as the loop counts them."""
    if outcome.loss is None or (not outcome.applied and not outcome.overflow):
        raise RuntimeError(
            f"step {step}: the engine did not step after {accumulation} micro-batches; its accumulation "
            "boundary disagrees with spec.zero.gradientAccumulationSteps"
        )


def set_learning_rate(engine: ZeroEngine, spec: ZeroTrainingJobSpec, step: int) -> None:
    """The schedule's rate for `step` on every param group (left as the optimizer and checkpoints have it without
    spec.training.lrSchedule)."""
    if spec.training.lr_schedule is None:
        return
    lr = learning_rate(spec.training, step)
    for group in engine.optimizer.param_groups:
        group["lr"] = lr


def train(
    spec: ZeroTrainingJobSpec,
    ctx: RankContext,
    engine_factory: EngineFactory | None = None,
    metrics: RankMetrics | None = None,
    preemption: Preemption | None = None,
) -> TrainResult:
    """Run the job's training on this rank (the process group must be initialised), feeding `metrics`.

    With `preemption`, SIGTERM ends the run early with Preempted (see `preemption`)."""
    if is_script(spec.entrypoint):
        raise ConfigError(f"spec.entrypoint: {spec.entrypoint!r} is a script; the launcher runs scripts directly")
    if engine_factory is None:
        from zerotrain.runtime.zero.engine import ZeroEngine

        engine_factory = ZeroEngine
    torch.manual_seed(spec.training.seed)
    device = device_for(spec, ctx.local_rank)
    init_from_env(spec.zero.collective_timeout_seconds, device)  # the partitioned construction slices over it
    log: ProgressSink = ProgressLog(os.environ.get(PROGRESS_ENV)) if ctx.rank == 0 else NoProgress()
    sink: MetricsSink = metrics if metrics is not None else NoMetrics()
    progress = StartProgress()
    try:
        with returned_while_starting() as threshold:  # freed weights go back to the system, not the heap
            built = start_engine(spec, ctx, device, engine_factory, sink, log, progress)
            limited = spec.resources.memory is not None
            threshold.training = training_threshold(gathered_unit_bytes(built.engine), limited)
        trainer = Trainer(
            built.engine,
            built.task,
            built.spec,
            ctx,
            device,
            log,
            built.checkpointer,
            sink,
            preemption or NoPreemption(),
        )
        return _train(trainer, built)
    except (MemoryError, RuntimeError) as e:  # torch.OutOfMemoryError is a RuntimeError
        if not out_of_memory.is_allocation_failure(e):
            raise
        account = out_of_memory.account(e, ctx.rank, metrics, progress.engine, progress.built_whole)
        raise out_of_memory.RankOutOfMemory(account) from e
    finally:
        log.close()


def _train(trainer: Trainer, built: Built) -> TrainResult:
    """The loop from where the checkpoint loaded (if any) left off, then every rank's report to rank 0's summary."""
    evaluation.check_task(trainer.task, trainer.spec.training.evaluation, trainer.spec.entrypoint)
    result = trainer.run(first_step=built.resumed.first_step)
    trainer.metrics.phase(RankPhase.FINISHED)
    ranks = gather_reports(trainer.engine, trainer.ctx, trainer.device)
    result.goodput = trainer.watch.time.split()
    result.stragglers = trainer.watch.stragglers()
    if ranks is not None:
        record = json.dumps(summary_record(trainer.spec, trainer.ctx, result, ranks))
        path = os.environ.get(SUMMARY_ENV)
        if path:
            Path(path).write_text(record + "\n")
        else:
            print(record, flush=True)
    return result
