"""`zerotrain plan`: per-device memory and communication of ZeRO stages 0-3: model states from Ψ and N, and with
`-f JOB` whose spec.model gives the shape, the whole peak (activations and the runtime's buffers too)."""

from __future__ import annotations

import argparse
import json
from enum import Enum

from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from zerotrain.commands.tables import Rows, print_rows
from zerotrain.errors import UserError
from zerotrain.local_paths import load_job
from zerotrain.plan import JobPlan, host, plan_job
from zerotrain.plan.device import device_terms
from zerotrain.plan.inputs import declared_parameters, plan_input
from zerotrain.plan.model_states import MemoryPlan, PlanInput, StagePlan, plan
from zerotrain.plan.stage_choice import resolve_stage
from zerotrain.plan.start_up import describe
from zerotrain.quantity import format_bytes, parse_bytes, parse_count
from zerotrain.spec import ZeroTrainingJobSpec

# CLI flag of each PlanInput field, so errors name what the user typed.
_FLAGS = {
    "parameters": "--params",
    "data_parallel": "--dp",
    "optimizer_multiplier": "--k",
    "bytes_per_weight": "--bytes-per-weight",
    "bytes_per_gradient": "--bytes-per-grad",
    "device_memory": "--device-memory",
    "headroom": "--headroom",
}


class Output(str, Enum):
    """Output format."""

    TABLE = "table"
    JSON = "json"


def _number(text: str, flag: str) -> int:
    value = parse_count(text)
    if value is None:
        raise UserError(f"{flag}: got {text!r}; not a number; write it like 7.5e9 or 7.5B")
    return value


def _size(text: str, flag: str) -> int:
    value = parse_bytes(text)
    if value is None:
        raise UserError(f"{flag}: got {text!r}; not a size; write it like 80GB, 80G or 80Gi")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="ZeRO memory planner", description=__doc__)
    p.add_argument("--params", help="parameter count Ψ (7.5e9, 7.5B)")
    p.add_argument("--dp", type=str, help="data-parallel size N")
    p.add_argument("-f", "--manifest", help="take Ψ, N, K and GPU memory from a ZeroTrainingJob manifest")
    p.add_argument("--k", type=str, default=None, help="optimizer-state bytes per parameter K (default 12)")
    p.add_argument("--bytes-per-weight", type=str, default=None, help="bytes per weight (default 2)")
    p.add_argument("--bytes-per-grad", type=str, default=None, help="bytes per gradient (default 2)")
    p.add_argument("--device-memory", help="memory of one device (80GB, 80GiB) to get a recommendation")
    p.add_argument("--headroom", type=str, default=None, help="fraction of device memory kept free (default 0.2)")
    p.add_argument("--output", choices=[o.value for o in Output], default=Output.TABLE.value)
    p.add_argument(
        "--measure",
        action="store_true",
        help="with -f: build the entry point's model under torch's fake tensors, run one micro-batch forward and "
        "backward without allocating memory, and print the activation bytes to put in spec.model.activationBytes",
    )
    p.add_argument(
        "--measure-real",
        action="store_true",
        help="as --measure, on real CPU tensors (for a model torch's fake tensors cannot run; allocates it)",
    )
    p.add_argument(
        "--fill",
        action="store_true",
        help="with -f: write spec.model.architecture into the manifest from the Hugging Face model's config.json, "
        "so the operator plans the job (and chooses stage: auto) from the manifest alone",
    )
    p.set_defaults(func=run)


def _manifest_spec(path: str) -> tuple[ZeroTrainingJobSpec, int | None]:
    spec = load_job(path, strict=False).spec  # the plan reads a config, never the data
    try:
        psi = declared_parameters(spec)
        spec, choice = resolve_stage(spec)  # the plan of the stage `auto` chooses, as admission would
    except ValueError as e:
        raise UserError(f"{path}: {e}") from None
    if choice is not None:
        Console(stderr=True).print(Text(f"stage auto chose {choice.message}"), soft_wrap=True)
    if psi is None:
        raise UserError(
            f"{path}: the model's size is not known: write spec.model.architecture with `zerotrain plan -f {path} "
            "--fill` (a Hugging Face model), set spec.model.parameters (or spec.model.shape), or pass --params"
        )
    memory = _size(spec.resources.gpu_memory, "spec.resources.gpuMemory") if spec.resources.gpu_memory else None
    return spec, memory


def _inputs(args: argparse.Namespace) -> dict[str, object]:
    values: dict[str, object] = {}
    if args.manifest:
        spec, memory = _manifest_spec(args.manifest)
        values.update(plan_input(spec, memory).model_dump(exclude_none=True, exclude={"headroom"}))
    if args.params is not None:
        values["parameters"] = _number(args.params, "--params")
    if args.dp is not None:
        values["data_parallel"] = _number(args.dp, "--dp")
    if args.device_memory is not None:
        values["device_memory"] = _size(args.device_memory, "--device-memory")
    for field, flag in (
        ("optimizer_multiplier", "k"),
        ("bytes_per_weight", "bytes_per_weight"),
        ("bytes_per_gradient", "bytes_per_grad"),
        ("headroom", "headroom"),
    ):
        raw = getattr(args, flag)
        if raw is not None:
            try:
                values[field] = float(raw)
            except ValueError:
                raise UserError(f"{_FLAGS[field]}: got {raw!r}; not a number; pass a number like 12") from None
    for field in ("parameters", "data_parallel"):
        if field not in values:
            raise UserError(f"{_FLAGS[field]} is required (or -f MANIFEST with spec.model.parameters)")
    return values


def make_input(values: dict[str, object]) -> PlanInput:
    try:
        return PlanInput.model_validate(values)
    except ValidationError as e:
        first = e.errors()[0]
        field = str(first["loc"][0])
        flag = _FLAGS.get(field, field)
        msg = first["msg"]
        limit = first.get("ctx", {})
        fix = "pass a positive value" if limit.get("ge") == 1 or limit.get("gt") == 0 else "pass a value in range"
        raise UserError(f"{flag}: got {first.get('input')!r}; {msg}; {fix}") from None


_OVERRIDES = ("params", "dp", "k", "bytes_per_weight", "bytes_per_grad", "device_memory", "headroom")


def _result(args: argparse.Namespace) -> MemoryPlan | JobPlan:
    """The manifest's own plan (whole peak with a shape) unless flags override its figures: then model states."""
    if args.manifest and not any(getattr(args, f) is not None for f in _OVERRIDES):
        spec, memory = _manifest_spec(args.manifest)
        return plan_job(spec, memory)
    return plan(make_input(_inputs(args)))


def run(args: argparse.Namespace) -> int:
    if args.fill:
        if not args.manifest:
            raise UserError("--fill: needs -f MANIFEST (the job whose spec.model.architecture to write)")
        from zerotrain.commands.fill import fill_command

        return fill_command(args.manifest)
    if args.measure or args.measure_real:
        if not args.manifest:
            raise UserError("--measure: needs -f MANIFEST (the entry point to build)")
        from zerotrain.commands.measure import measure_command

        return measure_command(args.manifest, args.output == Output.JSON.value, real=args.measure_real)
    result = _result(args)
    job = result if isinstance(result, JobPlan) else None
    memory = job.memory if job is not None else result
    assert isinstance(memory, MemoryPlan)  # a manifest's plan: _manifest_spec refused an unknown size
    if args.output == Output.JSON.value:
        out = memory.model_dump(mode="json", by_alias=True)
        if job is not None and job.start_up is not None:
            out["startUp"] = job.start_up.model_dump(mode="json", by_alias=True)
        if job is not None:
            out["host"] = job.host.model_dump(mode="json", by_alias=True)
        print(json.dumps(out, indent=2))
        return 0
    console = Console()
    render(memory, console)
    if job is not None and job.start_up is not None:
        console.print(Text(describe(job.start_up, job.spec)), soft_wrap=True)
    if job is not None:
        console.print(Text(host.describe(job.spec, job.host)), soft_wrap=True)
    return 0


def render(result: MemoryPlan, console: Console) -> None:
    """The plan as a table, in decimal GB as the ZeRO paper counts."""
    title = f"model states per device: Ψ = {result.parameters:.3g} parameters, N = {result.data_parallel}, "
    title += f"K = {result.optimizer_multiplier:g}"
    if result.trainable_parameters is not None:  # LoRA: gradients and optimizer state of Ψ_t only
        title += f", Ψ_t = {result.trainable_parameters:.3g} trained"
    columns = ["stage", "params", "grads", "optimizer", "total", "comm / step"]
    if result.usable_memory is not None:
        columns.append("fits")
    rows = Rows(title, columns, left=frozenset({"fits"}))
    regathers: list[str] = []
    for sp in result.stages:
        comm = f"{sp.comm_elements_per_step / result.parameters:g}Ψ"
        if sp.comm_elements_with_recompute != sp.comm_elements_per_step:
            again = f"{sp.comm_elements_with_recompute / result.parameters:g}Ψ"
            comm += f" or {again}"
            regathers.append(f"stage {sp.stage.value} moves {again} when activation recompute re-gathers its units")
        cells = [str(sp.stage.value), *map(format_bytes, _state_bytes(sp)), comm]
        rows.add(*cells, *(["yes" if sp.fits else "no"] if result.usable_memory is not None else []))
    print_rows(rows, console)
    for line in regathers:
        console.print(Text(line), soft_wrap=True)
    if any(sp.peak is not None for sp in result.stages):
        render_peaks(result, console)
    if result.host_state_bytes:
        console.print(
            Text(
                f"offloaded model states (zero.offload): {format_bytes(result.host_state_bytes)} of host "
                "memory per rank, not in the device columns"
            )
        )
    if result.reason:
        console.print(Text(result.reason), soft_wrap=True)


def _state_bytes(sp: StagePlan) -> tuple[float, float, float, float]:
    return (sp.parameter_bytes, sp.gradient_bytes, sp.optimizer_bytes, sp.model_state_bytes)


# (row, PeakPlan field) of the whole-peak table.
PEAK_TERMS = (
    ("model states", "model_states"),
    ("gathered units", "gathered_parameters"),
    ("activations", "activations"),
    ("comm buffers", "communication_buffers"),
    ("grad arenas", "gradient_arenas"),
    ("fp32 grads", "fp32_gradients"),
    ("autograd grads", "unsharded_gradients"),
    ("optimizer step", "optimizer_step"),
)


def render_peaks(result: MemoryPlan, console: Console) -> None:
    """The whole peak per rank, a row per term and a column per stage, so it fits a terminal whatever the terms
    (docs/memory.md explains each)."""
    stages = [sp for sp in result.stages if sp.peak is not None]
    peaks = [sp.peak for sp in stages if sp.peak is not None]
    rows = Rows(
        "whole peak per rank (docs/memory.md explains each term)",
        ["term", *(f"stage {sp.stage.value}" for sp in stages)],
        left=frozenset({"term"}),
    )
    for name, attr in PEAK_TERMS:
        if any(getattr(p, attr) for p in peaks):
            rows.add(name, *(format_bytes(getattr(p, attr)) if getattr(p, attr) else "-" for p in peaks))
    rows.end_section()
    rows.add("peak", *(format_bytes(p.peak) for p in peaks))
    rows.add("at", *(p.peak_phase for p in peaks))
    print_rows(rows, console)
    host = max(sp.peak.host_activations for sp in result.stages if sp.peak is not None)
    if host:
        console.print(Text(f"offloaded activation checkpoints: {format_bytes(host)} of host memory per rank"))
    terms = device_terms(result.data_parallel, result.data_parallel, max(p.peak for p in peaks))
    console.print(
        Text(
            f"not in the peak, on a GPU: the CUDA context {format_bytes(terms.cuda_context)}, cuBLAS workspaces "
            f"{format_bytes(terms.cublas_workspace)}, NCCL's buffers {format_bytes(terms.nccl_buffers)} and the "
            f"allocator's reserve {format_bytes(terms.allocator_reserve)} per rank, planned from the libraries' "
            "defaults (bench/gpu/gpu_check.py's device phase measures them); the headroom is kept for them"
        ),
        soft_wrap=True,
    )
