"""One rank's training loop: `python -m zerotrain.runtime.train --config JOB.yaml`, started by the launcher.

The rank reads the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), builds the
job's TrainingTask, wraps the model in a ZeroEngine and runs `spec.training.steps` optimizer steps, each over
`spec.zero.gradientAccumulationSteps` micro-batches (`engine(...)`, `engine.backward(loss)` per micro-batch, then
one `engine.step()`, which applies the update at that accumulation boundary).

Outputs (rank 0):
- progress: one JSON object per logged step (`step`, `steps`, `loss`, `grad_norm`, `tokens_per_s`,
  `elapsed_s`), appended to $ZEROTRAIN_PROGRESS_FILE, or printed to stdout when it is unset (pod logs).
  `loss` is rank 0's mean over its micro-batches of the step: no extra collective on the hot path.
- summary: at the end every rank's memory_report() and comm_report(), gathered to rank 0, written as one JSON
  object to $ZEROTRAIN_SUMMARY_FILE (or printed to stdout).

Exit status: 0 done, 2 the configuration cannot run (message names the field, the value and the fix).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from zerotrain.errors import EXIT_BAD_INPUT, UserError
from zerotrain.runtime.checkpoint import rank_file_bytes
from zerotrain.runtime.launch import PROGRESS_ENV, SUMMARY_ENV, write_failure_record
from zerotrain.runtime.metrics import Phase, RankMetrics, StepValues, metrics_endpoint
from zerotrain.runtime.progress import ProgressLog
from zerotrain.runtime.resume import CheckpointPolicy
from zerotrain.runtime.task import ConfigError, TrainingTask, build_task, is_script
from zerotrain.spec import OptimizerName, OptimizerSpec, ZeroTrainingJobSpec

logger = logging.getLogger(__name__)

OptimizerFactory = Callable[[list[dict[str, Any]]], torch.optim.Optimizer]
EngineFactory = Callable[..., Any]


def optimizer_factory(opt: OptimizerSpec) -> OptimizerFactory:
    """spec.training.optimizer as the `optimizer=` callable the engine applies to its shard's param groups."""
    if opt.name == OptimizerName.ADAMW:
        return lambda groups: torch.optim.AdamW(
            groups, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay
        )
    if opt.name == OptimizerName.ADAM:
        return lambda groups: torch.optim.Adam(
            groups, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay
        )
    if opt.name == OptimizerName.SGD:
        return lambda groups: torch.optim.SGD(groups, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
    raise ConfigError(f"spec.training.optimizer.name: got {opt.name!r}; use one of {[o.value for o in OptimizerName]}")


def device_for(local_rank: int) -> torch.device:
    """One GPU per rank when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def to_device(batch: Any, device: torch.device) -> Any:
    """Move the tensors of a (nested tuple/list/dict) batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def to_jsonable(value: Any) -> Any:
    """A report (pydantic model, dataclass, enum-keyed mapping, tensor...) as plain JSON values."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(getattr(k, "value", k)): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Enum):
        return value.value
    return value


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
    """Every step's loss: the mean over micro-batches and ranks, i.e. over the global batch at any world size."""
    grad_norms: list[float] = field(default_factory=list)
    """Global gradient norm of every step, as the engine returned it."""
    elapsed_s: float = 0.0
    """Wall time of the loop."""
    tokens: int = 0
    """Tokens all ranks processed together."""
    skipped_steps: int = 0
    """fp16 steps skipped because gradients overflowed."""


def make_engine(task: TrainingTask, spec: ZeroTrainingJobSpec, device: torch.device, factory: EngineFactory) -> Any:
    """ZeroConfig from spec.zero, unit modules defaulting to the task's, optimizer from spec.training."""
    zero = spec.zero
    if not zero.unit_modules and task.unit_modules:
        zero = zero.model_copy(update={"unit_modules": list(task.unit_modules)})
    return factory(task.model.to(device), zero, optimizer=optimizer_factory(spec.training.optimizer))


def run_micro_batches(
    engine: Any,
    task: TrainingTask,
    device: torch.device,
    accumulation: int,
    step: int,
    steps: int,
    metrics: RankMetrics | None = None,
) -> list[torch.Tensor]:
    """Forward and backward of one optimizer step's micro-batches; their detached losses."""
    losses = []
    for _ in range(accumulation):
        if metrics is not None:
            metrics.phase(Phase.FORWARD)
        try:
            batch = to_device(next(task.batches), device)
        except StopIteration:
            raise ConfigError(
                f"spec.training.steps: got {steps}, but the entry point's batches ran out at step {step}; "
                "give it more data or train fewer steps"
            ) from None
        inputs = task.inputs(batch)
        output = engine(*inputs) if isinstance(inputs, tuple) else engine(inputs)
        loss = task.loss(output, batch)
        if metrics is not None:
            metrics.phase(Phase.BACKWARD)
        engine.backward(loss)
        losses.append(loss.detach())
    return losses


def mean_over_ranks(engine: Any, loss: torch.Tensor, world_size: int) -> float:
    """The loss averaged over ranks (4 bytes through the engine's counted collectives), so what a run reports
    does not depend on which slice of the global batch rank 0 happened to get."""
    comm = getattr(engine, "comm", None)
    if comm is None or world_size == 1:
        return float(loss)
    total = loss.detach().reshape(1).clone()
    comm.all_reduce(total, "<loss>")
    return float(total) / world_size


def run_steps(
    engine: Any,
    task: TrainingTask,
    spec: ZeroTrainingJobSpec,
    ctx: RankContext,
    device: torch.device,
    log: ProgressLog | None,
    policy: CheckpointPolicy | None = None,
    first_step: int = 1,
    metrics: RankMetrics | None = None,
) -> TrainResult:
    """The loop from `first_step`: accumulate micro-batches, step, checkpoint, log from rank 0, metrics."""
    accumulation = spec.zero.gradient_accumulation_steps
    steps = spec.training.steps
    result = TrainResult()
    start = time.perf_counter()
    for step in range(first_step, steps + 1):
        step_start = time.perf_counter()
        losses = run_micro_batches(engine, task, device, accumulation, step, steps, metrics)
        if metrics is not None:
            metrics.phase(Phase.OPTIMIZER)
        outcome = engine.step()
        step_loss = mean_over_ranks(engine, torch.stack(losses).float().mean(), ctx.world_size)
        grad_norm = outcome.grad_norm if outcome.grad_norm is not None else float("nan")
        result.skipped_steps += int(outcome.overflow)
        if not outcome.applied and not outcome.overflow:
            raise RuntimeError(
                f"step {step}: the engine did not step after {accumulation} micro-batches; its accumulation "
                "boundary disagrees with spec.zero.gradientAccumulationSteps"
            )
        if policy is not None and policy.due(step, steps):
            saved = save_checkpoint(engine, policy, step, metrics)
            if log is not None:
                log.checkpoint(step, str(saved))
        step_s = time.perf_counter() - step_start
        step_tokens = task.tokens_per_batch * accumulation * ctx.world_size
        if metrics is not None:
            metrics.observe_step(
                engine,
                StepValues(
                    step=step,
                    seconds=step_s,
                    loss=step_loss,
                    grad_norm=grad_norm,
                    learning_rate=float(engine.optimizer.param_groups[0]["lr"]),
                    loss_scale=float(outcome.loss_scale),
                    applied=bool(outcome.applied),
                    skipped=bool(outcome.overflow),
                    tokens=task.tokens_per_batch * accumulation,
                ),
            )
        result.losses.append(step_loss)
        result.grad_norms.append(grad_norm)
        result.tokens += step_tokens
        if log is not None and (step % spec.training.log_every == 0 or step in (1, steps)):
            log.write(
                {
                    "step": step,
                    "steps": steps,
                    "loss": step_loss,
                    "grad_norm": grad_norm,
                    "skipped": bool(outcome.overflow),
                    "tokens_per_s": step_tokens / step_s if step_s > 0 else 0.0,
                    "elapsed_s": time.perf_counter() - start,
                }
            )
    result.elapsed_s = time.perf_counter() - start
    return result


def save_checkpoint(engine: Any, policy: CheckpointPolicy, step: int, metrics: RankMetrics | None) -> Path:
    """Save and commit, timed for the metrics (the bytes are this rank's own file)."""
    if metrics is not None:
        metrics.phase(Phase.CHECKPOINTING)
    t0 = time.perf_counter()
    saved = policy.save(engine)
    if metrics is not None:
        metrics.observe_save(step, time.perf_counter() - t0, rank_file_bytes(saved, engine.rank))
    return saved


def gather_json(record: dict[str, Any], ctx: RankContext, device: torch.device) -> list[Any] | None:
    """Every rank's JSON-able `record` on rank 0 (None elsewhere).

    Through byte tensors rather than `gather_object`, which needs numpy to unpickle.
    """
    if ctx.world_size == 1:
        return [record]
    data = torch.tensor(list(json.dumps(record).encode()), dtype=torch.uint8, device=device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(ctx.world_size)]
    dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64, device=device))
    longest = int(max(int(s.item()) for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: data.numel()] = data
    bufs = [torch.empty_like(padded) for _ in range(ctx.world_size)] if ctx.rank == 0 else None
    dist.gather(padded, bufs, dst=0)
    if bufs is None:
        return None
    return [json.loads(bytes(b[: int(n.item())].tolist())) for b, n in zip(bufs, sizes, strict=True)]


def gather_reports(engine: Any, ctx: RankContext, device: torch.device) -> list[Any] | None:
    """Every rank's memory and comm report on rank 0; taken before the gather, so the gather is not counted."""
    mine = {"rank": ctx.rank, "memory": to_jsonable(engine.memory_report()), "comm": to_jsonable(engine.comm_report())}
    return gather_json(mine, ctx, device)


def summary_record(
    spec: ZeroTrainingJobSpec, ctx: RankContext, result: TrainResult, ranks: list[Any]
) -> dict[str, Any]:
    return {
        "world_size": ctx.world_size,
        "stage": int(spec.zero.stage),
        "steps": spec.training.steps,
        "losses": result.losses,
        "grad_norms": result.grad_norms,
        "skipped_steps": result.skipped_steps,
        # None when resumed from the final checkpoint: no step was left to run (a gang restarted after it).
        "first_loss": result.losses[0] if result.losses else None,
        "final_loss": result.losses[-1] if result.losses else None,
        "elapsed_s": result.elapsed_s,
        "tokens_per_s": result.tokens / result.elapsed_s if result.elapsed_s > 0 else 0.0,
        "ranks": ranks,
    }


def train(
    spec: ZeroTrainingJobSpec,
    ctx: RankContext,
    engine_factory: EngineFactory | None = None,
    metrics: RankMetrics | None = None,
) -> TrainResult:
    """Run the job's training on this rank (the process group must be initialised), feeding `metrics`."""
    if is_script(spec.entrypoint):
        raise ConfigError(f"spec.entrypoint: {spec.entrypoint!r} is a script; the launcher runs scripts directly")
    if engine_factory is None:
        from zerotrain.runtime import ZeroEngine

        engine_factory = ZeroEngine
    torch.manual_seed(spec.training.seed)
    task = build_task(spec.entrypoint, rank=ctx.rank, world_size=ctx.world_size, args=spec.entrypoint_args)
    device = device_for(ctx.local_rank)
    engine = make_engine(task, spec, device, engine_factory)
    policy = CheckpointPolicy.from_env(spec.checkpoint)
    first_step = resume(engine, task, spec, policy, metrics) + 1
    log = ProgressLog(os.environ.get(PROGRESS_ENV)) if ctx.rank == 0 else None
    try:
        result = run_steps(engine, task, spec, ctx, device, log, policy, first_step, metrics)
    finally:
        if log is not None:
            log.close()
    if metrics is not None:
        metrics.phase(Phase.FINISHED)
    ranks = gather_reports(engine, ctx, device)
    if ranks is not None:
        record = json.dumps(summary_record(spec, ctx, result, ranks))
        path = os.environ.get(SUMMARY_ENV)
        if path:
            Path(path).write_text(record + "\n")
        else:
            print(record, flush=True)
    return result


def resume(
    engine: Any,
    task: TrainingTask,
    spec: ZeroTrainingJobSpec,
    policy: CheckpointPolicy | None,
    metrics: RankMetrics | None = None,
) -> int:
    """Load the newest good checkpoint and skip the micro-batches it already consumed; the steps done."""
    if policy is None:
        return 0
    if metrics is not None:
        metrics.phase(Phase.RESTORING)
    t0 = time.perf_counter()
    loaded = policy.resume_newest(engine)
    if loaded is None:
        return 0
    path, nbytes = loaded
    done = int(engine.steps)
    if metrics is not None:
        metrics.observe_load(done, time.perf_counter() - t0, nbytes)
    # Batches are a deterministic function of the seed and their index, so skipping reproduces the data order.
    for _ in range(done * spec.zero.gradient_accumulation_steps):
        next(task.batches, None)
    logger.warning("resumed from %s at step %d", path, done)
    return done


def start_metrics(job: str, spec: ZeroTrainingJobSpec, ctx: RankContext) -> RankMetrics:
    """The rank's metrics, serving before the first collective (spec.metrics; `zerotrain run` picks the ports)."""
    metrics = RankMetrics(
        job,
        ctx.rank,
        ctx.local_rank,
        ctx.world_size,
        int(spec.zero.stage),
        spec.training.steps,
        enabled=spec.metrics.enabled,
    )
    if spec.metrics.enabled:
        metrics.serve(*metrics_endpoint(spec.metrics.port, ctx.local_rank))
    return metrics


def init_process_group(spec: ZeroTrainingJobSpec) -> None:
    """gloo on CPU, NCCL on CUDA, from the torchrun environment; collectives time out per spec.zero."""
    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=spec.zero.collective_timeout_seconds))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerotrain.runtime.train", description=__doc__)
    parser.add_argument("--config", required=True, help="the ZeroTrainingJob manifest (YAML or JSON)")
    args = parser.parse_args(argv)
    # User entry points may live in the working directory; append it (never prepend: see tests/conftest.py).
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        from zerotrain.manifest import load_job

        job = load_job(args.config)
        spec = job.spec
        ctx = RankContext.from_env()
        metrics = start_metrics(str(job.metadata.get("name") or "zerotrain"), spec, ctx)
        init_process_group(spec)
        train(spec, ctx, metrics=metrics)
        metrics.stop()
    except UserError as e:
        message = f"zerotrain rank {os.environ.get('RANK', '?')}: error: {e}"
        print(message, file=sys.stderr, flush=True)
        fail(message, EXIT_BAD_INPUT)
    except SystemExit as e:
        if e.code not in (0, None):
            fail(f"SystemExit: {e.code}", e.code if isinstance(e.code, int) else 1)
        raise
    except Exception as e:
        traceback.print_exc()
        fail(f"{type(e).__name__}: {e}", 1)
    # The engine's hooks form reference cycles; collect it (and the gloo work objects it holds) while the
    # process group is alive, or finalising them at interpreter exit can abort the process.
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def fail(message: str, code: int) -> NoReturn:
    """Record the failure for the launcher and exit at once with `code`.

    No process-group teardown: with peers gone or stuck it can hang, or abort and replace `code` with SIGABRT.
    """
    write_failure_record(message)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
