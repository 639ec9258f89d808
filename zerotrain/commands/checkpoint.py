"""`zerotrain checkpoint inspect|export DIR`: look into a run's sharded checkpoints, or export the model.

`inspect` lists every checkpoint under a checkpoint root (or one checkpoint): step, samples, world size, stage,
bytes per rank, and whether it is complete (committed, every digest verified). `export` writes the newest
complete checkpoint (or the one named) as one safetensors file of the model's weights, or as a
torch.distributed.checkpoint directory that FSDP2 and torchtitan load, or a directory as Hugging Face saves a model.
"""

from __future__ import annotations

import argparse
import enum
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from zerotrain.commands import runtime_calls as rt
from zerotrain.commands.tables import Rows, print_rows
from zerotrain.quantity import format_bytes

INSPECT = """List every checkpoint under a checkpoint root (or one checkpoint): step, samples, world size, stage, bytes
per rank, and whether it is complete (committed, every digest verified)."""

EXPORT = """Write the newest complete checkpoint under a root (or the one named) as one safetensors file of the model's
weights and buffers (safetensors), a torch.distributed.checkpoint directory with the optimizer state (dcp), sharded
safetensors with their index as transformers saves a model (huggingface; a LoRA job's with --merge), or a LoRA job's
adapters as peft saves them (peft). Reads a chunk at a time: never the whole model. A LoRA job's checkpoint holds
what trained: the base it refers to is read (and checked against its digest) where an export needs it."""


class ExportFormat(str, enum.Enum):
    """What `export` writes."""

    SAFETENSORS = "safetensors"
    DCP = "dcp"
    HUGGINGFACE = "huggingface"
    PEFT = "peft"


class ExportDtype(str, enum.Enum):
    """The dtype a Hugging Face export writes its floating tensors in."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


def export_dtype(name: str) -> Any:
    """--dtype as a torch dtype (None: fp32, the master's); torch is imported only when a command exports."""
    import torch

    return {ExportDtype.BF16.value: torch.bfloat16, ExportDtype.FP16.value: torch.float16}.get(name)


class OutputFormat(str, enum.Enum):
    TABLE = "table"
    JSON = "json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("checkpoint", help="inspect or export sharded checkpoints", description=__doc__)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    i = actions.add_parser("inspect", help="list checkpoints and verify them", description=INSPECT)
    i.add_argument("dir", help="a checkpoint root (a run's --checkpoint-dir) or one step-* directory")
    i.add_argument("--output", choices=[o.value for o in OutputFormat], default=OutputFormat.TABLE.value)
    i.set_defaults(func=inspect)
    e = actions.add_parser("export", help="export the model of a checkpoint", description=EXPORT)
    e.add_argument("dir", help="a checkpoint root (its newest complete checkpoint is used) or one step-* directory")
    e.add_argument(
        "--format",
        choices=[f.value for f in ExportFormat],
        default=ExportFormat.SAFETENSORS.value,
        help="safetensors: one file of the weights; dcp: a torch.distributed.checkpoint directory; huggingface: a "
        "directory from_pretrained loads; peft: a LoRA job's adapters as PEFT saves them",
    )
    e.add_argument(
        "--out", required=True, help="the .safetensors file, the DCP directory, or the (empty) Hugging Face directory"
    )
    e.add_argument("--optimizer", action="store_true", help="DCP only: include the optimizer state")
    e.add_argument("--force", action="store_true", help="replace --out if it exists (not for huggingface)")
    e.add_argument(
        "--max-shard-size",
        default="5GB",
        help="huggingface: the largest shard (5GB, 500MB, 2Gi; default 5GB as transformers)",
    )
    e.add_argument(
        "--dtype",
        choices=[d.value for d in ExportDtype],
        default=ExportDtype.FP32.value,
        help="huggingface: the dtype of the floating tensors (default fp32, the master's)",
    )
    e.add_argument(
        "--copy-from",
        help="huggingface: copy config and tokenizer files from this directory (default: the job's pretrained one)",
    )
    e.add_argument(
        "--merge", action="store_true", help="huggingface, for a LoRA job: the adapters merged into the base's weights"
    )
    e.add_argument(
        "--base",
        help="a LoRA job's base weights, when not where the job read them (spec.model.pretrained.path); checked "
        "against the digest its checkpoint recorded",
    )
    e.set_defaults(func=export)


def inspect(args: argparse.Namespace) -> int:
    rows = rt.inspect_checkpoints(args.dir)
    if args.output == OutputFormat.JSON.value:
        print(json.dumps(rows, indent=2))
        return 0
    print_rows(table(rows), Console())
    return 0 if any(r["complete"] for r in rows) else 1


def table(rows: list[dict[str, Any]]) -> Rows:
    """Checkpoints as table rows; every value is plain Text, so names and paths print as they are."""
    columns = ("checkpoint", "step", "samples", "world", "stage", "bytes per rank", "complete")
    t = Rows("checkpoints", columns, left=frozenset({"checkpoint", "complete"}))
    for r in rows:
        sizes = list(r["bytes_per_rank"].values())
        low, high = (format_bytes(min(sizes)), format_bytes(max(sizes))) if sizes else ("-", "-")
        spread = low if low == high else f"{low}-{high}"  # a range only where it reads as one
        verdict = "yes (verified)" if r["complete"] else f"no: {r.get('problem', '')}"
        cells = [Path(r["path"]).name, r.get("step"), r.get("samples") or "-", r.get("world_size", "-")]
        cells += [r.get("stage", "-"), f"{len(sizes)} × {spread}", verdict]
        t.add(*(Text(str(c), style="green" if c == verdict and r["complete"] else "") for c in cells))
    return t


def export(args: argparse.Namespace) -> int:
    if args.optimizer and args.format != ExportFormat.DCP.value:
        raise rt.ZeroSetupError("--optimizer", True, "only DCP exports carry optimizer state", "add --format dcp")
    if args.merge and args.format != ExportFormat.HUGGINGFACE.value:
        raise rt.ZeroSetupError("--merge", True, "only Hugging Face exports merge adapters", "add --format huggingface")
    out = Path(args.out)
    if args.format == ExportFormat.PEFT.value:
        keys = rt.export_peft(args.dir, out, export_dtype(args.dtype))
        Console().print(Text(f"wrote {out}: adapter_config.json, {len(keys)} tensors in adapter_model.safetensors"))
        return 0
    base = open_base(args.dir, args.base)
    if args.format == ExportFormat.HUGGINGFACE.value:
        return export_huggingface(args, out, base)
    if args.format == ExportFormat.SAFETENSORS.value:
        written = rt.export_safetensors(args.dir, out, force=args.force, base=base)
    else:
        written = rt.export_dcp(args.dir, out, optimizer=args.optimizer, force=args.force, base=base)
    Console().print(Text(f"wrote {written} ({args.format})"))
    return 0


def shard_bytes(text: str) -> int:
    """--max-shard-size: a Kubernetes quantity (5G, 2Gi) or transformers' spelling (5GB, 500MB)."""
    from zerotrain.quantity import parse_bytes

    value = parse_bytes(text.removesuffix("B") if text.endswith(("KB", "MB", "GB", "TB")) else text)
    if value is None or value < 1:
        raise rt.ZeroSetupError("--max-shard-size", text, "is not a size", "use e.g. 5GB, 500MB or 2Gi")
    return value


def open_base(checkpoint: str, given: str | None) -> rt.StoredTensors | None:
    """The frozen base the newest checkpoint at `checkpoint` refers to (None when it holds the whole model): at
    `given`, else where the job read it; refused when missing or not the one the checkpoint was trained on."""
    from zerotrain.weights_layout import digest

    ref = rt.base_needed(checkpoint)
    if ref is None:
        return None
    path = given or ref.path
    field = "--base" if given else "the checkpoint's base"
    if not Path(path).exists():
        fix = "pass --base with the base's path (the weights the job read: spec.model.pretrained.path)"
        raise rt.ZeroSetupError(field, path, f"does not exist (the frozen base, digest {ref.digest})", fix)
    found = digest(path)
    if found != ref.digest:
        raise rt.ZeroSetupError(
            field,
            path,
            f"has digest {found}, but the checkpoint was trained on {ref.path}, digest {ref.digest}",
            "pass --base with the base the job was trained on",
        )
    return rt.open_weights(path)


def export_huggingface(args: argparse.Namespace, out: Path, base: rt.StoredTensors | None) -> int:
    copy_from = Path(args.copy_from) if args.copy_from else None
    dtype = export_dtype(args.dtype)
    done = rt.export_huggingface(args.dir, out, dtype, shard_bytes(args.max_shard_size), copy_from, base, args.merge)
    copied = f"; copied {', '.join(done.copied)}" if done.copied else "; no config copied (use --copy-from)"
    Console().print(
        Text(f"wrote {out}: {len(done.shards)} shard(s), {format_bytes(done.total_bytes)} ({args.dtype}){copied}"),
        soft_wrap=True,
    )
    return 0
