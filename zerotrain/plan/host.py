"""A pod's host memory, whole: each rank's process (`process_baseline`) and the tensors it holds there.

A rank's host memory at its most is its process baseline, plus the larger of its start-up peak (`startup`) and, on
CPU ranks, whose device is the host, its training peak (the whole peak when the model's shape is known, else its
model states), plus any model states it offloads (zero.offload). The planner's headroom is kept on all of it:
glibc's heap grows past the tensors a process holds as it runs (the quickstart's ranks end 40 MB above their
baseline and tensors), whatever allocated it:

    resources.memory / nprocPerNode  >=  (baseline + tensors) / (1 - headroom)

`smallest_memory` is that bound for the whole pod, in MiB. `plan -f`, `validate`, the operator's admission and
`zerotrain run` (before any rank starts) all refuse through `refusal`.
"""

from __future__ import annotations

import math

from zerotrain._model import SpecModel
from zerotrain.plan.inputs import at_stage, declared_parameters, host_bytes_per_pod, lowest_stage, memory_plan
from zerotrain.plan.model_states import DEFAULT_HEADROOM
from zerotrain.plan.process_baseline import ProcessKind, baseline_bytes, process_kind
from zerotrain.plan.start_up import start_up_plan
from zerotrain.quantity import format_bytes, parse_bytes
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.zero_config import AutoStage, Stage

MIB = 1 << 20
PROCESS_WORDS = {
    ProcessKind.TORCH: "Python, torch, gloo and the metrics server",
    ProcessKind.TRANSFORMERS: "Python, torch, gloo, the metrics server and transformers",
    ProcessKind.PEFT: "Python, torch, gloo, the metrics server, transformers and peft",
}


def process_words(spec: ZeroTrainingJobSpec) -> str:
    """What the rank process holds besides its tensors, in words: GPU ranks' process group is NCCL's (its host
    side; its device buffers are in the device headroom), CPU ranks' gloo's."""
    words = PROCESS_WORDS[process_kind(spec)]
    return words.replace("gloo", "NCCL") if spec.resources.gpu > 0 else words


class HostPlan(SpecModel):
    """One rank's host memory at its most (bytes), and the smallest pod memory that holds its ranks."""

    baseline: int
    """The rank process itself before any tensor (`process_baseline`)."""
    start_up: int
    """Tensors from process start to the first step (`startup`): 0 when Ψ is unknown."""
    training: int
    """CPU ranks: the training peak (the whole peak, or the model states when the shape is unknown); 0 on GPUs."""
    offloaded: int
    """Model states offloaded to host memory (zero.offload), per rank."""
    tensors_known: bool
    """Whether Ψ is known, so the tensors are counted (else only the baseline is)."""
    tensors: int
    """max(start_up, training) + offloaded."""
    smallest_memory: int
    """The smallest resources.memory (bytes, a whole MiB) whose share holds every rank of the pod."""


def host_plan(spec: ZeroTrainingJobSpec) -> HostPlan:
    """The spec's host memory per rank (see the module)."""
    nproc = spec.nproc_per_node
    offloaded = host_bytes_per_pod(spec) // nproc
    start = start_up_plan(spec)
    known = declared_parameters(spec) is not None
    training = 0
    if known and spec.resources.gpu == 0:
        training = memory_plan(spec).stages[spec.zero.fixed_stage].required_bytes
    tensors = max(start.per_rank if start is not None else 0, training) + offloaded
    base = baseline_bytes(spec)
    smallest = math.ceil(nproc * (base + tensors) / (1 - DEFAULT_HEADROOM) / MIB) * MIB
    return HostPlan(
        baseline=base,
        start_up=start.per_rank if start is not None else 0,
        training=training,
        offloaded=offloaded,
        tensors_known=known,
        tensors=tensors,
        smallest_memory=smallest,
    )


def share(spec: ZeroTrainingJobSpec) -> int | None:
    """One rank's share of resources.memory (None without it)."""
    limit = parse_bytes(spec.resources.memory) if spec.resources.memory else None
    return None if limit is None else limit // spec.nproc_per_node


def mebibytes(n: int) -> str:
    return f"{-(-n // MIB)}Mi"


def what_it_holds(spec: ZeroTrainingJobSpec, plan: HostPlan) -> str:
    """The rank's figure and its parts, in words."""
    parts = [f"{format_bytes(plan.baseline)} the process itself ({process_words(spec)})"]
    if plan.training and plan.training >= plan.start_up:
        parts.append(f"{format_bytes(plan.training)} at its training peak at stage {spec.zero.fixed_stage.value}")
    elif plan.start_up:
        parts.append(f"{format_bytes(plan.start_up)} at start-up")
    if plan.offloaded:
        parts.append(f"{format_bytes(plan.offloaded)} of offloaded model states")
    if not plan.tensors_known:
        parts.append("its tensors (not counted: set spec.model.parameters or shape)")
    return " + ".join(parts)


def describe(spec: ZeroTrainingJobSpec, plan: HostPlan) -> str:
    """One line: each rank's host memory, the smallest resources.memory, and the verdict against the manifest's."""
    line = (
        f"host memory: {what_it_holds(spec, plan)} per rank, with {DEFAULT_HEADROOM:.0%} headroom; "
        f"resources.memory of at least {mebibytes(plan.smallest_memory)} for {spec.nproc_per_node} rank(s) a pod"
    )
    if spec.resources.memory is None:
        return line + "; no resources.memory set"
    verdict = "holds" if refusal(spec, plan) is None else "does NOT hold"
    return line + f"; resources.memory {spec.resources.memory} {verdict} it"


def holds(spec: ZeroTrainingJobSpec, plan: HostPlan) -> bool:
    """Whether each rank's share of resources.memory holds its process and tensors (True without a limit)."""
    s = share(spec)
    return s is None or s >= plan.smallest_memory // spec.nproc_per_node


def refusal(spec: ZeroTrainingJobSpec, plan: HostPlan) -> str | None:
    """Why the pod's memory cannot hold its ranks, naming the field, the value and the fix; None when it can."""
    limit = spec.resources.memory
    s = share(spec)
    if limit is None or s is None or holds(spec, plan):
        return None
    if (low := below_baseline(spec)) is not None:  # the process alone fills the share: one refusal says so
        return low
    fix = f"set resources.memory to at least {mebibytes(smallest_memory(spec))}"
    return (
        f"resources.memory: got {limit!r}; each rank needs {what_it_holds(spec, plan)}, with "
        f"{DEFAULT_HEADROOM:.0%} headroom, more than its {format_bytes(s)} share; {fix}" + more_pods(spec)
    )


def more_pods(spec: ZeroTrainingJobSpec) -> str:
    """The other fix, where it is one: twice the pods (each rank then holds a smaller shard), when that fits.
    More ranks per pod never help: each brings its own process and shares the same limit."""
    if declared_parameters(spec) is None:
        return ""
    wider = at_stage(spec, spec.zero.fixed_stage, spec.world_size * 2)
    if not holds(wider, host_plan(wider)):
        return ""
    return f", or run {wider.replicas} pods (spec.replicas): each rank then holds half the shards"


def below_baseline(spec: ZeroTrainingJobSpec) -> str | None:
    """The refusal of a pod whose ranks' shares cannot hold even their processes with the headroom, before the
    stage is known (nothing would be left for a tensor, so stage auto could not choose)."""
    s = share(spec)
    base = baseline_bytes(spec)
    with_headroom = math.ceil(base / (1 - DEFAULT_HEADROOM))
    if s is None or s > with_headroom:
        return None
    return (
        f"resources.memory: got {spec.resources.memory!r}; each of a pod's {spec.nproc_per_node} rank(s) has "
        f"{format_bytes(s)} of it, no more than the {format_bytes(base)} a rank process holds before its first "
        f"tensor ({process_words(spec)}; docs/memory.md) with {DEFAULT_HEADROOM:.0%} headroom, "
        f"{format_bytes(with_headroom)}; set resources.memory to at least {mebibytes(smallest_memory(spec))}"
        + ("" if declared_parameters(spec) is not None else " (the process alone: its tensors are not counted)")
    )


def smallest_memory(spec: ZeroTrainingJobSpec) -> int:
    """The smallest resources.memory (bytes, whole MiB) every check accepts: the process and the tensors of the
    job's stage, with the headroom; with `stage: auto`, at the stage it would choose there (CPU ranks: whichever
    stage needs least; GPU ranks: the one their GPU memory chooses). Without Ψ, the process alone."""
    if declared_parameters(spec) is None:
        base = math.ceil(baseline_bytes(spec) / (1 - DEFAULT_HEADROOM))
        return math.ceil((spec.nproc_per_node * base + 1) / MIB) * MIB
    if spec.zero.stage is not AutoStage.AUTO:
        return host_plan(spec).smallest_memory
    from zerotrain.plan.stage_choice import resolve_stage

    floor = lowest_stage(spec)
    if spec.resources.gpu > 0:
        try:
            chosen, _ = resolve_stage(spec)
            return host_plan(chosen).smallest_memory
        except ValueError:
            pass
    return min(host_plan(at_stage(spec, stage)).smallest_memory for stage in Stage if stage >= floor)
