"""The start-up peak: what a rank holds from process start to its first step, beside the training peak.

The runtime builds the model partitioned (`zerotrain.runtime.construction`): every rank builds every module, and
as each is registered in its parent keeps only its slice of each parameter (Ψ/W elements in all, W the world size;
the model is built in fp32, as torch builds it by default). Then the engine takes the units one at a time: the
slices of a unit are gathered whole on the training device, the rank keeps its range, and the slices go.

So a rank's host memory at start-up is, at most:

- its slices: 4·Ψ/W;
- one unit whole, fp32: the module being built (a module is built whole before its parent takes its slices; at most
  the largest unit) or, where the ranks train on the CPU, the unit being gathered;
- on CPU ranks (the device is the host) also the engine's states as they are built, before the optimizer's states
  exist (created at the first step): parameters, gradients, the fp32 master where it is a copy of its own, the
  gradient arenas; and the unit being gathered beside the one built;
- with `spec.model.pretrained`, one read of at most 16 MiB (`READ_CHUNK_BYTES`).

On GPUs the device's start-up (the engine's states and one gathered unit) stays within its training peak, which the
plan checks already. Not counted, as in the training plan: the process itself (torch's libraries, the CUDA runtime's
host memory), which the headroom is kept for, and the entry point's own data. A model whose construction cannot be
partitioned is built whole on every rank (the run says so): then each rank holds the whole fp32 model at start.
"""

from __future__ import annotations

from zerotrain._model import SpecModel
from zerotrain.plan.inputs import declared_parameters, model_units, peak_input, plan_input
from zerotrain.plan.model_states import stage_bytes
from zerotrain.plan.peak import padded_elements, peak_plan
from zerotrain.quantity import format_bytes
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.zero_config import Precision, Stage

READ_CHUNK_BYTES = 16 << 20
"""The largest single read of pretrained weights (`zerotrain.runtime.construction.weight_files`)."""
BUILD_BYTES = 4
"""Bytes of one parameter element as the entry point builds it (fp32, torch's default)."""


class StartUpPlan(SpecModel):
    """One rank's host memory from process start to its first step (bytes), and its pod's."""

    slices: int
    """Its slice of every parameter as built: 4·Ψ/W."""
    unit: int
    """Built or gathered whole at once (fp32): one unit on GPU ranks, two on CPU ranks; 0 when the model's shape is
    not given (the largest unit is then unknown: the figures are a lower bound)."""
    engine: int
    """CPU ranks only: the engine's parameters, gradients, fp32 master and gradient arenas, before any optimizer
    state exists."""
    read_chunk: int
    """spec.model.pretrained: one read of the weights' files."""
    per_rank: int
    """The sum: the rank's start-up peak in host memory."""
    per_pod: int
    """nprocPerNode ranks' start-up peaks, plus any offloaded model states (zero.offload)."""
    whole_model: int
    """What a rank would hold had it built the model whole: 4·Ψ."""
    largest_unit_known: bool
    """Whether `unit` counts the largest unit (spec.model.shape given)."""


def _largest_unit(spec: ZeroTrainingJobSpec) -> int | None:
    units = model_units(spec)  # spec.model.shape, or a Hugging Face architecture's exact counts
    return None if units is None else max(units[1], units[2])


def _engine_bytes(spec: ZeroTrainingJobSpec) -> int:
    """A CPU rank's engine as built: its stage's parameters and gradients, a separate fp32 master, the arenas."""
    stage = spec.zero.fixed_stage
    n = spec.world_size if stage is Stage.DATA_PARALLEL else spec.shard_group_ranks
    psi = declared_parameters(spec) or 0
    master = 0 if spec.zero.precision is Precision.FP32 else 4 * psi // (n if stage >= Stage.OPTIMIZER_STATES else 1)
    p = peak_input(spec)
    if p is not None:
        peak = peak_plan(p)
        return peak.parameters + peak.gradients + master + peak.gradient_arenas
    w, g, _ = stage_bytes(stage, plan_input(spec))
    return round(w + g) + master


def start_up_plan(spec: ZeroTrainingJobSpec, offloaded_per_pod: int = 0) -> StartUpPlan | None:
    """The job's start-up peak per rank and per pod (see the module), when Ψ is known (parameters or shape)."""
    psi = declared_parameters(spec)
    if psi is None:
        return None
    world = spec.world_size
    slices = BUILD_BYTES * padded_elements(-(-psi // world), 1)
    unit = _largest_unit(spec)
    cpu = spec.resources.gpu == 0
    whole_units = (2 if cpu else 1) * BUILD_BYTES * (unit or 0)
    engine = _engine_bytes(spec) if cpu else 0
    chunk = READ_CHUNK_BYTES if spec.model.pretrained is not None else 0
    per_rank = slices + whole_units + engine + chunk
    return StartUpPlan(
        slices=slices,
        unit=whole_units,
        engine=engine,
        read_chunk=chunk,
        per_rank=per_rank,
        per_pod=spec.nproc_per_node * per_rank + offloaded_per_pod,
        whole_model=BUILD_BYTES * psi,
        largest_unit_known=unit is not None,
    )


def describe(plan: StartUpPlan, spec: ZeroTrainingJobSpec) -> str:
    """One line: the start-up peak per rank and what it is made of, per pod, and against resources.memory."""
    parts = [f"its slice of every parameter {format_bytes(plan.slices)}"]
    if plan.largest_unit_known:
        parts.append(f"{'two units' if spec.resources.gpu == 0 else 'one unit'} whole {format_bytes(plan.unit)}")
    else:
        parts.append("the largest unit whole (not counted: set spec.model.shape)")
    if plan.engine:
        parts.append(f"the engine's states before the first step {format_bytes(plan.engine)}")
    if plan.read_chunk:
        parts.append(f"one read of the pretrained weights {format_bytes(plan.read_chunk)}")
    line = (
        f"start-up (construction and loading): {format_bytes(plan.per_rank)} of host memory per rank "
        f"({' + '.join(parts)}; {format_bytes(plan.whole_model)} had it built the whole model), "
        f"{format_bytes(plan.per_pod)} per pod of {spec.nproc_per_node} rank(s)"
    )
    return line
