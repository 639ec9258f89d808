"""The entry point checked before any rank starts (`zerotrain validate`, and `zerotrain run` before it launches).

What every rank would refuse, refused once, in seconds: a module that does not import, a function that is not
there, `entrypointArgs` it does not take, an error the entry point raises itself, a `spec.model.architecture` that is
not the config's, a `spec.model.parameters` (or a shape's or a Hugging Face config's Ψ) that is not the model's,
unit classes the model does not contain, LoRA targets that name no layer of it, evaluation asked of a task without
evaluation data or with fewer micro-batches than `evaluation.batches`. The model is built on the meta device: no
memory, no initialisation. An entry point whose own code needs real tensors (it reads its data into the model, say)
cannot be built there; then the ranks check the rest, and the line says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import torch

from zerotrain import hf_config
from zerotrain.errors import UserError
from zerotrain.runtime.job import evaluation as evaluation_module
from zerotrain.runtime.job.spec_bindings import check_model_parameters
from zerotrain.runtime.job.task import (
    ConfigError,
    TrainingTask,
    check_arguments,
    check_task,
    is_script,
    load_entrypoint,
)
from zerotrain.runtime.models import lora as lora_adapters
from zerotrain.runtime.zero.partition import check_unit_classes
from zerotrain.spec import ZeroTrainingJobSpec


def check_entrypoint(spec: ZeroTrainingJobSpec, build: bool = True, world_size: int | None = None) -> str:
    """One line on what was checked; UserError (a ConfigError or the engine's setup error) on what a rank would
    refuse. `build=False` stops after the import and the arguments (the entry point reads files only the pods
    have). `world_size`: the ranks a local run starts (`--nproc`), when not the manifest's."""
    world = world_size or spec.world_size
    if is_script(spec.entrypoint):
        return f"entry point: {spec.entrypoint} is a script the launcher runs as every rank; nothing to check before"
    fn = load_entrypoint(spec.entrypoint)
    args = dict(spec.entrypoint_args)
    check_arguments(fn, spec.entrypoint, args)
    _check_architecture(spec)
    if not build:
        return f"entry point: {spec.entrypoint} imports and takes its arguments; each rank checks Ψ and the units"
    torch.manual_seed(spec.training.seed)
    try:
        with torch.device("meta"):
            task = check_task(fn(rank=0, world_size=world, **args), spec.entrypoint)
            if spec.model.lora is not None:
                lora_adapters.apply(task.model, spec.model.lora)
    except UserError:
        raise
    except Exception as e:  # the entry point's own code may need real tensors; the ranks will build it for real
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return (
            f"entry point: {spec.entrypoint} imports and takes its arguments; its model cannot be built on the meta "
            f"device ({reason}), so each rank checks Ψ and the units"
        )
    check_model_parameters(spec, task.model)
    units = list(spec.zero.unit_modules) or list(task.unit_modules)
    check_unit_classes(task.model, units)
    _check_counted(spec, task)
    _check_evaluation(spec, task)
    drawn = _draw(task)  # once: the batches are an iterator, a second draw would be the second micro-batch
    if world == spec.world_size:  # the shape is the manifest's layout: another --nproc gives other rows per rank
        _check_shape(spec, task, drawn)
    uneven = _unequal_rows(fn, spec, drawn, world)
    count = sum(p.numel() for p in task.model.parameters())
    trains = sum(p.numel() for p in task.model.parameters() if p.requires_grad)
    held = sum(1 for m in task.model.modules() if type(m).__name__ in set(units))
    share = f"{trains / count:.2%}: LoRA's adapters and modules to save"
    trained = f", {trains:,} of them trained ({share})" if spec.model.lora is not None else ""
    return (
        f"entry point: {spec.entrypoint} builds a model of {count:,} parameters{trained}, {held} unit(s) of "
        f"{', '.join(units) or '(none: one unit, the whole model)'} (built on the meta device)"
    ) + (f"\n{uneven}" if uneven else "")


def _check_architecture(spec: ZeroTrainingJobSpec) -> None:
    """spec.model.architecture (what admission planned with) against the config the built-in Hugging Face entry
    point builds the model from; another entry point's model is checked by its parameter count."""
    declared = spec.model.architecture
    if declared is None or spec.entrypoint != hf_config.HF_ENTRYPOINT:
        return
    source = spec.entrypoint_args.get("config")
    with hf_config.local_files():
        try:
            config = hf_config.read_config(source)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if config is None:
        return  # the entry point names what is missing when it builds the model
    where = "the inline config" if isinstance(source, dict) else f"{source}/{hf_config.CONFIG_FILE}"
    problem = hf_config.architecture_mismatch(declared, config, where)
    if problem is not None:
        raise ConfigError(problem)


def _check_counted(spec: ZeroTrainingJobSpec, task: TrainingTask) -> None:
    """Batches that say what their labels count (instruction records): refuse a run in which some global
    micro-batch counts no token on any rank (its records' answers all cut away by seq_len)."""
    counted = getattr(task.batches, "counted", None)
    if not callable(counted):
        return
    per_step = spec.zero.gradient_accumulation_steps
    for k in range(spec.training.steps * per_step):
        if counted(k) == 0:
            raise ConfigError(
                f"spec.entrypointArgs.seq_len: got {spec.entrypoint_args.get('seq_len')}, but global micro-batch {k} "
                f"(step {k // per_step + 1}) would have no token the loss counts on any rank: every record in it has "
                "its answer cut away; use a longer seq_len, or shorter prompts"
            )


def _check_evaluation(spec: ZeroTrainingJobSpec, task: TrainingTask) -> None:
    """spec.training.evaluation against the task's evaluation data, as the first evaluation would find it: data
    there at all, and at least `batches` micro-batches of it on rank 0 (every rank holds as many). A refusal at the
    first evaluation comes after everySteps steps of compute, again on every resume."""
    evaluation = spec.training.evaluation
    evaluation_module.check_task(task, evaluation, spec.entrypoint)
    if evaluation is None or task.eval_batches is None:
        return
    try:
        with torch.device("meta"):
            held = sum(1 for _ in itertools.islice(task.eval_batches(), evaluation.batches))
    except UserError:
        raise
    except Exception:  # data the launcher cannot draw on the meta device: the ranks count it at the first evaluation
        return
    if held < evaluation.batches:
        raise evaluation_module.too_few(evaluation.batches, held, task.eval_batches)


def _draw(task: TrainingTask) -> tuple[object, ...]:
    """Rank 0's first micro-batch as a 1-tuple, or () when the launcher cannot draw it on the meta device (the
    ranks will; the checks that need it are skipped)."""
    try:
        return (next(iter(task.batches)),)
    except Exception:
        return ()


def _tensors(batch: object) -> Iterator[torch.Tensor]:
    """Every tensor of a batch (a tensor, or nested in tuples, lists and dicts), in order."""
    if isinstance(batch, torch.Tensor):
        yield batch
        return
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        yield from _tensors(item)


def _check_shape(spec: ZeroTrainingJobSpec, task: TrainingTask, drawn: tuple[object, ...]) -> None:
    """spec.model.shape's micro-batch against rank 0's first micro-batch: the plan counts the activations of
    microBatchSize sequences of sequenceLength tokens, so a shape that is not the data's plans the wrong peak."""
    shape = spec.model.shape
    if shape is None or not drawn:
        return
    try:
        tokens = next(_tensors(task.inputs(drawn[0])), None)
    except Exception:  # inputs the launcher cannot form on the meta device: the plan stands as written
        return
    if tokens is None or tokens.dim() < 2:
        return
    for field, declared, found in (
        ("microBatchSize", shape.micro_batch_size, int(tokens.shape[0])),
        ("sequenceLength", shape.sequence_length, int(tokens.shape[1])),
    ):
        if declared != found:
            raise ConfigError(
                f"spec.model.shape.{field}: got {declared}, but rank 0's first micro-batch has {found} "
                f"(input of shape {list(tokens.shape)}); set {field}: {found}, so that the plan counts the "
                "activations the ranks will hold"
            )


def _rows(batch: object) -> int | None:
    """The leading size of a batch's first tensor that has one."""
    return next((int(t.shape[0]) for t in _tensors(batch) if t.dim()), None)


def _unequal_rows(
    fn: Callable[..., object], spec: ZeroTrainingJobSpec, drawn: tuple[object, ...], world: int
) -> str | None:
    """One line when the first and the last rank draw micro-batches of different sizes: the mean over ranks of
    per-rank mean losses is then not the global batch's (the run differs from one process, silently)."""
    if world < 2 or not drawn:
        return None
    try:
        with torch.device("meta"):
            last = check_task(fn(rank=world - 1, world_size=world, **dict(spec.entrypoint_args)), spec.entrypoint)
        rows = (_rows(drawn[0]), _rows(next(iter(last.batches))))
    except Exception:  # data the launcher cannot draw: the ranks will
        return None
    if None in rows or rows[0] == rows[1]:
        return None
    return (
        f"warning: rank 0 draws micro-batches of {rows[0]} rows and rank {world - 1} of {rows[1]}: unequal shares, "
        f"so the loss and the update are not one process's on the global batch; make the global batch a multiple of "
        f"the {world} ranks"
    )
