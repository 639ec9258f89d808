"""The rank's task and where its model's starting values come from.

The entry point is called inside a partitioned construction (`zerotrain.runtime.construction.partitioned`): the
model it returns holds placeholders, and the rank only its slice of each parameter. Where that cannot be done (a
model that reads its own weights while it is built, one built on a GPU, an entry point that keeps parameters
outside the task's model) the rank builds it whole, as before, and says why in one line.

The engine's `ParameterSource` is then the construction's (`materialize.ConstructedValues`), or, for a model built
whole, none: the engine's default takes rank 0's values.

With `spec.model.lora` the adapters are added to the model inside the same construction (`models.lora`).

With `spec.model.pretrained` the names are matched against the weights right after construction, before anything
is allocated for the model, and the engine reads its ranges from the files (`construction.pretrained`), unless the
job has a committed checkpoint of its own and no frozen parameters: it resumes from that instead, and says so.
Should every one of those be refused, the pretrained weights are read into the engine after all (`refill`). A
model with frozen parameters (a LoRA job's base) reads them from the weights on every start: its checkpoints hold
what trains, and a reference to the weights (`checkpoints.base`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from zerotrain import elastic, weights_layout
from zerotrain.errors import UserError
from zerotrain.lora_config import LoraSpec
from zerotrain.quantity import format_bytes
from zerotrain.runtime.checkpoints import base
from zerotrain.runtime.checkpoints.checkpointer import Checkpointer, CheckpointPolicy, Resume, has_own
from zerotrain.runtime.construction.materialize import ConstructedValues
from zerotrain.runtime.construction.partitioned import build_partitioned
from zerotrain.runtime.construction.pretrained import Matched, PretrainedValues, load_buffers, match
from zerotrain.runtime.construction.weight_files import WeightStore, open_weights
from zerotrain.runtime.job.elastic_batches import SlotBatches
from zerotrain.runtime.job.spec_bindings import check_model_parameters, optimizer_factory
from zerotrain.runtime.job.task import (
    ConfigError,
    TrainingTask,
    build_task,
    check_arguments,
    check_task,
    load_entrypoint,
)
from zerotrain.runtime.models import lora as lora_adapters
from zerotrain.runtime.rank_phase import RankPhase
from zerotrain.runtime.zero.param_source import ModelValues, ParameterSource
from zerotrain.spec import PretrainedSpec, ZeroTrainingJobSpec

if TYPE_CHECKING:
    from torch import nn

    from zerotrain.runtime.job.progress import ProgressSink
    from zerotrain.runtime.job.rank_metrics import MetricsSink
    from zerotrain.runtime.job.train import RankContext
    from zerotrain.runtime.zero.engine import ZeroEngine
    from zerotrain.runtime.zero.optimizer import OptimizerFactory
    from zerotrain.zero_config import ZeroConfig


@dataclass
class Start:
    """The rank's task and its model's starting values."""

    task: TrainingTask
    source: ParameterSource | None
    """Where the engine takes the units' values from; None: the model's own (built whole), rank 0's."""
    notes: list[str]
    """What rank 0 says about how the model was built (one line each)."""


def _group() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def start_task(
    entrypoint: str, *, rank: int, world_size: int, args: dict[str, Any], lora: LoraSpec | None = None
) -> Start:
    """Import and call the entry point for one rank (as `rank` of `world_size` for its data), its model built
    partitioned over the process group's ranks where it can be, with `lora`'s adapters added as part of it."""
    fn = load_entrypoint(entrypoint)
    check_arguments(fn, entrypoint, args)

    def call() -> TrainingTask:
        task = check_task(fn(rank=rank, world_size=world_size, **args), entrypoint)
        if lora is not None:
            lora_adapters.apply(task.model, lora)
        return task

    built = build_partitioned(call, lambda task: task.model, *_group(), passthrough=UserError)
    task: TrainingTask = built.result
    if built.slices is None:
        note = f"model built whole on every rank (its construction cannot be partitioned: {built.whole_because})"
        return Start(task, None, [note])
    return Start(task, ConstructedValues(built.slices, task.model), [])


def match_model(model: nn.Module, store: WeightStore, spec: PretrainedSpec, lora: LoraSpec | None) -> Matched:
    """The model's names against the weights', LoRA's adapters new and its base layers under their base names."""
    if lora is None:
        return match(model, store, spec)
    return match(model, store, spec, lora_adapters.adapter_names(model), lora_adapters.base_name)


def use_pretrained(start: Start, spec: PretrainedSpec, lora: LoraSpec | None = None) -> PretrainedValues:
    """Match the model against the weights (refusing, before anything is allocated, what does not fit), read its
    buffers, and make the engine's source read its parameters from them."""
    store = open_weights(spec.path)
    model = start.task.model
    found = match_model(model, store, spec, lora)
    load_buffers(model, store, found)
    base = start.source if start.source is not None else ModelValues(model)
    source = PretrainedValues(store, found, base)
    start.source = source
    adapters = set(lora_adapters.adapter_names(model)) if lora is not None else set()
    own = [n for n in found.new if n not in adapters]
    new = f"; initialised by the model: {', '.join(own)}" if own else ""
    new += f"; {len(adapters)} LoRA adapter tensors initialised by peft" if adapters else ""
    unused = f"; left unread: {', '.join(found.unused)}" if found.unused else ""
    start.notes.append(f"pretrained weights from {spec.path} ({found.rule}){new}{unused}")
    return source


def loaded_note(source: PretrainedValues) -> str:
    stats = source.store.stats
    return (
        f"pretrained: rank 0 read {format_bytes(stats.bytes_read)} (its shard), at most "
        f"{format_bytes(stats.largest_read_bytes)} at once"
    )


def refill_from(engine: ZeroEngine, source: PretrainedValues) -> None:
    """Read the pretrained parameters into an engine already built (every checkpoint of the job was refused): each
    unit's kept range in place, then the compute parameters rebuilt from it."""
    for u in engine.units:
        lo, hi = u.master_range
        source.read_loaded(u.layout, lo, hi, u.master)
    engine.refresh_parameters()


class EngineFactory(Protocol):
    """What builds the rank's engine: `ZeroEngine` itself, or a test's wrapper around it."""

    def __call__(
        self,
        model: nn.Module,
        config: ZeroConfig,
        optimizer: OptimizerFactory,
        *,
        init: ParameterSource | None = None,
        device: torch.device | None = None,
        samples_per_rank_batch: int = 0,
    ) -> ZeroEngine: ...


def make_engine(
    task: TrainingTask,
    spec: ZeroTrainingJobSpec,
    device: torch.device,
    factory: EngineFactory,
    source: ParameterSource | None = None,
) -> ZeroEngine:
    """ZeroConfig from spec.zero, unit modules defaulting to the task's, optimizer from spec.training; the units'
    values from `source` (a partitioned construction's, pretrained weights), else the model's own."""
    check_model_parameters(spec, task.model)
    zero = spec.zero
    if not zero.unit_modules and task.unit_modules:
        zero = zero.model_copy(update={"unit_modules": list(task.unit_modules)})
    optimizer = optimizer_factory(spec.training.optimizer)
    samples = task.samples_per_batch
    if source is None:
        return factory(task.model.to(device), zero, optimizer=optimizer, samples_per_rank_batch=samples)
    return factory(task.model, zero, optimizer=optimizer, init=source, device=device, samples_per_rank_batch=samples)


def elastic_task(spec: ZeroTrainingJobSpec, ctx: RankContext) -> tuple[ZeroTrainingJobSpec, Start]:
    """The rank's task, and the spec it runs: at the manifest's size both as they are; in an elastic gang of
    another size the spec's accumulation becomes the layout's and the task's batches this rank's slots of the
    manifest's global micro-batches (the entry point is built for the manifest's layout, rank r mod W)."""
    args, lora = spec.entrypoint_args, spec.model.lora
    if spec.elastic is None:
        return spec, start_task(spec.entrypoint, rank=ctx.rank, world_size=ctx.world_size, args=args, lora=lora)
    try:
        grid = elastic.layout(spec.replicas, spec.nproc_per_node, spec.zero.gradient_accumulation_steps, ctx.world_size)
    except ValueError as e:
        raise ConfigError(f"spec.elastic: {e}") from None
    if grid is None:
        return spec, start_task(spec.entrypoint, rank=ctx.rank, world_size=ctx.world_size, args=args, lora=lora)
    zero = spec.zero.model_copy(update={"gradient_accumulation_steps": grid.accumulation})
    start = start_task(
        spec.entrypoint, rank=ctx.rank % spec.world_size, world_size=spec.world_size, args=args, lora=lora
    )
    start.task.batches = SlotBatches(start.task.batches, grid, ctx.rank)
    return spec.model_copy(update={"zero": zero}), start


@dataclass
class StartProgress:
    """How far a rank's start got: filled in as it goes, so a failure part-way (out of memory) can say so."""

    engine: ZeroEngine | None = None
    built_whole: bool = False
    """The model could not be built partitioned (its whole fp32 parameters were held by every rank)."""


@dataclass(frozen=True)
class Built:
    """What `start_engine` built: the rank's engine and task, the spec it runs (an elastic gang's own), its
    checkpointer and where its values came from."""

    engine: ZeroEngine
    task: TrainingTask
    spec: ZeroTrainingJobSpec
    checkpointer: Checkpointer
    resumed: Resume


def gathered_unit_bytes(engine: ZeroEngine | None) -> list[int]:
    """Host bytes of each unit stage 3 gathers and frees every pass (none on a GPU: its allocator caches)."""
    if engine is None or engine.device.type != "cpu":
        return []
    return [u.full.nbytes() or u.layout.padded * u.full.data.element_size() for u in engine.units if not u.resident]


def start_engine(
    spec: ZeroTrainingJobSpec,
    ctx: RankContext,
    device: torch.device,
    factory: EngineFactory,
    metrics: MetricsSink,
    log: ProgressSink,
    progress: StartProgress,
) -> Built:
    """Build the rank's task and engine and resume it (see the module docstring), saying how on rank 0's log."""
    metrics.phase(RankPhase.CONSTRUCTING)
    spec, start = elastic_task(spec, ctx)
    progress.built_whole = start.source is None
    pretrained, source = spec.model.pretrained, None
    own = has_own(spec.checkpoint)
    frozen = any(not p.requires_grad for p in start.task.model.parameters())
    if pretrained is not None and (not own or frozen):  # a frozen base is read again: checkpoints refer to it
        source = use_pretrained(start, pretrained, spec.model.lora)
    policy = CheckpointPolicy.from_spec(spec.checkpoint, checkpoint_origin(spec, start.task.model, source))
    for line in start.notes:
        log.note(line)
    engine = progress.engine = make_engine(start.task, spec, device, factory, start.source)
    start.source = None  # the construction's slices are in the engine now
    checkpointer = Checkpointer(engine, policy, metrics)
    refilled: list[PretrainedValues] = []

    def refill() -> None:  # every checkpoint of the job was refused: its pretrained weights after all
        assert pretrained is not None
        told = len(start.notes)
        refilled.append(use_pretrained(start, pretrained, spec.model.lora))
        refill_from(engine, refilled[0])
        for line in start.notes[told:]:
            log.note(line)

    resumed = checkpointer.resume(start.task, refill if pretrained is not None and own and source is None else None)
    say_resumed(log, resumed, spec, source or (refilled[0] if refilled else None))
    return Built(engine, start.task, spec, checkpointer, resumed)


def say_resumed(log: ProgressSink, resumed: Resume, spec: ZeroTrainingJobSpec, source: PretrainedValues | None) -> None:
    """Rank 0's lines on where the values came from."""
    pretrained = spec.model.pretrained
    if resumed.loaded is not None:
        log.resumed(resumed.loaded.step, str(resumed.loaded.path))
        if pretrained is not None and source is None:
            log.note(f"resumed from the job's own checkpoint: spec.model.pretrained ({pretrained.path}) was not read")
        elif pretrained is not None:
            log.note(f"resumed from the job's own checkpoint; the frozen parameters from {pretrained.path}")
    elif source is not None:
        log.note(loaded_note(source))


def checkpoint_origin(spec: ZeroTrainingJobSpec, model: nn.Module, source: PretrainedValues | None) -> dict[str, Any]:
    """What every checkpoint marker records of where the model came from: the pretrained weights' path (an export
    copies their config), LoRA's spec (an adapter export writes its config from it) and, for frozen parameters read
    from the weights, the reference the checkpoints hold instead of them (`checkpoints.base`)."""
    origin: dict[str, Any] = {}
    if spec.model.lora is not None:
        origin["lora"] = spec.model.lora.to_wire()
        origin["lora_layers"] = lora_adapters.layers(model)
        origin["lora_saved"] = lora_adapters.saved_modules(model, spec.model.lora)
        origin["entrypoint"] = spec.entrypoint
    pretrained = spec.model.pretrained
    if pretrained is None:
        return origin
    origin["pretrained"] = pretrained.path
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    if source is not None and frozen:
        names = {n: stored for n, stored in source.found.params.items() if n in frozen}
        origin[base.ORIGIN_KEY] = base.BaseReference(
            pretrained.path, weights_layout.digest(pretrained.path), names
        ).record()
    return origin


def match_on_meta(
    entrypoint: str, args: dict[str, object], world_size: int, spec: PretrainedSpec, lora: LoraSpec | None = None
) -> Matched | str:
    """`zerotrain validate`: the entry point's model built on the meta device (no memory, no init), `lora`'s
    adapters added, and matched against the weights: the Matched, or why the model could not be built that way
    (then not checked). A mismatch raises WeightsError, as the ranks would."""
    store = open_weights(spec.path)
    try:
        with torch.device("meta"):
            task = build_task(entrypoint, rank=0, world_size=world_size, args=dict(args))
            if lora is not None:
                lora_adapters.apply(task.model, lora)
    except UserError:
        raise
    except Exception as e:  # the entry point's own data or checks may need real tensors
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return match_model(task.model, store, spec, lora)
