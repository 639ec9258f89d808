"""Optimizer offload (`zero.offload.optimizer: cpu`) on real gloo ranks: the fp32 master and the optimizer state live
in host buffers of their own, the step runs there on the gradients copied out of the reduced shards, and the updated
values are copied back into the compute parameters. Stages 1-3, fp32 and bf16, with accumulation and clipping, train
as single-process AdamW; the memory report counts those states on the host, not the device, as the plan says; a
checkpoint of an offloaded run loads into one that is not, and the other way round.

On this CPU-only machine host and device are the same memory, so what is tested is the mechanism and its numerics
(separate buffers, the copies, the step on them); what it saves on a GPU is the GPU check's to measure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_helpers import run_ranks
from test_reshard import resume_two_more, save_after_three
from test_stages import STEPS, Case, _check_parity, engine_for, run_case
from tiny_models import batches, lm_loss

OFFLOAD = {"offload": {"optimizer": "cpu"}}
PARAMS = {"offload": {"optimizer": "cpu", "parameters": "cpu"}}
BF16 = {"precision": "bf16"}
PARITY_CASES = 6


def trained(rank: int, world: int, case: Case) -> dict[str, object]:
    """The case's parameters after its steps, and what its memory report counted (no reference run)."""
    engine = engine_for(case)
    for step in batches(STEPS, world, micro=case.accum):
        for micro in step:
            engine.backward(lm_loss(engine(micro[rank]), micro[rank]))
        engine.step()
    return {"got": engine.full_state_dict(), "memory": engine.accounting().memory_report().model_dump()}


def offload_cases(rank: int, world: int) -> list[dict]:
    cases = [
        Case(stage=1, extra=OFFLOAD),
        Case(stage=2, tied=False, accum=2, clip=0.5, extra=OFFLOAD),
        Case(stage=3, accum=2, extra=OFFLOAD),
        Case(stage=3, bucket=64, overlap=False, extra=OFFLOAD),
        Case(stage=3, accum=2, clip=0.5, extra=PARAMS),
        Case(stage=3, persistence=10**6, bucket=64, extra=PARAMS),  # resident units: re-gathered after each step
    ]
    out = [run_case(rank, world, c) for c in cases]
    # bf16: the host step sees the same fp32 gradients and masters as the device step would, so offloading changes
    # no bit (every "device" is the CPU here: the same kernels run either way).
    for stage, extra in ((2, {}), (2, OFFLOAD), (3, {}), (3, OFFLOAD), (3, PARAMS)):
        out.append(trained(rank, world, Case(stage=stage, accum=2, extra={**BF16, **extra})))
    engine = engine_for(Case(stage=3, extra=OFFLOAD))
    params = {p.untyped_storage().data_ptr() for u in engine.units for p in u.params}
    opt = {p.untyped_storage().data_ptr() for g in engine.optimizer.param_groups for p in g["params"]}
    masters = {u.master.untyped_storage().data_ptr() for u in engine.units}
    grads = {u.grad_shard.untyped_storage().data_ptr() for u in engine.units}
    host_grads = {g["params"][0].grad.untyped_storage().data_ptr() for g in engine.optimizer.param_groups}
    out.append(
        {
            "optimizer_steps_on_masters": opt <= masters,
            "masters_apart": not masters & params,
            "grads_apart": not host_grads & grads,
            "masters_on": sorted({str(u.master.device) for u in engine.units}),
        }
    )
    engine = engine_for(Case(stage=3, extra={**BF16, **PARAMS}))
    full = {u.full.data.untyped_storage().data_ptr() for u in engine.units if u.full.nbytes()}
    shards = {u.shard.untyped_storage().data_ptr() for u in engine.units if u.shard is not None}
    out.append({"shards_apart": not shards & full and len(shards) == len(engine.units)})
    return out


def _near(measured: int, predicted: int, padding: int) -> bool:
    return abs(measured - predicted) <= 0.02 * predicted + padding


@pytest.mark.slow
def test_offloaded_states_train_as_adamw_and_are_held_on_the_host() -> None:
    for results in run_ranks(offload_cases, 2, timeout=300):
        for r in results[:PARITY_CASES]:
            _check_parity(r)
            m = r["memory"]
            assert m["optimizer_bytes"] == 0 and m["predicted_optimizer_bytes"] == 0, m
            assert m["host_optimizer_bytes"] > 0
            # the master and Adam's two moments of the padded shard
            assert _near(m["host_optimizer_bytes"], m["predicted_host_optimizer_bytes"], m["padding_elements"] * 12)
        for r in results[4:PARITY_CASES]:  # fp32 parameters offloaded: the master is the shard, off the device
            m = r["memory"]
            assert m["parameter_bytes"] == m["predicted_parameter_bytes"] == 0, m
            assert m["host_parameter_bytes"] == m["predicted_host_parameter_bytes"] == 0, m
        bf16 = results[PARITY_CASES : PARITY_CASES + 5]
        for r in bf16[1:2] + bf16[3:]:
            for name, value in r["got"].items():
                base = (bf16[0] if r is bf16[1] else bf16[2])["got"][name]
                assert torch.equal(value, base), name
        m = bf16[4]["memory"]  # bf16 parameters offloaded: the 2-byte shard is on the host, none on the device
        assert m["parameter_bytes"] == m["predicted_parameter_bytes"] == 0, m
        assert m["host_parameter_bytes"] > 0
        assert _near(m["host_parameter_bytes"], m["predicted_host_parameter_bytes"], m["padding_elements"] * 2), m
        layout, shards = results[-2], results[-1]
        assert layout["optimizer_steps_on_masters"] and layout["masters_apart"] and layout["grads_apart"], layout
        assert layout["masters_on"] == ["cpu"]
        assert shards["shards_apart"], shards


def _checkpoints(rank: int, world: int, root: str) -> list[dict[str, object]]:
    """Saved offloaded and loaded plain; saved plain and loaded offloaded (one spawn)."""
    save_after_three(rank, world, f"{root}/off", 3, None, None, OFFLOAD["offload"])
    plain = resume_two_more(rank, world, f"{root}/off", 2, world)
    save_after_three(rank, world, f"{root}/on", 2)
    return [plain, resume_two_more(rank, world, f"{root}/on", 3, world, None, OFFLOAD["offload"])]


@pytest.mark.slow
def test_an_offloaded_checkpoint_loads_without_offload_and_back(tmp_path: Path) -> None:
    for loads in run_ranks(_checkpoints, 2, str(tmp_path), timeout=300):
        for r in loads:
            _check_parity({**r, "norms": [], "ref_norms": []})
