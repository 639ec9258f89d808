"""Stages 0-3 in fp32 on real gloo ranks: parameters after 5 steps equal single-process AdamW on the
concatenated global batch, the global gradient norm equals the reference's, model-state bytes match
the ZeRO formula, bytes moved per step match 2Ψ(N-1)/N (stages 0-2) or 3Ψ(N-1)/N (stage 3), and
stage 3 never holds more than two gathered units besides the root.

Tolerances: rtol 1e-5 as the issue asks, with atol 1e-6 for elements near zero, where an fp32
rounding difference of the gradient sum (ranks sum in another order than one process does) is
~1e-7 absolute but arbitrarily large relative.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import torch
from dist_helpers import run_ranks
from tiny_models import batches, lm_loss, make_model, reference_train

from zerotrain.zero_config import Stage

if TYPE_CHECKING:
    from zerotrain.runtime import ZeroEngine

STEPS = 5
BUCKET = 64  # elements per communication bucket in the ZeRO-R cases
BYTES = 4  # fp32


@dataclass(frozen=True)
class Case:
    stage: int
    tied: bool = True
    accum: int = 1
    clip: float | None = 1.0
    frozen: tuple[str, ...] = ()
    persistence: int = 0
    prefetch: int = 1
    optimizer: str = "adamw"
    checkpointing: bool = False
    bucket: int = 50_000_000
    units: tuple[str, ...] = ("Block",)
    overlap: bool = True
    contiguous: bool = True
    extra: dict = field(default_factory=dict, hash=False)


def _model(case: Case) -> torch.nn.Module:
    model = make_model(seed=0, tied=case.tied)
    for name, p in model.named_parameters():
        if name in case.frozen:
            p.requires_grad_(False)
    return model


def _opt(name: str):  # type: ignore[no-untyped-def]
    if name == "sgd":
        return lambda groups: torch.optim.SGD(groups, lr=0.05, momentum=0.9, weight_decay=0.01)
    # eps 1e-6: with the default 1e-8, an element whose true gradient is ~1e-8 (it happens in these
    # runs) gets an update set by fp32 rounding of the gradient sum, which necessarily differs between
    # one process summing the global batch and N ranks summing their parts (summing per-rank gradients
    # in one process moves that element by the same 1e-5); the error is lr/eps times the rounding.
    return lambda groups: torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.1, eps=1e-6)


def _model_bytes(engine: Any) -> int:
    """Bytes moved for the model's tensors: the step's fixed-size control all-reduce (64 bytes) is not one."""
    return sum(s.bytes for op, s in engine.comm.stats.ops.items() if op != "control")


def engine_for(case: Case) -> ZeroEngine:
    """The case's engine on its model (shared with the stream-order tests)."""
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(
        stage=case.stage,
        unit_modules=list(case.units),
        overlap_comm=case.overlap,
        gradient_accumulation_steps=case.accum,
        gradient_clipping=case.clip,
        param_persistence_elements=case.persistence,
        prefetch_units=case.prefetch,
        activation_checkpointing=case.checkpointing,
        reduce_bucket_elements=case.bucket,
        allgather_bucket_elements=case.bucket,
        contiguous_gradients=case.contiguous,
        **case.extra,
    )
    return ZeroEngine(_model(case), cfg, optimizer=_opt(case.optimizer))


def run_case(rank: int, world: int, case: Case) -> dict:
    engine = engine_for(case)
    cfg = engine.config
    data = batches(STEPS, world, micro=case.accum)
    norms, step_bytes = [], []
    ops: dict[str, int] = {}
    for step in data:
        before = _model_bytes(engine)
        ops = {op: s.bytes for op, s in engine.comm.stats.ops.items()}
        for micro in step:
            tokens = micro[rank]
            engine.backward(lm_loss(engine(tokens), tokens))
            result = engine.step(report_grad_norm=True)
        step_bytes.append(_model_bytes(engine) - before)
        norms.append(result.grad_norm)
    # The last step's bytes by op (the first also broadcasts the initial values).
    ops_per_step = {op: s.bytes - ops.get(op, 0) for op, s in engine.comm.stats.ops.items()}
    mem = engine.accounting().memory_report()
    got = engine.full_state_dict()

    def no_decay(n: str) -> bool:
        return any(fnmatch.fnmatchcase(n, p) for p in cfg.no_weight_decay)

    ref, _, ref_norms = reference_train(_model(case), data, _opt(case.optimizer), no_decay, case.clip)
    unit_bytes = {u.name: u.layout.padded * BYTES for u in engine.units}
    return {
        "got": got,
        "ref": ref,
        "norms": norms,
        "ref_norms": ref_norms,
        "step_bytes": step_bytes,
        "ops_per_step": ops_per_step,
        "memory": mem.model_dump(),
        "unit_bytes": unit_bytes,
        "prefetches": engine.accounting().prefetches,
        "reduce_scatters": engine.accounting().comm_report().get("reduce_scatter", {}).get("calls", 0) / len(data),
    }


def run_cases(rank: int, world: int, cases: list[Case]) -> list[dict]:
    return [run_case(rank, world, c) for c in cases]


def _check_parity(r: dict) -> None:
    assert set(r["got"]) == set(r["ref"])
    for name, ref in r["ref"].items():
        torch.testing.assert_close(r["got"][name], ref, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    norms, ref_norms = (torch.tensor(r[k], dtype=torch.float64) for k in ("norms", "ref_norms"))
    torch.testing.assert_close(norms, ref_norms, rtol=1e-5, atol=1e-7)


def _check_memory(r: dict) -> None:
    m = r["memory"]
    per_elem = m["bytes_per_weight"] + m["bytes_per_gradient"] + m["optimizer_multiplier"]
    slack = 0.02 * m["predicted_model_state_bytes"] + m["padding_elements"] * per_elem
    assert abs(m["model_state_bytes"] - m["predicted_model_state_bytes"]) <= slack, m
    for cat in ("parameter", "gradient", "optimizer"):
        measured, predicted = m[f"{cat}_bytes"], m[f"predicted_{cat}_bytes"]
        assert abs(measured - predicted) <= 0.02 * predicted + m["padding_elements"] * 12 + 64, (cat, m)


def _check_comm(r: dict, stage: int, world: int, skip_first: bool = False) -> None:
    """Bytes per step within 1% of 2Ψ(N-1)/N (stages 0-2) or 3Ψ(N-1)/N (stage 3), ring convention, with Ψ the
    flat buffers' elements (the parameters plus the alignment and shard padding, which travel with them); in stage 3
    less the root unit's backward gather, since it stays gathered from forward into backward."""
    psi_bytes = sum(r["unit_bytes"].values())
    factor = 3 if stage == Stage.PARAMETERS else 2
    expected = factor * psi_bytes * (world - 1) / world
    if stage == Stage.PARAMETERS:
        expected -= r["unit_bytes"].get("<root>", 0) * (world - 1) / world
    for moved in r["step_bytes"][1 if skip_first else 0 :]:
        assert abs(moved - expected) <= 0.01 * expected, (moved, expected)


@pytest.mark.slow
@pytest.mark.smoke
def test_every_stage_matches_adamw_on_two_ranks_with_tied_weights_and_uneven_sizes() -> None:
    cases = [Case(stage=s) for s in range(4)] + [Case(stage=3, prefetch=0)]
    cases += [Case(stage=s, bucket=BUCKET) for s in (1, 2, 3)]
    cases += [Case(stage=3, units=())]  # no unit classes: one root unit, gathered for forward and backward
    cases += [Case(stage=s, overlap=False) for s in (1, 3)]  # reductions blocking instead of async
    cases += [Case(stage=s, contiguous=False) for s in (2, 3)]  # autograd's own gradients, not the arenas
    per_rank = run_ranks(run_cases, 2, cases)
    for rank_results in per_rank:
        for case, r in zip(cases, rank_results, strict=True):
            assert r["memory"]["parameters"] % 2 == 1  # uneven: every unit is padded
            _check_parity(r)
            _check_memory(r)
            _check_comm(r, case.stage, 2)
    # Stage 3 gathers each unit before use and frees it after: at most the root plus two blocks
    # (the running one and the prefetched one) are ever gathered at once.
    stage3 = per_rank[0][3]
    block, root = stage3["unit_bytes"]["blocks.0"], stage3["unit_bytes"]["<root>"]
    assert stage3["memory"]["gathered_peak_bytes"] <= root + 2 * block
    assert stage3["memory"]["gathered_bytes"] == 0
    # ZeRO-R buckets: reductions and gathers in chunks of <= 64 elements, through at most two reused
    # buffers, move the same bytes (checked above) while holding a fraction of a unit for communication.
    for r in per_rank[0][5:8]:
        assert r["memory"]["comm_buffer_peak_bytes"] <= 4 * BUCKET * BYTES < block
    assert per_rank[0][2]["memory"]["comm_buffer_peak_bytes"] > block

    # Prefetch: every block's gather is issued one unit ahead, in forward and in backward (3 blocks,
    # 5 steps), so it overlaps the running unit's compute; without prefetch, one block at a time.
    assert stage3["prefetches"] == 5 * (3 + 3)
    no_prefetch = per_rank[0][4]
    assert no_prefetch["prefetches"] == 0
    assert no_prefetch["memory"]["gathered_peak_bytes"] <= root + block < stage3["memory"]["gathered_peak_bytes"]


@pytest.mark.slow
def test_four_ranks_with_accumulation_clipping_frozen_and_untied_params() -> None:
    frozen = ("blocks.1.norm.weight", "blocks.1.norm.bias", "embed.weight")
    cases = [Case(stage=s, tied=False, accum=2, clip=0.5, frozen=frozen) for s in range(4)]
    cases.append(Case(stage=3, tied=False, persistence=600, prefetch=2))
    cases.append(Case(stage=2, optimizer="sgd", clip=None))
    # Recomputed activations: the same numbers, and stage 3 still moves 3Ψ (one gather serves both).
    cases.append(Case(stage=3, checkpointing=True))
    cases += [Case(stage=s, tied=False, accum=3) for s in (2, 3)]
    cases += [Case(stage=s, tied=False, accum=3, extra={"gradient_sync": "boundary"}) for s in (2, 3)]
    for rank_results in run_ranks(run_cases, 4, cases):
        for r in rank_results:
            _check_parity(r)
        for case, r in zip(cases[:4], rank_results[:4], strict=True):
            frozen_numel = 13 * 10 + 2 * 10
            assert r["memory"]["parameters"] - frozen_numel > 0
            assert case.stage == r["memory"]["stage"]
        # Every unit's flat buffer has <= 600 elements, so all stay gathered (resident): nothing is freed, and a step
        # moves 2Ψ (reduce-scatter, then re-gather after the update) instead of 3Ψ, once the first
        # forward has gathered them.
        resident = rank_results[4]
        assert resident["memory"]["gathered_bytes"] == sum(resident["unit_bytes"].values())
        _check_comm(resident, stage=2, world=4, skip_first=True)
        _check_comm(rank_results[6], stage=3, world=4)
        # Gradient sync at the boundary only: one reduce-scatter per unit and step instead of one per micro-batch.
        every, boundary = rank_results[0 + 7 : 2 + 7], rank_results[2 + 7 :]
        for e, b in zip(every, boundary, strict=True):
            assert b["reduce_scatters"] * 3 == e["reduce_scatters"] == 3 * len(b["unit_bytes"]), (e, b)
