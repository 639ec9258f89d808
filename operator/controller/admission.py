"""Admission: is a job's spec valid, can its children be named, and do its model states fit its GPUs?"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from zerotrain import elastic
from zerotrain.errors import UserError
from zerotrain.manifest import parse_spec
from zerotrain.operator.children import builders, naming, pod_template
from zerotrain.operator.controller.conditions import Reason
from zerotrain.plan import host as host_plan
from zerotrain.plan.inputs import (
    declared_parameters,
    gpu_memory_bytes,
    memory_plan,
    min_world_size,
    model_units,
    more_ranks,
    plan_input,
)
from zerotrain.plan.model_states import MemoryPlan, PlanInput, min_data_parallel
from zerotrain.plan.stage_choice import NoStageFits, StageChoice, resolve_stage
from zerotrain.quantity import format_bytes
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.zero_config import AutoStage, Stage


@dataclass(frozen=True)
class Admission:
    """The verdict: a parsed spec and its memory plan, or the reason and message of a refusal."""

    spec: ZeroTrainingJobSpec | None
    """The spec the ranks read: `stage: auto` replaced by the chosen stage, the manifest's replicas (from which an
    elastic gang's ranks derive their layout)."""
    replicas: int | None = None
    """Pods of the gang in force: spec.replicas, or the size an elastic job runs at now."""
    plan: MemoryPlan | None = None
    reason: str | None = None
    message: str = ""
    stage_choice: StageChoice | None = None
    """What `stage: auto` resolved to, and why (None for a fixed stage)."""

    @property
    def admitted(self) -> bool:
        return self.reason is None

    @property
    def sized(self) -> ZeroTrainingJobSpec | None:
        """The spec as the gang in force runs it (its replicas and accumulation), for its pods, status and plan."""
        if self.spec is None or self.replicas is None:
            return self.spec
        return builders.at_replicas(self.spec, self.replicas)


def plan_for(spec: ZeroTrainingJobSpec, default_gpu_memory: str | None) -> tuple[MemoryPlan, PlanInput] | None:
    """The planner's verdict when the parameter count (or shape) and a GPU's memory are known, else None; ValueError
    naming the field when the GPU memory is not a quantity or the shape contradicts the parameter count."""
    memory = spec.resources.gpu_memory or (default_gpu_memory if spec.resources.gpu > 0 else None)
    if declared_parameters(spec) is None or memory is None:
        return None
    try:
        device = gpu_memory_bytes(memory)
    except ValueError as e:
        raise ValueError(f"resources.gpuMemory: {e}") from None
    return memory_plan(spec, device), plan_input(spec, device)


def _min_ranks(spec: ZeroTrainingJobSpec, stage: Stage, p: PlanInput, usable: int) -> int | None:
    """The fewest ranks at which `stage` fits: by the whole peak when the model's units are known."""
    if model_units(spec) is not None:
        return min_world_size(spec, stage, usable)
    return min_data_parallel(stage, p, usable)


def _does_not_fit(spec: ZeroTrainingJobSpec, result: MemoryPlan, p: PlanInput) -> str | None:
    stage = spec.zero.fixed_stage
    chosen = result.stages[stage]
    if chosen.fits is not False or result.usable_memory is None:
        return None
    usable = result.usable_memory
    fixes = []
    if result.recommended_stage is not None:
        fixes.append(f"set spec.zero.stage to {result.recommended_stage.value}")
    ranks = _min_ranks(spec, stage, p, usable)
    if ranks is not None:
        fixes.append(f"keep stage {stage.value} with {more_ranks(spec, ranks)}")
    elif result.recommended_stage is None and (ranks := _min_ranks(spec, Stage.PARAMETERS, p, usable)):
        fixes.append(f"set spec.zero.stage to 3 with {more_ranks(spec, ranks)}")
    # The same stage on GPUs of more memory: what the device's headroom leaves must hold the peak.
    gpus = math.ceil(chosen.required_bytes / (usable / (result.device_memory or usable)) / 2**30)
    fixes.append(f"keep stage {stage.value} on GPUs of at least {gpus}Gi (resources.gpuMemory)")
    fix = "; or ".join(fixes)
    what = "at its peak" if chosen.peak is not None else "of model states"
    return (
        f"spec.zero.stage: stage {stage.value} needs {format_bytes(chosen.required_bytes)} {what} per GPU "
        f"with {spec.world_size} ranks, more than the {format_bytes(usable)} usable of "
        f"{format_bytes(result.device_memory or 0)}; {fix}"
    )


def pod_problems(spec: ZeroTrainingJobSpec, job_name: str, allow_host_path: bool) -> list[str]:
    """What in the spec's pod template and volumes the operator refuses to build pods from."""
    out = [
        pod_template.host_path_problem(f"spec.volumes[{v.get('name')}]")
        for v in spec.volumes
        if "hostPath" in v and not allow_host_path
    ]
    if spec.pod_template:
        built = builders.operator_pod(builders.JobRef(job_name, "", ""), spec, replica=0, gang=0)
        out += pod_template.problems(spec.pod_template, built, set(builders.FIXED_ENV), allow_host_path)
    return out


def in_force(spec: ZeroTrainingJobSpec, replicas: int | None) -> int:
    """The size the gang runs at: `replicas` (an elastic job's current size) while the manifest allows it, else
    spec.replicas."""
    if spec.elastic is None or replicas is None:
        return spec.replicas
    allowed = elastic.sizes(spec.replicas, spec.nproc_per_node, spec.zero.gradient_accumulation_steps, spec.elastic)
    return replicas if replicas in allowed else spec.replicas


NO_IMAGE = (
    "spec.image: missing; the pods run it: set the runtime image (the chart's runtimeImage, e.g. "
    "ghcr.io/zerotrain/runtime:0.1.0) or an image built FROM it with your code (`zerotrain run` needs none)"
)


def admit(
    raw_spec: Any,
    job_name: str,
    default_gpu_memory: str | None = None,
    allow_host_path: bool = False,
    stage_floor: Stage | None = None,
    replicas: int | None = None,
    recompute: bool = False,
) -> Admission:
    """Validate `raw_spec` as the operator receives it, planned for a gang of `replicas` pods when the job is
    elastic and allows that size (`in_force`), with activation checkpointing on when `stage: auto` turned it on
    (`recompute`); never raises for bad input."""
    try:
        manifest = parse_spec(raw_spec)
    except UserError as e:
        return Admission(spec=None, reason=Reason.INVALID_SPEC, message=str(e))
    if manifest.image is None:
        return Admission(spec=manifest, reason=Reason.INVALID_SPEC, message=NO_IMAGE)
    if recompute and manifest.zero.stage is AutoStage.AUTO:
        zero = manifest.zero.model_copy(update={"activation_checkpointing": True})
        manifest = manifest.model_copy(update={"zero": zero})
    size = in_force(manifest, replicas)
    verdict = _admit_sized(
        builders.at_replicas(manifest, size), job_name, default_gpu_memory, allow_host_path, stage_floor
    )
    if verdict.spec is None:
        return verdict
    # What the ranks read: the stage chosen at the size in force, the manifest's size and accumulation.
    zero = verdict.spec.zero.model_copy(
        update={"gradient_accumulation_steps": manifest.zero.gradient_accumulation_steps}
    )
    runs = verdict.spec.model_copy(update={"replicas": manifest.replicas, "zero": zero})
    return dataclasses.replace(verdict, spec=runs, replicas=size)


def _admit_sized(
    spec: ZeroTrainingJobSpec,
    job_name: str,
    default_gpu_memory: str | None,
    allow_host_path: bool,
    stage_floor: Stage | None,
) -> Admission:
    largest = max(spec.replicas, spec.elastic.max_replicas if spec.elastic else 0)
    if problem := naming.name_problem(job_name, largest):
        return Admission(spec=spec, reason=Reason.INVALID_NAME, message=problem)
    if problems := pod_problems(spec, job_name, allow_host_path):
        return Admission(spec=spec, reason=Reason.INVALID_POD_TEMPLATE, message="; ".join(problems))
    if refusal := host_plan.below_baseline(spec):
        return Admission(spec=spec, reason=Reason.MEMORY_PLAN_DOES_NOT_FIT, message=refusal)
    try:
        spec, choice = resolve_stage(spec, default_gpu_memory, floor=stage_floor)
    except NoStageFits as e:
        return Admission(spec=spec, reason=Reason.MEMORY_PLAN_DOES_NOT_FIT, message=str(e))
    except ValueError as e:
        return Admission(spec=spec, reason=Reason.INVALID_SPEC, message=str(e))
    try:
        planned = plan_for(spec, default_gpu_memory)
    except ValueError as e:
        return Admission(spec=spec, reason=Reason.INVALID_SPEC, message=str(e))
    # The pod's host memory: every rank's process, its start-up, a CPU rank's training peak, offloaded states.
    if refusal := host_plan.refusal(spec, host_plan.host_plan(spec)):
        return Admission(spec=spec, reason=Reason.MEMORY_PLAN_DOES_NOT_FIT, message=refusal)
    if planned is None:
        return Admission(spec=spec, stage_choice=choice)
    result, p = planned
    if refusal := _does_not_fit(spec, result, p):
        return Admission(spec=spec, plan=result, reason=Reason.MEMORY_PLAN_DOES_NOT_FIT, message=refusal)
    return Admission(spec=spec, plan=result, stage_choice=choice)
