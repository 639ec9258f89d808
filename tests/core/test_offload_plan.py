"""Offload in the one plan: the device holds no optimizer state and no step temporaries, the host holds
(K + 4)·Ψ/N per rank (and w·Ψ/N more for bf16 parameter shards), a pod whose memory cannot hold that is refused
naming the field, stage auto never picks a stage offload cannot run at, and CPU ranks (where it cannot help) are
refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from zerotrain.plan.host import host_plan
from zerotrain.plan.inputs import host_bytes_per_pod, memory_plan, peak_input
from zerotrain.plan.peak import peak_plan
from zerotrain.plan.stage_choice import resolve_stage
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.zero_config import Stage

SHAPE = {"layers": 4, "hidden": 128, "heads": 4, "sequenceLength": 128, "vocabulary": 256, "microBatchSize": 8}
GPU = {"gpu": 2, "gpuMemory": "80Gi"}


def _spec(zero: dict[str, Any], **kw: Any) -> ZeroTrainingJobSpec:
    base = {"image": "x", "entrypoint": "m:build", "nprocPerNode": 2, "resources": GPU, "model": {"shape": SHAPE}}
    return ZeroTrainingJobSpec.model_validate({**base, "zero": zero, **kw})


def test_the_device_holds_no_optimizer_state_and_the_host_holds_k_plus_4() -> None:
    for stage in (1, 2, 3):
        on = _spec({"stage": stage, "offload": {"optimizer": "cpu"}, "precision": "bf16"})
        off = _spec({"stage": stage, "precision": "bf16"})
        a, b = memory_plan(on).stages[stage], memory_plan(off).stages[stage]
        assert a.optimizer_bytes == 0 < b.optimizer_bytes
        assert a.parameter_bytes == b.parameter_bytes and a.gradient_bytes == b.gradient_bytes
        pa, pb = peak_plan(peak_input(on)), peak_plan(peak_input(off))  # type: ignore[arg-type]
        assert pa.optimizer_step == pa.fp32_gradients < pb.optimizer_step  # no device temporaries for the step
    spec = _spec({"stage": 3, "offload": {"optimizer": "cpu"}})
    psi = memory_plan(spec).parameters
    assert host_bytes_per_pod(spec) == round(2 * (8 + 4) * psi / 2)  # AdamW's moments and the fp32 master


def test_offloaded_parameters_leave_only_the_gathered_window_on_the_device() -> None:
    both = {"optimizer": "cpu", "parameters": "cpu"}
    on = _spec({"stage": 3, "offload": both, "precision": "bf16"})
    off = _spec({"stage": 3, "offload": {"optimizer": "cpu"}, "precision": "bf16"})
    a, b = memory_plan(on).stages[3], memory_plan(off).stages[3]
    assert a.parameter_bytes == 0 < b.parameter_bytes and a.gradient_bytes == b.gradient_bytes
    pa, pb = peak_plan(peak_input(on)), peak_plan(peak_input(off))  # type: ignore[arg-type]
    assert pa.parameters == 0 < pb.parameters
    assert pa.gathered_parameters == pb.gathered_parameters > 0  # the window is gathered on the device still
    assert pa.peak == pb.peak - pb.parameters
    psi = memory_plan(on).parameters
    assert host_bytes_per_pod(on) == round(2 * (8 + 4 + 2) * psi / 2)  # and the bf16 shard
    fp32 = _spec({"stage": 3, "offload": both})
    assert host_bytes_per_pod(fp32) == round(2 * (8 + 4) * psi / 2)  # the fp32 master is the shard


def test_a_pod_that_cannot_hold_the_offloaded_states_is_refused() -> None:
    from zerotrain.operator.controller.admission import admit

    raw = {
        "image": "x",
        "entrypoint": "m:build",
        "nprocPerNode": 2,
        "resources": {**GPU, "memory": "8Gi"},
        "model": {"parameters": 2_000_000_000},
        "zero": {"stage": 3, "offload": {"optimizer": "cpu"}},
    }
    verdict = admit(raw, "big")
    assert not verdict.admitted
    said = verdict.message
    assert (
        said.startswith("resources.memory: got '8Gi'; each rank needs") and "12.0 GB of offloaded model states" in said
    )
    smallest = host_plan(ZeroTrainingJobSpec.model_validate({**raw, "resources": GPU})).smallest_memory
    assert f"set resources.memory to at least {smallest >> 20}Mi" in said
    assert admit({**raw, "resources": {**GPU, "memory": f"{smallest >> 20}Mi"}}, "fits").admitted
    assert not admit({**raw, "resources": {**GPU, "memory": f"{(smallest >> 20) - 1}Mi"}}, "short").admitted


def test_stage_auto_with_offload_starts_at_stage_1_and_with_parameters_at_3() -> None:
    spec, choice = resolve_stage(_spec({"stage": "auto", "offload": {"optimizer": "cpu"}}))
    assert choice is not None and spec.zero.fixed_stage == Stage.OPTIMIZER_STATES
    both = {"optimizer": "cpu", "parameters": "cpu"}
    spec, choice = resolve_stage(_spec({"stage": "auto", "offload": both}))
    assert choice is not None and spec.zero.fixed_stage == Stage.PARAMETERS


@pytest.mark.parametrize(
    ("patch", "words"),
    [
        ({"zero": {"offload": {"optimizer": "cpu"}}, "resources": {"gpu": 0}}, "train on the CPU"),
        ({"zero": {"stage": 0, "offload": {"optimizer": "cpu"}}}, "offload.optimizer needs stage 1-3"),
        ({"zero": {"offload": {"optimizer": "nvme"}}}, "offload.optimizer"),
        ({"zero": {"stage": 2, "offload": {"optimizer": "cpu", "parameters": "cpu"}}}, "only stage 3 shards"),
        ({"zero": {"offload": {"parameters": "cpu"}}}, "offload.parameters needs offload.optimizer: cpu"),
    ],
)
def test_offload_where_it_cannot_help_is_refused_with_the_reason(patch: dict[str, Any], words: str) -> None:
    doc = {"image": "x", "entrypoint": "m:build", "resources": {"gpu": 1}, **patch}
    with pytest.raises(ValidationError, match=words):
        ZeroTrainingJobSpec.model_validate(doc)


def test_each_row_offloads_only_where_offload_runs_and_the_recommendation_starts_there() -> None:
    from rich.console import Console

    from zerotrain.commands.plan import render

    spec = _spec({"stage": 3, "precision": "bf16", "offload": {"optimizer": "cpu", "parameters": "cpu"}})
    result = memory_plan(spec)
    rows = result.stages
    assert rows[0].optimizer_bytes > 0 and rows[1].optimizer_bytes == rows[3].optimizer_bytes == 0
    assert rows[2].parameter_bytes > 0 and rows[3].parameter_bytes == 0
    assert result.recommended_stage == Stage.PARAMETERS  # every stage fits 80Gi; stage 3 is the lowest that can run
    assert "zero.offload runs from stage 3" in result.reason
    assert result.host_state_bytes == host_bytes_per_pod(spec) // 2 > 0
    console = Console(record=True, width=200)
    render(result, console)
    assert "offloaded model states (zero.offload):" in console.export_text()
