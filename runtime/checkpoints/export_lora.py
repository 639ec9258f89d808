"""A LoRA job's checkpoint exported for the peft ecosystem: its adapters alone, or merged into its base.

- `export_peft`: `adapter_config.json` and `adapter_model.safetensors` as `PeftModel.save_pretrained` writes them,
  which `peft.PeftModel.from_pretrained(base, OUT)` loads. The tensors are the adapters (`lora_A`/`lora_B`) and the
  modules trained in full (`modulesToSave`), under peft's keys: `base_model.model.` and the model's name, the adapter's
  name left out (`...q_proj.lora_A.weight`). The config is peft's own `LoraConfig` of the job's `spec.model.lora`,
  naming the base (`base_model_name_or_path`) and, for the Hugging Face entry point, `task_type: CAUSAL_LM`. Needs
  no base: the checkpoint holds everything it writes.
- `merged`: what a Hugging Face export with `--merge` writes in the base's place: every base weight under its own
  name (peft's `.base_layer` left out) with its adapters merged in, W + (alpha / rank)·B·A (transposed for GPT-2's
  Conv1D and embeddings), as peft's `merge_and_unload` computes it; the adapters themselves are not written.

Both write under temporary names and rename when complete: an interrupted export leaves nothing that looks done.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from zerotrain.hf_config import HF_ENTRYPOINT
from zerotrain.runtime.checkpoints.export import Opened, Param, open_checkpoint, read_param, read_range
from zerotrain.runtime.zero.engine_errors import ZeroSetupError
from zerotrain.runtime.zero.partition import ParamClass

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
ADAPTER = "default"
BASE_LAYER = ".base_layer"


def lora_of(ck: Opened) -> dict[str, Any]:
    """The job's spec.model.lora as its checkpoints record it; refused for a job without LoRA."""
    lora = (ck.marker.get("origin") or {}).get("lora")
    if not isinstance(lora, dict):
        raise ZeroSetupError(
            "--format",
            "peft",
            f"checkpoint {ck.path} is of a job without spec.model.lora: it has no adapters to export",
            "export its whole model with --format huggingface (or safetensors, dcp)",
        )
    return lora


def peft_key(name: str) -> str:
    """A trained parameter's key in peft's adapter file."""
    return PEFT_PREFIX + name.replace(f".{ADAPTER}.", ".").removesuffix(f".{ADAPTER}")


def peft_config(ck: Opened, base: str | None) -> dict[str, Any]:
    """adapter_config.json: peft's LoraConfig of the job's spec.model.lora, as peft itself writes it."""
    import peft

    lora = lora_of(ck)
    origin = ck.marker.get("origin") or {}
    task = "CAUSAL_LM" if origin.get("entrypoint") == HF_ENTRYPOINT else None
    targets = lora["targetModules"]
    config = peft.LoraConfig(
        r=lora.get("rank", 8),
        lora_alpha=lora.get("alpha", 8),
        lora_dropout=lora.get("dropout", 0.0),
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        # The modules that trained, by full name: peft matches these entries as suffixes of module names.
        modules_to_save=origin.get("lora_saved") or None,
        exclude_modules=(origin.get("lora_saved") or None) if targets == ["all-linear"] else None,
        task_type=task,
        base_model_name_or_path=base,
    )
    out: dict[str, Any] = config.to_dict()
    return json.loads(json.dumps(out, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def export_peft(path: str | os.PathLike[str], out: Path, dtype: torch.dtype | None = None) -> list[str]:
    """Write the adapters of the checkpoint at `path` to the empty directory `out`; the keys written."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ZeroSetupError("--out", str(out), "is not an empty directory", "choose a new or empty directory")
    ck = open_checkpoint(path, whole=False)  # the adapters and what trained: never the base
    lora_of(ck)
    trained = [p for p in ck.params if p.kind != ParamClass.FROZEN]
    tensors = {peft_key(p.name): read_param(ck, p).to(dtype or torch.float32).contiguous() for p in trained}
    origin = ck.marker.get("origin") or {}
    config = peft_config(ck, origin.get("pretrained"))
    out.mkdir(parents=True, exist_ok=True)
    partial = out / f".{WEIGHTS}.partial"
    save_file(tensors, str(partial), metadata={"format": "pt"})
    partial.rename(out / WEIGHTS)
    config_partial = out / f".{CONFIG}.partial"
    config_partial.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    config_partial.rename(out / CONFIG)
    return sorted(tensors)


@dataclass(frozen=True)
class Merge:
    """A base weight and the adapters merged into it."""

    a: Param
    b: Param
    scale: float
    transposed: bool
    """The weight is stored as (in, out): the transpose of B·A is added (GPT-2's Conv1D, embeddings)."""


def merged(ck: Opened) -> list[tuple[str, Param, Merge | None]]:
    """What a merged export writes of the parameters, in order: (its name in the base, the parameter, the adapters
    merged into it, if any); the adapters themselves are left out."""
    origin = ck.marker.get("origin") or {}
    layers: dict[str, dict[str, Any]] = origin.get("lora_layers") or {}
    lora_of(ck)
    by_name = {p.name: p for p in ck.params}
    adapters = {layer[k] for layer in layers.values() for k in ("a", "b")}
    merges: dict[str, Merge] = {}
    for name, layer in layers.items():
        if not layer["mergeable"]:
            raise ZeroSetupError(
                "--merge",
                True,
                f"layer {name} is not linear or an embedding: its adapters cannot be merged here",
                "export the adapters with --format peft and merge them with peft's merge_and_unload",
            )
        merges[layer["weight"]] = Merge(by_name[layer["a"]], by_name[layer["b"]], layer["scale"], layer["transposed"])
    return [(p.name.replace(BASE_LAYER + ".", "."), p, merges.get(p.name)) for p in ck.params if p.name not in adapters]


def merged_rows(ck: Opened, p: Param, m: Merge, r0: int, r1: int) -> torch.Tensor:
    """Rows [r0, r1) of base weight `p` with its adapters merged in, fp32."""
    cols = p.shape[1]
    w = read_range(ck, p, r0 * cols, r1 * cols).view(r1 - r0, cols)
    a, b = read_param(ck, m.a), read_param(ck, m.b)
    delta = (a[:, r0:r1].T @ b.T) if m.transposed else (b[r0:r1] @ a)
    return w + delta * m.scale
