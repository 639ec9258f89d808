"""`plan_job`: the planner's front door (see the package)."""

from __future__ import annotations

from dataclasses import dataclass

from zerotrain.plan.host import HostPlan, host_plan
from zerotrain.plan.inputs import host_bytes_per_pod, memory_plan, planned_parameters
from zerotrain.plan.model_states import MemoryPlan
from zerotrain.plan.start_up import StartUpPlan, start_up_plan
from zerotrain.spec import ZeroTrainingJobSpec


@dataclass(frozen=True)
class JobPlan:
    """A job's plan, whole."""

    spec: ZeroTrainingJobSpec
    """The spec planned."""
    memory: MemoryPlan | None
    """Every stage: model states, the whole peak where the model's shape is known, and whether it fits; None when
    the model's size is unknown (no spec.model.parameters, shape or Hugging Face config)."""
    start_up: StartUpPlan | None
    """The start-up peak (None when Ψ is unknown)."""
    host: HostPlan
    """Each rank's host memory and the smallest pod memory that holds the pod's ranks."""


def plan_job(spec: ZeroTrainingJobSpec, device_memory: int | None = None) -> JobPlan:
    """The job's plan against `device_memory` per rank (None: the spec's resources.gpuMemory, or none)."""
    return JobPlan(
        spec=spec,
        memory=memory_plan(spec, device_memory) if planned_parameters(spec) is not None else None,
        start_up=start_up_plan(spec, host_bytes_per_pod(spec)),
        host=host_plan(spec),
    )
