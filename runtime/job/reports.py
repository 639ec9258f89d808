"""The end-of-run summary: every rank's memory and communication reports, gathered to rank 0 as JSON."""

from __future__ import annotations

import dataclasses
import json
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from zerotrain.runtime.job.process_memory import own_bytes
from zerotrain.runtime.job.progress import throughput

if TYPE_CHECKING:
    from zerotrain.runtime.job.train import RankContext, TrainResult
    from zerotrain.runtime.zero.engine import ZeroEngine
    from zerotrain.spec import ZeroTrainingJobSpec


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


def gather_reports(engine: ZeroEngine, ctx: RankContext, device: torch.device) -> list[Any] | None:
    """Every rank's memory and comm report on rank 0; taken before the gather, so the gather is not counted."""
    mine = {
        "rank": ctx.rank,
        "memory": to_jsonable(engine.accounting().memory_report()),
        "comm": to_jsonable(engine.accounting().comm_report()),
        "process_bytes": own_bytes(),  # the process at its most, tensors and all (`process_memory`)
    }
    return gather_json(mine, ctx, device)


def summary_record(
    spec: ZeroTrainingJobSpec, ctx: RankContext, result: TrainResult, ranks: list[Any]
) -> dict[str, Any]:
    training_s = result.train_seconds  # the progress bar's last figure: up to the last step, evaluation left out
    return {
        "world_size": ctx.world_size,
        "stage": int(spec.zero.fixed_stage),
        "steps": spec.training.steps,
        "first_step": result.first_step,
        "losses": result.losses,
        "grad_norms": result.grad_norms,
        "learning_rates": result.learning_rates,
        "skipped_steps": result.skipped_steps,
        # None when resumed from the final checkpoint: no step was left to run (a gang restarted after it).
        "first_loss": result.losses[0] if result.losses else None,
        "final_loss": result.losses[-1] if result.losses else None,
        "elapsed_s": result.elapsed_s,
        # None for a task counted in samples (its throughput is in samples/s), not a throughput of 0.
        "tokens_per_s": result.tokens / training_s if result.tokens and training_s > 0 else None,
        **throughput(result.tokens, result.samples, result.steps, training_s),
        "evaluations": [{"step": e.step, "loss": e.loss} for e in result.evaluations],
        # From the launcher's start to now: starting, training, evaluating, checkpointing (zerotrain.goodput).
        "goodput": result.goodput.model_dump() if result.goodput is not None else None,
        # Every rank named a straggler: rank, cause, the steps it was named after and cleared after.
        "stragglers": result.stragglers,
        "ranks": ranks,
    }
