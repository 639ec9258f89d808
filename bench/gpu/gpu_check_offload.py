"""bench/gpu/gpu_check.py's offload phase: bf16 stage 3 on the allocator model, plain, with the optimizer offloaded
(zero.offload.optimizer: cpu) and with the parameters too (zero.offload.parameters: cpu), and on CUDA FSDP2 with
CPUOffloadPolicy: memory_report()'s device and host categories against the plan, where the offloaded tensors are,
the peak allocated, the losses against the plain run, and step times (reported as ratios, never asserted)."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from gpu_check_allocator import fresh_allocator, gb
from gpu_check_config import BF16_LOSS_ATOL, FSDP2_LOSS_ATOL, OFFLOAD_BYTES_RTOL, OFFLOAD_CPU_LOSS_ATOL, SIZES, Size
from gpu_check_procs import first_line
from gpu_check_records import SKIPPED, Checks
from gpu_check_train import adamw, batches, device_of, init_group, make_task, teardown

from zerotrain.pod_contract import SINGLE_RANK_COLLECTIVES_ENV as SINGLE_RANK_ENV
from zerotrain.runtime import ZeroConfig, ZeroEngine
from zerotrain.runtime.zero.memory import MemoryReport
from zerotrain.zero_config import OffloadConfig, OffloadDevice

PLAIN, OPTIMIZER, PARAMETERS, FSDP2 = "zero3", "zero3 offload optimizer", "zero3 offload all", "fsdp2 CPUOffloadPolicy"
CPU = OffloadDevice.CPU
OFFLOADS = {
    PLAIN: OffloadConfig(),
    OPTIMIZER: OffloadConfig(optimizer=CPU),
    PARAMETERS: OffloadConfig(optimizer=CPU, parameters=CPU),
}
"""The zerotrain configurations, in the order they run (the plain run first: the others are compared with it)."""
SPEED_BASE = {OPTIMIZER: PLAIN, PARAMETERS: PLAIN, FSDP2: PARAMETERS}
"""Whose step time each ratio divides by: FSDP2's CPUOffloadPolicy keeps the parameter shard, the gradients and
AdamW on the host, which is zerotrain's optimizer-and-parameters placement."""


@dataclass
class Run:
    """One configuration's training: losses, seconds per step, device figures, and what is off the device."""

    name: str
    losses: list[float]
    seconds: list[float]
    peak: int | None
    """CUDA: the most bytes allocated during the steps (None on CPU)."""
    held: int | None
    """CUDA: bytes allocated after the steps, i.e. what stays on the device between steps (None on CPU)."""
    report: MemoryReport | None = None
    misplaced: dict[str, list[str]] = field(default_factory=dict)
    """Per offloaded class (optimizer, parameters): its tensors found on the device, or unpinned on CUDA."""


def timed(step: Callable[[Any], float], data: list[Any], device: torch.device) -> tuple[list[float], list[float]]:
    """Each step's loss and wall seconds; on CUDA a step ends with a synchronize, or its queued kernels and copies
    would be counted in the next step's time."""
    losses, seconds = [], []
    for batch in data:
        t0 = time.perf_counter()
        loss = step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - t0)
        losses.append(loss)
    return losses, seconds


def cuda_figures(device: torch.device) -> tuple[int | None, int | None]:
    """(peak allocated since the last reset, allocated now) on CUDA; none on the CPU."""
    if device.type != "cuda":
        return None, None
    return torch.cuda.max_memory_allocated(device), torch.cuda.memory_allocated(device)


def off_device(tensors: list[tuple[str, torch.Tensor]], cuda: bool) -> list[str]:
    """memory_report() counts host bytes by the configuration, not by where the tensors are: only their devices
    show that they left the device, and on CUDA they must be pinned, or every copy to and from it blocks the host.
    AdamW's state never crosses (the step runs beside it), so it need not be pinned."""
    problems = {f"{what} on {t.device}" for what, t in tensors if t.device.type != "cpu"}
    if cuda:
        problems |= {f"{what} not pinned" for what, t in tensors if what != "optimizer state" and not t.is_pinned()}
    return sorted(problems)


def misplaced(engine: ZeroEngine, offload: OffloadConfig) -> dict[str, list[str]]:
    """What `offload` moves to the host, by class, and which of those tensors are not there."""
    cuda, units = engine.device.type == "cuda", engine.units
    out: dict[str, list[str]] = {}
    if offload.optimizer is not None:
        held = [("master", u.master) for u in units] + [
            ("host gradient", u.host_grad) for u in units if u.host_grad is not None
        ]
        state = [t for st in engine.optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        out["optimizer"] = off_device(held + [("optimizer state", t) for t in state], cuda)
    if offload.parameters is not None:
        out["parameters"] = off_device([("parameter shard", u.shard) for u in units if u.shard is not None], cuda)
    return out


def train_zero(device: torch.device, size: Size, name: str) -> Run:
    """bf16 stage 3 in configuration `name` over the allocator model's steps (the same seed and data for each)."""
    fresh_allocator(device.type == "cuda")
    task = make_task(device, size.alloc)
    data = batches(task, device, size.alloc_steps)
    offload = OFFLOADS[name]
    cfg = ZeroConfig(stage=3, unit_modules=task.unit_modules, precision="bf16", reduce_dtype="fp32", offload=offload)
    engine = ZeroEngine(task.model, cfg, optimizer=adamw)
    if device.type == "cuda":  # the steps' peak, not the model's construction (the full fp32 model on the device)
        torch.cuda.reset_peak_memory_stats(device)

    def step(batch: Any) -> float:
        engine.backward(task.loss(engine(task.inputs(batch)), batch))
        loss = engine.step().loss
        assert loss is not None  # one micro-batch a step: every step is a boundary
        return loss

    losses, seconds = timed(step, data, device)
    engine.synchronize()
    peak, held = cuda_figures(device)
    # The engine, its hooks in cycles, is freed by the next run's fresh_allocator (gc, then the cache emptied).
    return Run(name, losses, seconds, peak, held, engine.accounting().memory_report(), misplaced(engine, offload))


def train_fsdp2(device: torch.device, size: Size) -> Run:
    """FSDP2 per block and at the root, bf16 compute with fp32 reduction (as bench/gpu/gpu_throughput.py), its
    sharded parameters, gradients and AdamW on the host (CPUOffloadPolicy, pinned)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    fresh_allocator(True)
    task = make_task(device, size.alloc)
    data = batches(task, device, size.alloc_steps)
    policies: dict[str, Any] = {
        "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        "offload_policy": CPUOffloadPolicy(pin_memory=True),
    }
    for block in task.model.blocks:
        fully_shard(block, **policies)
    fully_shard(task.model, **policies)
    opt = adamw(task.model.parameters())
    torch.cuda.reset_peak_memory_stats(device)

    def step(batch: Any) -> float:
        loss = task.loss(task.model(task.inputs(batch)), batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return float(loss.detach())

    losses, seconds = timed(step, data, device)
    peak, held = cuda_figures(device)
    return Run(FSDP2, losses, seconds, peak, held)


def fsdp2_unavailable(cuda: bool) -> str | None:
    """Why FSDP2 with CPUOffloadPolicy does not run here, or None when it does."""
    if not cuda:
        return "not on CUDA: on the CPU its parameters and AdamW are in host memory already (nothing to offload)"
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard  # noqa: F401
    except ImportError as e:
        return f"torch {torch.__version__} has no fully_shard with CPUOffloadPolicy ({e})"
    return None


def near(measured: int, predicted: int, per_element: float, padding: int) -> bool:
    """Within OFFLOAD_BYTES_RTOL of the prediction plus the padding (a category predicted 0 must be 0)."""
    return abs(measured - predicted) <= OFFLOAD_BYTES_RTOL * predicted + padding * per_element


def memory_checks(checks: Checks, run: Run) -> None:
    """Device and host categories against the plan; (a) the optimizer and (b) the parameters off the device."""
    rep = run.report
    assert rep is not None
    shard = rep.parameters / rep.shard_group_size
    rows = [
        ("device parameters", rep.parameter_bytes, rep.predicted_parameter_bytes, rep.bytes_per_weight),
        ("device gradients", rep.gradient_bytes, rep.predicted_gradient_bytes, rep.bytes_per_gradient),
        ("device optimizer", rep.optimizer_bytes, rep.predicted_optimizer_bytes, rep.optimizer_multiplier),
        # The report keeps no bytes per element for the host: (K + 4) and w from the predictions themselves.
        ("host optimizer", rep.host_optimizer_bytes, rep.predicted_host_optimizer_bytes, 0.0),
        ("host parameters", rep.host_parameter_bytes, rep.predicted_host_parameter_bytes, 0.0),
    ]
    rows = [(c, m, p, p / shard if c.startswith("host") else e) for c, m, p, e in rows]
    off = [f"{c} {gb(m)} against {gb(p)} planned" for c, m, p, e in rows if not near(m, p, e, rep.padding_elements)]
    text = ", ".join(f"{c} {gb(m)} / {gb(p)}" for c, m, p, _ in rows)
    cuda_ok = (run.peak is None) == (rep.cuda_peak_allocated_bytes is None)
    off += [] if cuda_ok else ["the report's cuda_* figures are not there exactly when on CUDA"]
    peak = "none on CPU" if run.peak is None else f"{gb(run.peak)} (reported {gb(rep.cuda_peak_allocated_bytes)})"
    detail = f"measured / planned: {text}; cuda peak allocated {peak}"
    figures: dict[str, Any] = {c.replace(" ", "_"): {"measured": m, "predicted": p} for c, m, p, _ in rows}
    figures.update(cuda_peak_allocated_bytes=run.peak, cuda_held_bytes=run.held, padding=rep.padding_elements)
    checks.add(f"{run.name}: memory", not off, detail + ("" if not off else " -- " + "; ".join(off)), **figures)
    for kind, nbytes in (("optimizer", rep.optimizer_bytes), ("parameters", rep.parameter_bytes)):
        if kind not in run.misplaced:
            continue
        bad = run.misplaced[kind] + ([f"{gb(nbytes)} counted on the device"] if nbytes else [])
        where = "on the host, pinned" if run.peak is not None else "on the host"
        checks.add(f"{run.name}: {kind} off the device", not bad, "; ".join(bad) or f"0 B on the device, all {where}")


def loss_check(checks: Checks, run: Run, base: Run, atol: float) -> None:
    diffs = [abs(a - b) for a, b in zip(run.losses, base.losses, strict=True)]
    worst = max(diffs, default=0.0)
    detail = (
        f"max |loss - {base.name}'s| {worst:.1e} (<= {atol:.0e}) over {len(diffs)} steps; last {run.losses[-1]:.4f}"
    )
    checks.add(f"{run.name}: losses", worst <= atol, detail, losses=run.losses, reference=base.losses, atol=atol)


def speed_report(checks: Checks, runs: dict[str, Run], warmup: int) -> None:
    """Median seconds per step after the warm-up, as ratios: reported, never asserted (a shared or throttled
    machine moves them, and what offload costs is what this measures, not a pass mark)."""
    med = {n: statistics.median(r.seconds[warmup:] or r.seconds) for n, r in runs.items()}
    peak = runs[PLAIN].peak
    parts = [f"{PLAIN} {med[PLAIN]:.3f} s" + ("" if peak is None else f", peak {gb(peak)}")]
    for name, base in SPEED_BASE.items():
        if name in runs and base in runs:
            peak, base_peak = runs[name].peak, runs[base].peak or 1
            mem = "" if peak is None else f", peak {gb(peak)} ({peak / base_peak:.2f}x)"
            parts.append(f"{name} {med[name]:.3f} s ({med[name] / med[base]:.2f}x {base}{mem})")
    timed_steps = len(runs[PLAIN].seconds[warmup:])
    detail = f"median step after {warmup} warm-up ({timed_steps} timed): " + "; ".join(parts) + " (not asserted)"
    figures = {
        n: {"step_s": r.seconds, "cuda_peak_allocated_bytes": r.peak, "cuda_held_bytes": r.held}
        for n, r in runs.items()
    }
    checks.add("step time", True, detail, median_step_s=med, runs=figures)


def phase_offload(args: argparse.Namespace, checks: Checks) -> None:
    device = device_of(args)
    cuda = device.type == "cuda"
    os.environ[SINGLE_RANK_ENV] = "1"  # real collectives at world size 1, as FSDP2 issues them
    init_group(device)
    size = SIZES[args.size]
    runs: dict[str, Run] = {}
    for name in OFFLOADS:
        runs[name] = train_zero(device, size, name)
        memory_checks(checks, runs[name])
        if name != PLAIN:
            loss_check(checks, runs[name], runs[PLAIN], BF16_LOSS_ATOL if cuda else OFFLOAD_CPU_LOSS_ATOL)
    why = fsdp2_unavailable(cuda)
    if why is not None:
        checks.add(FSDP2, SKIPPED, why)
    else:
        try:
            runs[FSDP2] = train_fsdp2(device, size)
            loss_check(checks, runs[FSDP2], runs[PLAIN], FSDP2_LOSS_ATOL)
        except Exception as e:  # FSDP2 failing is a finding, but zerotrain's step times are still worth the record
            checks.add(FSDP2, False, f"FSDP2 with CPUOffloadPolicy did not train: {first_line(e)}")
    speed_report(checks, runs, size.offload_warmup)
    teardown()  # its gc frees the last run's engine while the group is still alive
