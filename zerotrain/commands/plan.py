"""`zerotrain plan`: per-device model-state memory and communication of ZeRO stages 0-3."""

from __future__ import annotations

import argparse
import json
from enum import Enum

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from zerotrain.errors import UserError
from zerotrain.manifest import load_job
from zerotrain.plan_inputs import plan_input
from zerotrain.planner import MemoryPlan, PlanInput, format_bytes, plan
from zerotrain.quantity import parse_bytes, parse_count

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
    p.set_defaults(func=run)


def _inputs(args: argparse.Namespace) -> dict[str, object]:
    values: dict[str, object] = {}
    if args.manifest:
        spec = load_job(args.manifest).spec
        if spec.model.parameters is None:
            raise UserError(f"{args.manifest}: spec.model.parameters is not set; add it or pass --params")
        memory = _size(spec.resources.gpu_memory, "spec.resources.gpuMemory") if spec.resources.gpu_memory else None
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


def run(args: argparse.Namespace) -> int:
    result = plan(make_input(_inputs(args)))
    if args.output == Output.JSON.value:
        print(json.dumps(result.model_dump(mode="json", by_alias=True), indent=2))
    else:
        render(result, Console())
    return 0


def render(result: MemoryPlan, console: Console) -> None:
    """The plan as a table, in decimal GB as the ZeRO paper counts."""
    title = f"Ψ = {result.parameters:.3g} parameters, N = {result.data_parallel}, K = {result.optimizer_multiplier:g}"
    table = Table(title=title)
    for col in ("stage", "params", "grads", "optimizer", "model states / device", "comm / step"):
        table.add_column(col, justify="right")
    if result.usable_memory is not None:
        table.add_column("fits", justify="center")
    for sp in result.stages:
        comm = f"{sp.comm_elements_per_step / result.parameters:g}Ψ"
        if sp.comm_elements_with_recompute != sp.comm_elements_per_step:
            comm += f" ({sp.comm_elements_with_recompute / result.parameters:g}Ψ if recompute re-gathers)"
        row = [
            str(sp.stage.value),
            format_bytes(sp.parameter_bytes),
            format_bytes(sp.gradient_bytes),
            format_bytes(sp.optimizer_bytes),
            format_bytes(sp.model_state_bytes),
            comm,
        ]
        if result.usable_memory is not None:
            row.append("yes" if sp.fits else "no")
        table.add_row(*row)
    console.print(table)
    if result.reason:
        console.print(Text(result.reason), soft_wrap=True)
