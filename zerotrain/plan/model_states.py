"""The ZeRO memory planner: per-device model-state memory and communication volume by stage.

Pure arithmetic after the ZeRO paper (Rajbhandari et al., 2020), with Ψ parameters, data-parallel
size N, K optimizer-state bytes per parameter and the bytes of one weight and one gradient:

    stage 0  (w + g + K)·Ψ          stage 1  w·Ψ + g·Ψ + K·Ψ/N
    stage 2  w·Ψ + (g + K)·Ψ/N      stage 3  (w + g + K)·Ψ/N

Communication per step, in elements moved by each rank's collectives, is 2Ψ for stages 0-2
(all-reduce = reduce-scatter + all-gather) and 3Ψ for stage 3 (a second parameter all-gather in
backward). Activation recomputation in stage 3 costs one more all-gather (+Ψ) only when a recomputed
segment's parameters were freed before backward; the zerotrain runtime gathers a unit once for its
recompute and its backward, so it stays at 3Ψ.
"""

from __future__ import annotations

import math

from pydantic import Field

from zerotrain._model import SpecModel
from zerotrain.quantity import format_bytes
from zerotrain.zero_config import Stage

DEFAULT_HEADROOM = 0.2
MASTER_BYTES = 4.0
"""The fp32 master copy mixed precision keeps of every parameter (part of K)."""


def element_bytes(
    stage: Stage, compute_bytes: float, state_bytes: float, offload: bool = False, offload_parameters: bool = False
) -> tuple[float, float, float]:
    """(w, g, K): bytes per element of a weight, a gradient and the optimizer state the device holds between steps,
    as the zerotrain runtime holds them, from the compute dtype's size and the optimizer's own per-element state
    (fp32: Adam 8, SGD with momentum 4); with `offload` (zero.offload.optimizer) the device holds no optimizer state:
    K is 0; with `offload_parameters` (stage 3's zero.offload.parameters) it holds no parameter shard: w is 0 (the
    gathered window, in the compute dtype, is the whole-peak plan's).

    Weights are in the compute dtype. Stages 0/1 keep full gradients in the compute dtype; stages 2/3 keep only
    the fp32 shard the optimizer reads (whatever dtype the reduction ran in). K is the optimizer's state plus, under
    mixed precision, the fp32 master copy; in fp32 the parameters are their own master.
    """
    mixed = compute_bytes != 4.0
    g = compute_bytes if stage < Stage.GRADIENTS else 4.0
    if offload and stage >= Stage.OPTIMIZER_STATES:  # below it offload cannot run (nothing sharded to step)
        # The master and the state are on the host (`host_state_bytes`), and with them stage 3's parameter shard.
        return 0.0 if offload_parameters and stage == Stage.PARAMETERS else compute_bytes, g, 0.0
    return compute_bytes, g, state_bytes + (MASTER_BYTES if mixed else 0.0)


def host_state_bytes(state_bytes: float, offload: bool) -> float:
    """Host bytes per element of each rank's shard under optimizer offload: the optimizer state and the fp32 master,
    which is a copy of its own there even in fp32 (the device keeps the parameters)."""
    return state_bytes + MASTER_BYTES if offload else 0.0


def host_parameter_bytes(compute_bytes: float, offload_parameters: bool) -> float:
    """Host bytes per element of each rank's parameter shard under parameter offload, in the compute dtype; 0 in
    fp32, where the offloaded master is that shard."""
    return compute_bytes if offload_parameters and compute_bytes != MASTER_BYTES else 0.0


class PlanInput(SpecModel):
    """What the planner needs."""

    parameters: int = Field(ge=1)
    """Ψ, the model's parameter count."""
    data_parallel: int = Field(ge=1)
    """N, the data-parallel size (world size)."""
    optimizer_multiplier: float = Field(default=12.0, ge=0)
    """K, optimizer-state bytes per parameter (12: fp32 master copy, momentum and variance; 0: fp32 SGD without
    momentum)."""
    bytes_per_weight: float = Field(default=2.0, ge=0)
    """Bytes of one compute-precision weight (2 for fp16/bf16; 0 when the parameter shard is offloaded)."""
    bytes_per_gradient: float = Field(default=2.0, gt=0)
    """Bytes of one gradient element (2 for fp16/bf16)."""
    trainable_parameters: int | None = Field(default=None, ge=0)
    """Ψ_t, the parameters that train (a LoRA job's adapters); only these hold gradients and optimizer state. None:
    all Ψ (frozen parameters hold their weights only, in the compute dtype)."""
    device_memory: int | None = Field(default=None, ge=1)
    """Bytes of one device; enables the recommendation."""
    headroom: float = Field(default=DEFAULT_HEADROOM, ge=0, lt=1)
    """Fraction of device memory kept free: for the CUDA context, cuBLAS workspaces, NCCL's own buffers and
    allocator fragmentation (which no plan derives from the model), and, when the model's shape is unknown, for
    activations and the runtime's buffers too."""


class PeakPlan(SpecModel):
    """One rank's memory at its peak, by category (bytes)."""

    parameters: int
    """Parameter storage held between steps (padding included)."""
    gradients: int
    """Gradient storage held between steps."""
    optimizer: int
    """Optimizer state and the fp32 master."""
    communication_buffers: int
    """The pool's fixed buffers, allocated at the first step and kept."""
    gradient_arenas: int
    """Stages 2/3 with contiguous gradients: the arenas unsharded gradients land in, kept for the whole run, for
    the units of at most reduceBucketElements."""
    unsharded_gradients: int = 0
    """Stages 2/3: autograd's own unsharded gradients during backward, of the units the arenas do not serve."""
    fp32_gradients: int
    """Mixed-precision stages 0/1: fp32 gradients from their reduction to the step (and stage 1's full-size fp32
    accumulator with several micro-batches)."""
    gathered_parameters: int
    """Stage 3: full parameters gathered at once (root, running unit, prefetched units)."""
    activations: int
    """A micro-batch's activations and backward's working set, at their most."""
    optimizer_step: int
    """The optimizer's temporaries during the step."""
    host_activations: int = 0
    """Offloaded activation checkpoints, in host memory."""
    peak: int
    """The most bytes alive at once on this rank."""
    peak_phase: str
    """"backward" or "step": which moment sets the peak."""

    @property
    def model_states(self) -> int:
        return self.parameters + self.gradients + self.optimizer


class StagePlan(SpecModel):
    """One stage's cost per device."""

    stage: Stage
    """ZeRO stage."""
    model_state_bytes: int
    """Parameters + gradients + optimizer states on one device."""
    parameter_bytes: int
    """Weights held by one device."""
    gradient_bytes: int
    """Gradients held by one device."""
    optimizer_bytes: int
    """Optimizer states held by one device."""
    comm_elements_per_step: int
    """Elements each rank sends per optimizer step (Ψ multiples, before the (N-1)/N ring factor)."""
    comm_elements_with_recompute: int
    """The same when activation recomputation re-gathers freed parameters (stage 3 only differs)."""
    peak: PeakPlan | None = None
    """The whole peak per rank by category (`zerotrain.plan.peak`), when the model's shape is known."""
    fits: bool | None = None
    """Whether the whole peak (model states alone when the shape is unknown) fits within the usable device memory
    (null: no device memory given)."""

    @property
    def required_bytes(self) -> int:
        """What must fit: the whole peak when known, else the model states."""
        return self.peak.peak if self.peak is not None else self.model_state_bytes


class MemoryPlan(SpecModel):
    """The verdict for one job."""

    parameters: int
    """Ψ."""
    trainable_parameters: int | None = None
    """Ψ_t, the parameters that train (a LoRA job's adapters), when not all of them."""
    data_parallel: int
    """N."""
    optimizer_multiplier: float
    """K."""
    device_memory: int | None = None
    """Bytes of one device, when known."""
    usable_memory: int | None = None
    """Device memory less headroom."""
    stages: list[StagePlan]
    """Costs of stages 0-3."""
    recommended_stage: Stage | None = None
    """Lowest stage that fits (least communication); null if none fits or no device memory is known."""
    reason: str = ""
    """Why this stage, or what would fit."""
    host_state_bytes: int = 0
    """zero.offload: bytes of model states each rank keeps in host memory at the job's stage (fp32 masters and
    optimizer state, and bf16/fp16 parameter shards when parameters are offloaded); 0 without offload."""


# Which of (parameters, gradients, optimizer states) each stage partitions across the N ranks.
SHARDED: dict[Stage, tuple[bool, bool, bool]] = {
    Stage.DATA_PARALLEL: (False, False, False),
    Stage.OPTIMIZER_STATES: (False, False, True),
    Stage.GRADIENTS: (False, True, True),
    Stage.PARAMETERS: (True, True, True),
}


def _full_bytes(p: PlanInput) -> tuple[float, float, float]:
    """(parameter, gradient, optimizer) bytes of the whole, unpartitioned model: weights of all Ψ, gradients and
    optimizer state of the trainable Ψ_t."""
    psi = float(p.parameters)
    trains = psi if p.trainable_parameters is None else float(p.trainable_parameters)
    return p.bytes_per_weight * psi, p.bytes_per_gradient * trains, p.optimizer_multiplier * trains


def stage_bytes(stage: Stage, p: PlanInput) -> tuple[float, float, float]:
    """(parameter, gradient, optimizer) bytes per device for one stage."""
    w, g, k = (b / p.data_parallel if sharded else b for b, sharded in zip(_full_bytes(p), SHARDED[stage], strict=True))
    return w, g, k


def comm_elements(stage: Stage, parameters: int, recompute_regathers: bool = False) -> int:
    """Elements moved per step: 2Ψ for stages 0-2, 3Ψ for stage 3 (+Ψ if recompute re-gathers)."""
    if stage < Stage.PARAMETERS:
        return 2 * parameters
    return (4 if recompute_regathers else 3) * parameters


def min_data_parallel(stage: Stage, p: PlanInput, usable: float) -> int | None:
    """Smallest N at which `stage` fits in `usable` bytes, or None if no N does."""
    parts = list(zip(_full_bytes(p), SHARDED[stage], strict=True))
    fixed = sum(b for b, sharded in parts if not sharded)
    divisible = sum(b for b, sharded in parts if sharded)
    if fixed > usable or (divisible > 0 and fixed == usable):
        return None
    return 1 if divisible == 0 else max(1, math.ceil(divisible / (usable - fixed)))


def plan(
    p: PlanInput,
    peaks: list[PeakPlan] | None = None,
    inputs: list[PlanInput] | None = None,
    lowest: Stage = Stage.DATA_PARALLEL,
) -> MemoryPlan:
    """The per-stage costs and, with a device memory, the recommended stage and why; `peaks` (one per stage, from
    `zerotrain.plan.peak`) make the verdict about the whole peak instead of the model states. `inputs` (one per stage)
    give each stage its own bytes per element (a job's w, g and K depend on the stage it runs); the recommendation
    starts at `lowest` (offload runs from stage 1, parameter offload at 3)."""
    usable = None if p.device_memory is None else int(p.device_memory * (1 - p.headroom))
    stages = []
    for stage in Stage:
        pb, gb, ob = stage_bytes(stage, inputs[stage] if inputs is not None else p)
        total = pb + gb + ob
        peak = peaks[stage] if peaks is not None else None
        required = peak.peak if peak is not None else total
        stages.append(
            StagePlan(
                stage=stage,
                model_state_bytes=round(total),
                parameter_bytes=round(pb),
                gradient_bytes=round(gb),
                optimizer_bytes=round(ob),
                comm_elements_per_step=comm_elements(stage, p.parameters),
                comm_elements_with_recompute=comm_elements(stage, p.parameters, recompute_regathers=True),
                peak=peak,
                fits=None if usable is None else required <= usable,
            )
        )
    result = MemoryPlan(
        parameters=p.parameters,
        trainable_parameters=p.trainable_parameters,
        data_parallel=p.data_parallel,
        optimizer_multiplier=p.optimizer_multiplier,
        device_memory=p.device_memory,
        usable_memory=usable,
        stages=stages,
    )
    if usable is not None:
        result.recommended_stage, result.reason = _recommend(p, stages, usable, lowest)
    return result


def _recommend(p: PlanInput, stages: list[StagePlan], usable: int, lowest: Stage) -> tuple[Stage | None, str]:
    budget = f"{format_bytes(usable)} usable ({format_bytes(p.device_memory or 0)} less {p.headroom:.0%} headroom)"
    for sp in stages[lowest:]:
        if sp.fits:
            what = "at its peak" if sp.peak is not None else "of model states"
            lower = f" (zero.offload runs from stage {lowest.value})" if lowest > Stage.DATA_PARALLEL else ""
            if sp.stage > lowest:
                prev = stages[sp.stage - 1]
                lower = f"; stage {prev.stage.value} would need {format_bytes(prev.required_bytes)}"
            comm = "2Ψ" if sp.stage < Stage.PARAMETERS else "3Ψ"
            return sp.stage, (
                f"stage {sp.stage.value} is the lowest that fits: {format_bytes(sp.required_bytes)} {what} per "
                f"device within {budget}{lower}; it moves {comm} per step"
            )
    last = stages[-1]
    if last.peak is not None:
        hint = "activation checkpointing or a smaller micro-batch cuts the activations"
    else:
        need = min_data_parallel(Stage.PARAMETERS, p, usable)
        hint = f"stage 3 fits from N = {need} ranks" if need else "no data-parallel size fits"
    return None, (
        f"no stage fits: even stage 3 needs {format_bytes(last.required_bytes)} per device, more than "
        f"{budget}; {hint}, or use devices with more memory"
    )
