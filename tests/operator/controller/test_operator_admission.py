"""Admission: spec errors with field paths, job-name limits, and the memory plan's verdict."""

from __future__ import annotations

from typing import Any

import pytest

from zerotrain.operator.controller.admission import admit
from zerotrain.operator.controller.conditions import Reason
from zerotrain.plan.inputs import gpu_memory_bytes as parse_quantity
from zerotrain.zero_config import Stage

BASE: dict[str, Any] = {"image": "i", "entrypoint": "m:f", "replicas": 2, "nprocPerNode": 8}
BIG = {"model": {"parameters": 7_500_000_000}, "resources": {"gpu": 8}}


@pytest.mark.parametrize(("text", "value"), [("80Gi", 80 * 2**30), ("40G", 40 * 10**9), ("1.5Ki", 1536), ("7", 7)])
def test_parse_quantity(text: str, value: int) -> None:
    assert parse_quantity(text) == value


def test_invalid_spec_names_the_field() -> None:
    verdict = admit({**BASE, "replicas": 0}, "job")
    assert verdict.reason == Reason.INVALID_SPEC and verdict.spec is None
    assert verdict.message.startswith("spec.replicas: got 0")


def test_name_too_long_for_hostnames() -> None:
    verdict = admit(BASE, "x" * 60)
    assert verdict.reason == Reason.INVALID_NAME and "at most 54 characters" in verdict.message


def test_no_plan_without_parameters_or_memory() -> None:
    assert admit(BASE, "job").plan is None
    assert admit({**BASE, **BIG}, "job").plan is None  # no GPU memory known anywhere


@pytest.mark.parametrize("where", ["spec", "settings"])
def test_plan_from_spec_or_operator_default(where: str) -> None:
    spec = {**BASE, **BIG, "zero": {"stage": 3}}
    if where == "spec":
        spec["resources"] = {"gpu": 8, "gpuMemory": "80Gi"}
    verdict = admit(spec, "job", default_gpu_memory="80Gi" if where == "settings" else None)
    assert verdict.admitted and verdict.plan is not None
    assert verdict.plan.data_parallel == 16 and verdict.plan.device_memory == 80 * 2**30


def test_stage_that_cannot_fit_is_refused_with_what_would() -> None:
    spec = {**BASE, **BIG, "zero": {"stage": 0}, "resources": {"gpu": 8, "gpuMemory": "16Gi"}}
    verdict = admit(spec, "job")
    assert verdict.reason == Reason.MEMORY_PLAN_DOES_NOT_FIT and verdict.plan is not None
    assert verdict.message.startswith("spec.zero.stage: stage 0 needs")
    # Stage 0 never fits by adding replicas; a GPU of 150 GB would hold it (120 GB with 20% headroom).
    assert verdict.message.endswith("; set spec.zero.stage to 3; or keep stage 0 on GPUs of at least 140Gi "
                                    "(resources.gpuMemory)"), verdict.message  # fmt: skip


def test_too_few_replicas_for_the_stage_names_the_count() -> None:
    spec = {**BASE, "replicas": 1, "nprocPerNode": 1, "resources": {"gpu": 1, "gpuMemory": "16Gi"}}
    verdict = admit({**spec, "model": {"parameters": 70_000_000_000}, "zero": {"stage": 3}}, "job")
    assert verdict.reason == Reason.MEMORY_PLAN_DOES_NOT_FIT
    # fp32 AdamW: 4 + 4 + 8 = 16 bytes per parameter, 1.12 TB over 13.7 GB usable per GPU.
    assert "keep stage 3 with at least 82 replicas (82 ranks)" in verdict.message


def test_cpu_job_ignores_the_gpu_default() -> None:
    assert admit({**BASE, "nprocPerNode": 1, **BIG, "resources": {}}, "job", "80Gi").plan is None


ELASTIC: dict[str, Any] = {
    **BASE,
    "replicas": 4,
    "zero": {"stage": "auto", "gradientAccumulationSteps": 3},
    "elastic": {"minReplicas": 2, "maxReplicas": 4},
    "checkpoint": {"claimName": "ckpt"},
    "model": {"parameters": 7_500_000_000},
    "resources": {"gpu": 8, "gpuMemory": "80Gi"},
}


def test_an_elastic_job_is_planned_at_its_size_in_force_and_its_ranks_keep_the_manifests() -> None:
    at4, at2 = admit(ELASTIC, "job"), admit(ELASTIC, "job", replicas=2)
    assert at4.admitted and at2.admitted and at4.replicas == 4 and at2.replicas == 2
    assert at2.spec is not None and at2.spec.replicas == 4  # what the ranks read: the manifest's size
    assert at2.sized is not None and at2.sized.world_size == 16
    # The 2-pod gang's ranks run 6 micro-batches (4 × 3 / 2): its plan counts that; what they read keeps 3.
    assert at2.sized.zero.gradient_accumulation_steps == 6 and at2.spec.zero.gradient_accumulation_steps == 3
    # Fewer ranks shard less: the plan (and stage auto's choice) is the smaller gang's.
    assert at4.plan is not None and at2.plan is not None
    assert at2.plan.stages[3].required_bytes > at4.plan.stages[3].required_bytes
    assert at4.spec is not None and at2.spec.zero.fixed_stage >= at4.spec.zero.fixed_stage


@pytest.mark.parametrize("replicas", [1, 5, None])
def test_a_size_the_manifest_does_not_allow_is_the_manifests_own(replicas: int | None) -> None:
    assert admit(ELASTIC, "job", replicas=replicas).replicas == 4  # outside [2, 4] (or unknown)
    assert admit({**BASE, "replicas": 2}, "job", replicas=3).replicas == 2  # not elastic at all


def test_an_elastic_job_names_its_largest_pod_within_the_hostname_limit() -> None:
    verdict = admit({**ELASTIC, "replicas": 2, "elastic": {"minReplicas": 2, "maxReplicas": 12}}, "x" * 54)
    assert verdict.reason == Reason.INVALID_NAME and "x-worker-11" in verdict.message.replace("x" * 54, "x")


def test_stage_auto_s_recompute_turns_on_activation_checkpointing_only_for_auto() -> None:
    auto = {**BASE, **BIG, "zero": {"stage": "auto"}, "resources": {"gpu": 8, "gpuMemory": "80Gi"}}
    on = admit(auto, "job", stage_floor=Stage.PARAMETERS, recompute=True)
    assert on.admitted and on.spec is not None and on.spec.zero.activation_checkpointing
    off = admit(auto, "job", stage_floor=Stage.PARAMETERS)
    assert off.spec is not None and not off.spec.zero.activation_checkpointing
    fixed = admit({**auto, "zero": {"stage": 3}}, "job", recompute=True)
    assert fixed.spec is not None and not fixed.spec.zero.activation_checkpointing  # a fixed stage is the user's
