"""bench/gpu/gpu_check.py's parity phase: fp32 stages 0-3 against torch.optim.AdamW, bf16 stages against bf16 stage 0
(also chunked and with overlap_comm false), and bf16 stage 0 against fp32 AdamW loosely."""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from gpu_check_config import BF16_LOSS_ATOL, BF16_UPDATE_RTOL, BF16_VS_FP32_LOSS_ATOL, FP32_ATOL, SIZES, GptSize
from gpu_check_records import Checks
from gpu_check_train import (
    Trained,
    batches,
    chunk_elements,
    device_of,
    exact_fp32,
    init_group,
    initial_weights,
    make_task,
    math_attention,
    teardown,
    train_engine,
    train_reference,
)

from zerotrain.pod_contract import SINGLE_RANK_COLLECTIVES_ENV as SINGLE_RANK_ENV
from zerotrain.pod_contract import STREAM_MODEL_ENV


def max_abs(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(float((got[k] - v).abs().max()) for k, v in want.items())


def worst_update(got: Trained, base: Trained, init: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest per-tensor ‖Δw − Δw_base‖ / ‖Δw_base‖, and the tensor."""
    worst, name = 0.0, ""
    for k, w0 in init.items():
        d_base = base.weights[k] - w0
        rel = float((got.weights[k] - w0 - d_base).norm() / d_base.norm().clamp_min(1e-30))
        if not rel <= worst:  # NaN counts as worst
            worst, name = rel, k
    return worst, name


def diffs(got: list[float], want: list[float], relative: bool = False) -> float:
    out = 0.0
    for a, b in zip(got, want, strict=True):
        d = abs(a - b) / (abs(b) if relative and b else 1.0)
        out = d if not d <= out else out
    return out


def fp32_check(checks: Checks, name: str, run: Trained, ref: Trained, single_rank: bool) -> bool:
    dw, dl, dn = (
        max_abs(run.weights, ref.weights),
        diffs(run.losses, ref.losses),
        diffs(run.grad_norms, ref.grad_norms, True),
    )
    ok = dw <= FP32_ATOL and dl <= FP32_ATOL and dn <= FP32_ATOL
    detail = f"max|w - w_adamw| {dw:.2e}, loss {dl:.1e}, grad norm rel {dn:.1e} (<= {FP32_ATOL:.0e})"
    if single_rank and run.local:
        ok, detail = False, f"{SINGLE_RANK_ENV}=1 but the engine ran no collectives; " + detail
    return checks.add(name, ok, detail, max_weight_diff=dw, max_loss_diff=dl, max_grad_norm_rel=dn, tol=FP32_ATOL)


def bf16_check(checks: Checks, name: str, run: Trained, base: Trained, init: dict[str, torch.Tensor]) -> bool:
    du, where = worst_update(run, base, init)
    dl, dn = diffs(run.losses, base.losses), diffs(run.grad_norms, base.grad_norms, True)
    ok = du <= BF16_UPDATE_RTOL and dl <= BF16_LOSS_ATOL and dn <= BF16_UPDATE_RTOL
    detail = (
        f"update rel {du:.1e} ({where or '-'}; <= {BF16_UPDATE_RTOL:.0e}), loss {dl:.1e} (<= {BF16_LOSS_ATOL:.0e}), "
        f"grad norm rel {dn:.1e}"
    )
    return checks.add(name, ok, detail, max_update_rel=du, tensor=where, max_loss_diff=dl, max_grad_norm_rel=dn)


def parity_cases(chunk: int, world: int) -> list[tuple[str, int, dict[str, Any]]]:
    """(label, stage, engine settings) of the fp32 runs compared with AdamW; at 2 ranks, the paths that differ most."""
    chunked = {"reduce_bucket_elements": chunk, "allgather_bucket_elements": chunk}
    cases: list[tuple[str, int, dict[str, Any]]] = [(f"stage {s}", s, {}) for s in range(4)]
    cases += [(f"stage {s} chunked", s, chunked) for s in (range(4) if world == 1 else (2, 3))]
    cases += [(f"stage {s} overlapComm false", s, {"overlap_comm": False}) for s in (range(4) if world == 1 else (3,))]
    return cases


def bf16_cases(chunk: int, world: int) -> list[tuple[str, int, dict[str, Any]]]:
    """The bf16 runs compared with bf16 stage 0: stages 1-3, and chunked and overlapComm false from stage 2."""
    if world > 1:
        return [c for c in parity_cases(chunk, world) if c[1] == 3]
    return [c for c in parity_cases(chunk, world) if c[1] > 0 and (c[1] >= 2 or not c[2])]


def parity_runs(
    checks: Checks, device: torch.device, gpt: GptSize, steps: int, faults: set[str], rank: int, world: int
) -> None:
    """fp32 against AdamW on the global batch, bf16 against bf16 stage 0 on the same data."""
    ref_task = make_task(device, gpt)  # the whole global batch, one process
    init = initial_weights(ref_task)
    chunk = chunk_elements(ref_task)
    ref = train_reference(ref_task, batches(ref_task, device, steps))
    del ref_task
    if "parity-reference" in faults:
        first = next(iter(ref.weights))
        ref.weights[first] = ref.weights[first] + 1e-3  # injected: a wrong reference must fail
    data = batches(make_task(device, gpt, rank, world), device, steps)
    where = f"{world} ranks" if world > 1 else "world 1"
    single = world == 1
    for label, stage, cfg in parity_cases(chunk, world):
        run = train_engine(make_task(device, gpt, rank, world), data, stage, **cfg)
        fp32_check(checks, f"fp32 {label} vs AdamW ({where})", run, ref, single)
    chunked: dict[str, Any] = {"reduce_bucket_elements": chunk, "allgather_bucket_elements": chunk}
    for stage in (2, 3):  # side work held back on the GPU: a consumer that did not wait for it reads other numbers
        os.environ[STREAM_MODEL_ENV] = "delayed"
        try:
            run = train_engine(make_task(device, gpt, rank, world), data, stage, **chunked)
        finally:
            os.environ.pop(STREAM_MODEL_ENV)
        fp32_check(checks, f"fp32 stage {stage} chunked, side stream delayed vs AdamW ({where})", run, ref, single)
    base = train_engine(make_task(device, gpt, rank, world), data, 0, "bf16", reduce_dtype="fp32")
    dl = diffs(base.losses, ref.losses)
    checks.add(
        f"bf16 stage 0 vs fp32 AdamW ({where})",
        dl <= BF16_VS_FP32_LOSS_ATOL,
        f"loss {dl:.1e} (<= {BF16_VS_FP32_LOSS_ATOL:.0e}): the mixed-precision path trains the same model",
        max_loss_diff=dl,
    )
    if "parity-reference" in faults:
        first = next(iter(init))
        base.weights[first] = init[first] + 1.1 * (base.weights[first] - init[first])  # injected
    for label, stage, cfg in bf16_cases(chunk, world):
        run = train_engine(make_task(device, gpt, rank, world), data, stage, "bf16", reduce_dtype="fp32", **cfg)
        bf16_check(checks, f"bf16 {label} vs bf16 stage 0 ({where})", run, base, init)


def phase_parity(args: argparse.Namespace, checks: Checks) -> None:
    device = device_of(args)
    exact_fp32(device)
    os.environ[SINGLE_RANK_ENV] = "1"
    init_group(device)
    with math_attention():
        parity_runs(checks, device, SIZES[args.size].gpt, SIZES[args.size].steps, set(args.inject), 0, 1)
    teardown()
