"""The pods of a ZeroTrainingJob (`spec.resources`, `spec.scheduling`, `spec.env`, `spec.volumeMounts`): what each
pod asks of its node and how the gang is scheduled."""

from __future__ import annotations

from enum import Enum

from pydantic import Field

from zerotrain._model import Rule, SpecModel

QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
"""A Kubernetes resource quantity (`8Gi`, `500m`)."""


class GangMode(str, Enum):
    """How the pods of a job are scheduled together."""

    NONE = "none"
    COSCHEDULING = "coscheduling"
    VOLCANO = "volcano"


class Resources(SpecModel):
    """Compute resources of one pod (all its local ranks together)."""

    rules = (
        Rule(
            "!has(self.gpuMemory) || (has(self.gpu) && self.gpu > 0)",
            lambda r: r.gpu_memory is None or r.gpu > 0,
            "gpuMemory is set but gpu is 0; request GPUs with resources.gpu or drop gpuMemory",
            ("gpu_memory", "gpu"),
        ),
    )

    cpu: str | None = Field(default=None, pattern=QUANTITY)
    """CPU request and limit per pod, a Kubernetes quantity (e.g. "8" or "500m")."""
    memory: str | None = Field(default=None, pattern=QUANTITY)
    """Memory request and limit per pod, a Kubernetes quantity (e.g. "64Gi")."""
    gpu: int = Field(default=0, ge=0)
    """`nvidia.com/gpu` per pod; normally equal to nprocPerNode."""
    gpu_memory: str | None = Field(default=None, pattern=QUANTITY)
    """Memory of one GPU (e.g. "80Gi"), used by admission to check the memory plan fits."""


class Toleration(SpecModel):
    """A Kubernetes toleration."""

    key: str | None = None
    """Taint key; empty with operator Exists matches every taint."""
    operator: str = Field(default="Equal", pattern="^(Equal|Exists)$")
    """Equal or Exists."""
    value: str | None = None
    """Taint value for Equal."""
    effect: str | None = Field(default=None, pattern="^(NoSchedule|PreferNoSchedule|NoExecute)$")
    """Taint effect to tolerate; empty means all."""
    toleration_seconds: int | None = None
    """For NoExecute: how long the pod stays bound after the taint appears."""


class Scheduling(SpecModel):
    """Placement of the job's pods."""

    rules = (
        Rule(
            "!has(self.gang) || self.gang != 'volcano' || !has(self.schedulerName) || self.schedulerName == 'volcano'",
            lambda s: s.gang != GangMode.VOLCANO or s.scheduler_name in (None, "volcano"),
            "gang=volcano needs schedulerName volcano; drop schedulerName or set it to volcano",
            ("gang", "scheduler_name"),
        ),
    )

    scheduler_name: str | None = None
    """Scheduler of the pods (set automatically for gang modes when empty)."""
    priority_class_name: str | None = None
    """PriorityClass of the pods."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the pods require."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints the pods tolerate."""
    gang: GangMode = GangMode.NONE
    """Gang scheduling: none, coscheduling (scheduler-plugins PodGroup) or volcano (Volcano PodGroup)."""
    startup_timeout_seconds: int = Field(default=600, ge=1)
    """A pod Pending longer than this is reported in the Unschedulable condition."""


class EnvVar(SpecModel):
    """An environment variable for every rank."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Variable name."""
    value: str = ""
    """Variable value."""


class VolumeMount(SpecModel):
    """A volume mounted into the training container."""

    name: str
    """Name of a volume in `volumes`."""
    mount_path: str
    """Path in the container."""
    read_only: bool = False
    """Mount read-only."""
    sub_path: str | None = None
    """Sub-path of the volume to mount."""
