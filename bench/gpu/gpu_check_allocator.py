"""bench/gpu/gpu_check.py's allocator phase: bf16 stages 0-3 on a mid-size model, torch.cuda.memory_stats (allocated,
reserved, retries, fragmentation at peak) beside memory_report()'s measured and predicted (ZeRO formula) model
states."""

from __future__ import annotations

import argparse
import gc
import os
from typing import Any

import torch
from gpu_check_config import SIZES, GptSize, Size
from gpu_check_records import Checks
from gpu_check_train import adamw, batches, device_of, init_group, make_task, teardown

from zerotrain.plan.peak import peak_plan
from zerotrain.plan.transformer import activation_peak
from zerotrain.pod_contract import SINGLE_RANK_COLLECTIVES_ENV as SINGLE_RANK_ENV
from zerotrain.quantity import format_bytes
from zerotrain.runtime import ZeroConfig, ZeroEngine
from zerotrain.runtime.zero.memory import buffer_plan
from zerotrain.spec import ModelShape

PEAK_RTOL = 0.10
"""The whole-peak plan against torch.cuda.max_memory_allocated over the training steps: reported, and a check
within 10% (on the CPU the plan is within 1-4% of live tensor bytes: docs/memory.md)."""


def gb(n: float | None) -> str:
    return "-" if n is None else format_bytes(n)


def fresh_allocator(cuda: bool) -> int:
    """Free what the last stage left and reset the peaks; the allocation retries so far (0 on the CPU)."""
    gc.collect()
    if not cuda:
        return 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.memory_stats().get("num_alloc_retries", 0))


def train_bf16(device: torch.device, size: Size, stage: int) -> tuple[ZeroEngine, Any, list[Any]]:
    """bf16 `stage` on the allocator model for its steps: the engine (still holding its memory), task and data."""
    task = make_task(device, size.alloc)
    data = batches(task, device, size.alloc_steps)
    cfg = ZeroConfig(stage=stage, unit_modules=task.unit_modules, precision="bf16", reduce_dtype="fp32")
    engine = ZeroEngine(task.model, cfg, optimizer=adamw)
    if device.type == "cuda":  # the plan is the training step's peak, not the model's construction
        torch.cuda.reset_peak_memory_stats(device)
    for batch in data:
        engine.backward(task.loss(engine(task.inputs(batch)), batch))
        engine.step()
    engine.synchronize()
    return engine, task, data


def plan(rep: Any) -> tuple[bool, float, str, dict[str, Any]]:
    """Whether the measured model states are the predicted ones, the slack allowed, the plan's line and figures."""
    predicted, measured = rep.predicted_model_state_bytes, rep.model_state_bytes
    # Padding (none at world 1) is real memory; 1% covers AdamW's per-tensor step counters.
    slack = 0.01 * predicted + rep.padding_elements * (rep.bytes_per_weight + rep.bytes_per_gradient)
    plan_ok = abs(measured - predicted) <= slack
    extra = {
        "gradient_arena_bytes": rep.gradient_arena_bytes,
        "gathered_peak_bytes": rep.gathered_peak_bytes,
        "activation_peak_bytes": rep.activation_peak_bytes,
        "comm_buffer_peak_bytes": rep.comm_buffer_peak_bytes,
        "unsharded_gradient_peak_bytes": rep.unsharded_gradient_peak_bytes,
    }
    text = (
        f"plan: model states {gb(predicted)} predicted, {gb(measured)} measured; arenas "
        f"{gb(rep.gradient_arena_bytes)}, gathered peak {gb(rep.gathered_peak_bytes)}, activations peak "
        f"{gb(rep.activation_peak_bytes)}, comm buffers peak {gb(rep.comm_buffer_peak_bytes)}"
    )
    figures: dict[str, Any] = {"predicted_model_state_bytes": predicted, "model_state_bytes": measured, **extra}
    return plan_ok, slack, text, figures


def planned_peak(engine: ZeroEngine, rep: Any, gpt: GptSize) -> int:
    """`zerotrain plan`'s whole peak for this engine's units and the allocator model's shape (foreach AdamW, as
    torch steps on CUDA)."""
    shape = ModelShape(
        layers=gpt["n_layers"],
        hidden=gpt["d_model"],
        heads=gpt["n_heads"],
        sequence_length=gpt["seq_len"],
        vocabulary=256,
        micro_batch_size=gpt["batch_size"],
    )
    at_head, in_block, _ = activation_peak(shape, rep.bytes_per_weight, False, False)
    p = buffer_plan(engine.accounting(), rep.bytes_per_weight, rep.bytes_per_gradient, rep.optimizer_multiplier)
    p = p.model_copy(update={"activations": at_head, "activations_in_block": in_block, "foreach_step": True})
    return peak_plan(p).peak


def cuda_check(
    checks: Checks, name: str, rep: Any, device: torch.device, retries0: int, planned: int | None = None
) -> None:
    """The allocator's figures now (the engine still alive) against the plan and memory_report()'s own."""
    plan_ok, slack, plan_text, figures = plan(rep)
    stats = torch.cuda.memory_stats(device)
    alloc, reserved = int(stats["allocated_bytes.all.current"]), int(stats["reserved_bytes.all.current"])
    peak, peak_reserved = int(stats["allocated_bytes.all.peak"]), int(stats["reserved_bytes.all.peak"])
    retries = int(stats.get("num_alloc_retries", 0)) - retries0
    frag = 1.0 - peak / peak_reserved if peak_reserved else 0.0
    figures.update(
        allocated_bytes=alloc,
        reserved_bytes=reserved,
        peak_allocated_bytes=peak,
        peak_reserved_bytes=peak_reserved,
        alloc_retries=retries,
        fragmentation_at_peak=frag,
        report_cuda_allocated_bytes=rep.cuda_allocated_bytes,
        report_cuda_reserved_bytes=rep.cuda_reserved_bytes,
    )
    agrees = rep.cuda_allocated_bytes == alloc and rep.cuda_reserved_bytes == reserved
    problems = [] if plan_ok else [f"measured model states off the plan by more than {gb(slack)}"]
    problems += [] if retries == 0 else [f"{retries} allocation retries"]
    problems += [] if peak >= rep.predicted_model_state_bytes else ["peak allocated below the predicted model states"]
    problems += [] if agrees else ["memory_report()'s cuda_* figures differ from torch.cuda.memory_stats"]
    if planned is not None:
        figures.update(planned_peak_bytes=planned, peak_error=(planned - peak) / peak if peak else None)
        plan_text += f"; whole peak planned {gb(planned)} against {gb(peak)} allocated at most"
        if peak and abs(planned - peak) > PEAK_RTOL * peak:
            problems.append(f"the planned whole peak is {(planned - peak) / peak:+.1%} off the allocator's")
    detail = (
        f"allocated {gb(alloc)}, reserved {gb(reserved)}, peak {gb(peak)} / {gb(peak_reserved)} reserved, "
        f"retries {retries}, fragmentation at peak {frag:.1%}; {plan_text}"
    )
    checks.add(name, not problems, detail + ("" if not problems else " -- " + "; ".join(problems)), **figures)


def cpu_check(checks: Checks, name: str, rep: Any, planned: int) -> None:
    """On the CPU: the plan, and no allocator figures at all (the whole peak planned is reported:
    bench/runtime/bench_plan.py measures it on the CPU)."""
    plan_ok, _, plan_text, figures = plan(rep)
    figures["planned_peak_bytes"] = planned
    plan_text += f"; whole peak planned {gb(planned)}"
    none = all(v is None for v in (rep.cuda_allocated_bytes, rep.cuda_reserved_bytes, rep.cuda_alloc_retries))
    checks.add(name, plan_ok and none, f"allocator: none on CPU (as expected); {plan_text}", **figures)


def phase_allocator(args: argparse.Namespace, checks: Checks) -> None:
    device = device_of(args)
    cuda = device.type == "cuda"
    os.environ[SINGLE_RANK_ENV] = "1"
    init_group(device)
    size = SIZES[args.size]
    for stage in range(4):
        retries0 = fresh_allocator(cuda)
        engine, task, data = train_bf16(device, size, stage)
        rep = engine.accounting().memory_report()
        planned = planned_peak(engine, rep, size.alloc)
        if cuda:
            cuda_check(checks, f"bf16 stage {stage}", rep, device, retries0, planned)
        else:
            cpu_check(checks, f"bf16 stage {stage}", rep, planned)
        del engine, task, data
    teardown()
