"""`zero.stage: auto`: the lowest ZeRO stage whose whole-peak plan fits each rank's device, chosen before anything
runs (by the operator's admission, `zerotrain run` and `zerotrain validate`), so ranks always run a concrete stage.

The lowest stage that fits moves the least: stages 0-2 send 2Ψ per step, stage 3 3Ψ, and each stage up shards one
more model state. A rank's device is its GPU (`resources.gpuMemory`, or the operator's default for GPU jobs), or
for CPU ranks its share of the pod's memory limit (`resources.memory` over `nprocPerNode`) less the rank process
itself (`process_baseline`), less the plan's headroom. Nothing fitting is refused, naming the smallest world size
at which stage 3 would fit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from zerotrain.hf_config import HF_ENTRYPOINT
from zerotrain.plan.inputs import (
    at_stage,
    declared_parameters,
    gpu_memory_bytes,
    lowest_stage,
    memory_plan,
    min_world_size,
    model_units,
    more_ranks,
    plan_input,
)
from zerotrain.plan.model_states import DEFAULT_HEADROOM, StagePlan, min_data_parallel
from zerotrain.plan.process_baseline import baseline_bytes
from zerotrain.quantity import format_bytes
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.zero_config import AutoStage, Stage


@dataclass(frozen=True)
class StageChoice:
    """The stage `auto` resolved to, and why, in the words status and the console show."""

    stage: Stage
    message: str


class NoStageFits(ValueError):
    """Even stage 3 does not fit the device at this world size."""


def rank_memory(spec: ZeroTrainingJobSpec, default_gpu_memory: str | None = None) -> int | None:
    """Bytes one rank's tensors have on its device: its GPU's memory, or for CPU ranks their share of the pod's
    memory limit less the rank process's own baseline (`process_baseline`)."""
    if spec.resources.gpu > 0:
        memory = spec.resources.gpu_memory or default_gpu_memory
        return gpu_memory_bytes(memory) if memory else None
    share = pod_memory_share(spec)
    return None if share is None else cpu_tensor_memory(share, spec)


def cpu_tensor_memory(share: int, spec: ZeroTrainingJobSpec) -> int:
    """What a CPU rank's tensors have of its `share`, once the planner's headroom comes off: the headroom is kept on
    the whole process (`host_plan`), so the baseline is taken before it, scaled up."""
    return max(1, share - round(baseline_bytes(spec) / (1 - DEFAULT_HEADROOM)))


def pod_memory_share(spec: ZeroTrainingJobSpec) -> int | None:
    """One rank's share of the pod's memory limit (resources.memory over nprocPerNode), when the spec sets one."""
    return gpu_memory_bytes(spec.resources.memory) // spec.nproc_per_node if spec.resources.memory else None


def _stage_plans(spec: ZeroTrainingJobSpec, device_memory: int) -> tuple[int, list[StagePlan]]:
    """The usable bytes (the planner's headroom applied) and each stage's plan, each stage planned as itself:
    gradient bytes per element differ between stages 0/1 and 2/3."""
    jobs = [memory_plan(at_stage(spec, s), device_memory) for s in Stage]
    usable = jobs[0].usable_memory
    assert usable is not None  # a device memory was given
    return usable, [job.stages[s] for job, s in zip(jobs, Stage, strict=True)]


def choose_stage(spec: ZeroTrainingJobSpec, device_memory: int, floor: Stage = Stage.DATA_PARALLEL) -> StageChoice:
    """The lowest stage from `floor` whose plan (the whole peak when the shape is known, else the model states)
    fits `device_memory` less headroom; NoStageFits naming the smallest world size where stage 3 fits."""
    usable, plans = _stage_plans(spec, device_memory)
    budget = f"{format_bytes(usable)} usable of {format_bytes(device_memory)}"
    for sp in plans[floor:]:
        if sp.fits:
            lower = ""
            if sp.stage > floor:
                lower = f"; stage {sp.stage.value - 1} would need {format_bytes(plans[sp.stage - 1].required_bytes)}"
            what = "at its peak" if sp.peak is not None else "of model states"
            if sp.stage == floor > Stage.DATA_PARALLEL:
                lower = f"; stage {floor.value - 1} ran out of memory"
            return StageChoice(
                sp.stage, f"stage {sp.stage.value}: {format_bytes(sp.required_bytes)} {what} of {budget}{lower}"
            )
    if model_units(spec) is not None:
        ranks = min_world_size(at_stage(spec, Stage.PARAMETERS), Stage.PARAMETERS, usable)
    else:
        ranks = min_data_parallel(Stage.PARAMETERS, plan_input(at_stage(spec, Stage.PARAMETERS), device_memory), usable)
    need = format_bytes(plans[Stage.PARAMETERS].required_bytes)
    if ranks is None:
        where = "at no world size (what every rank holds whole does not fit); use devices with more memory"
    else:
        where = f"with {more_ranks(spec, ranks)}"
    memory = ""
    if spec.resources.gpu == 0 and spec.resources.memory:  # CPU ranks: a larger share is a fix of its own
        from zerotrain.plan.host import mebibytes, smallest_memory

        memory = f", or set resources.memory to at least {mebibytes(smallest_memory(spec))}"
    raise NoStageFits(
        f"spec.zero.stage: auto: no stage fits {budget} per rank with {spec.world_size} ranks (stage 3 needs "
        f"{need}); stage 3 fits {where}{memory}, or turn on zero.activationCheckpointing or lower the micro-batch"
    )


def local_rank_memory(spec: ZeroTrainingJobSpec, nproc: int) -> int:
    """Bytes one rank of `zerotrain run` has for its tensors: local ranks are CPU processes, each with its share of
    resources.memory (as in a pod), or of this machine's memory when the manifest sets none, less its process."""
    share = pod_memory_share(spec)
    if share is None:
        share = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(1, nproc)
    return cpu_tensor_memory(share, spec)


def resolve_stage(
    spec: ZeroTrainingJobSpec,
    default_gpu_memory: str | None = None,
    device_memory: int | None = None,
    floor: Stage | None = None,
) -> tuple[ZeroTrainingJobSpec, StageChoice | None]:
    """The spec with `stage: auto` replaced by the chosen stage (unchanged with a fixed stage, and no choice),
    planned against `device_memory` bytes per rank, else the spec's (`rank_memory`); ValueError naming the field
    when the device memory or the parameter count needed to choose is unknown."""
    if spec.zero.stage is not AutoStage.AUTO:
        return spec, None
    if spec.entrypoint == HF_ENTRYPOINT and spec.model.architecture is None and spec.model.shape is None:
        # The operator plans from the manifest alone: a stage chosen from a config only this machine reads, or
        # from the model states alone, would not be the stage admission chooses, nor one that fits.
        raise ValueError(
            "spec.zero.stage: auto plans a Hugging Face model from spec.model.architecture, which the manifest "
            "lacks: write it with `zerotrain plan -f JOB --fill` (for a family the plan does not count, give "
            "spec.model.shape and spec.model.activationBytes from `zerotrain plan -f JOB --measure`), or choose a "
            "stage (0-3)"
        )
    if declared_parameters(spec) is None:
        raise ValueError(
            "spec.zero.stage: auto needs the model's size: set spec.model.architecture (`zerotrain plan -f JOB "
            "--fill` writes it from a Hugging Face config.json), spec.model.parameters or spec.model.shape, or "
            "choose a stage (0-3)"
        )
    device = device_memory if device_memory is not None else rank_memory(spec, default_gpu_memory)
    if device is None:
        raise ValueError(
            "spec.zero.stage: auto needs each rank's device memory: set resources.gpuMemory (GPU ranks) or "
            "resources.memory (CPU ranks share it), or choose a stage (0-3)"
        )
    lowest = max(floor or Stage.DATA_PARALLEL, lowest_stage(spec))  # where the job's offload can run
    choice = choose_stage(spec, device, lowest)
    return at_stage(spec, choice.stage), choice
