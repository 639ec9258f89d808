"""A checkpoint exported as Hugging Face saves a model: what `from_pretrained` and inference stacks read.

- Tensors under the model's own names (a tied parameter once, under its first name, as `save_pretrained` drops the
  tied copy), the persistent buffers beside them, in the output dtype (`--dtype`; floating buffers too, integer
  ones keep theirs).
- Shards of at most `--max-shard-size` bytes (5 GB by default, as `transformers`; a tensor larger than that is a
  shard of its own), named `model-0000k-of-0000n.safetensors`, with `model.safetensors.index.json` (its
  `weight_map` and `total_size`); a model that fits one shard is one `model.safetensors`, as `transformers` writes.
- Streamed: each tensor is read from the rank files a chunk at a time (`CHUNK_ELEMENTS`), converted and written, so
  the export holds one chunk, never a shard or the model.
- Atomic: every shard is written under a temporary name and renamed once all are complete; the index comes last.
  An interrupted export leaves no index and no file under a final name.
- The configuration and tokenizer files of the directory the job started from (`spec.model.pretrained`, recorded in
  the checkpoint) are copied beside the shards, or of `--copy-from`; config.json's dtype is set to the one written,
  so `from_pretrained` loads what the export holds.
- A LoRA job's model is its base and its adapters: `merge` writes the base's weights with the adapters merged in,
  under the base's own names (`export_lora.merged`), reading the base the checkpoint refers to (`base`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from zerotrain.hf_config import CONFIG_FILE
from zerotrain.runtime.checkpoints.export import (
    SAFETENSORS_DTYPES,
    Opened,
    Param,
    StoredTensors,
    open_checkpoint,
    read_range,
    tensor_bytes,
)
from zerotrain.runtime.checkpoints.export_lora import Merge, merged, merged_rows
from zerotrain.runtime.zero.engine_errors import ZeroSetupError
from zerotrain.weights_layout import INDEX, SINGLE, Kind, layout

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
CHUNK_ELEMENTS = 4 << 20
"""Elements read, converted and written at a time: 16 MiB of fp32, the export's whole working memory."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")
"""Files a config copy leaves behind: weights, which the export itself writes."""


@dataclass(frozen=True)
class Item:
    """One output tensor: a parameter (read from its unit's ranges, its adapters merged in) or a buffer (whole)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    param: Param | None = None
    merge: Merge | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty(0, dtype=self.dtype).element_size()


def items(ck: Opened, dtype: torch.dtype | None, merge: bool = False) -> list[Item]:
    """Every tensor the export writes, in the checkpoint's order, in its output dtype."""
    if merge:
        out = [Item(name, p.shape, dtype or torch.float32, p, m) for name, p, m in merged(ck)]
    else:
        out = [Item(p.name, p.shape, dtype or torch.float32, p) for p in ck.params]
    for name, b in ck.buffers.items():
        kept = dtype if dtype is not None and b.dtype.is_floating_point else b.dtype
        out.append(Item(name, tuple(b.shape), kept))
    return out


def plan_shards(tensors: list[Item], max_bytes: int) -> list[list[Item]]:
    """Tensors in order, cut into shards of at most `max_bytes` (a larger tensor alone in its own)."""
    shards: list[list[Item]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def shard_names(count: int) -> list[str]:
    if count == 1:
        return [SINGLE]
    return [f"model-{k:05d}-of-{count:05d}.safetensors" for k in range(1, count + 1)]


def _header(shard: list[Item]) -> bytes:
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in shard:
        entries[t.name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _write_tensor(ck: Opened, t: Item, f: object) -> None:
    write = f.write  # type: ignore[attr-defined]
    if t.param is None:
        write(tensor_bytes(ck.buffers[t.name].to(t.dtype)))
        return
    p = t.param
    if t.merge is not None:
        rows = max(1, CHUNK_ELEMENTS // p.shape[1])
        for r0 in range(0, p.shape[0], rows):
            write(tensor_bytes(merged_rows(ck, p, t.merge, r0, min(p.shape[0], r0 + rows)).to(t.dtype)))
        return
    for lo in range(0, p.numel, CHUNK_ELEMENTS):
        hi = min(p.numel, lo + CHUNK_ELEMENTS)
        write(tensor_bytes(read_range(ck, p, lo, hi).to(t.dtype)))


def _refuse(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ZeroSetupError(
            "--out", str(out), "is not an empty directory", "choose a new or empty directory for the export"
        )


def config_source(ck: Opened, copy_from: Path | None) -> Path | None:
    """Where the configuration and tokenizer files come from: --copy-from, else the directory the job started
    from when it was one as Hugging Face writes it."""
    if copy_from is not None:
        if not copy_from.is_dir():
            raise ZeroSetupError("--copy-from", str(copy_from), "is not a directory", "name the model's directory")
        return copy_from
    started = (ck.marker.get("origin") or {}).get("pretrained")
    if not started or not Path(started).is_dir():
        return None
    return Path(started) if layout(started).kind is not Kind.CHECKPOINT else None


# What Hugging Face keeps beside the weights: configs and tokenizers (vocab.json, merges.txt, tokenizer.model, chat
# templates); a directory's scripts or manifests are not the model's.
CONFIG_SUFFIXES = (".json", ".txt", ".model", ".tiktoken", ".jinja")


def copy_config(source: Path, out: Path, dtype: torch.dtype) -> list[str]:
    """The configuration and tokenizer files of `source` (config.json, generation_config.json, tokenizer.json, …);
    config.json's dtype becomes `dtype`, the one the weights are written in."""
    copied = []
    for f in sorted(source.iterdir()):
        keep = f.suffix in CONFIG_SUFFIXES and not f.name.endswith(".index.json")  # another save's weight map
        if f.is_file() and not f.name.startswith(".") and keep:
            shutil.copy2(f, out / f.name)
            copied.append(f.name)
    config = out / CONFIG_FILE
    if CONFIG_FILE in copied:
        fields = json.loads(config.read_text())
        written = str(dtype).removeprefix("torch.")
        # transformers 5 reads "dtype", older releases "torch_dtype": both say what the shards hold.
        fields.update({key: written for key in ("dtype", "torch_dtype") if key in fields} or {"dtype": written})
        config.write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")
    return copied


@dataclass(frozen=True)
class Exported:
    """What an export wrote."""

    shards: list[str]
    total_bytes: int
    copied: list[str]


def export_huggingface(
    path: str | os.PathLike[str],
    out: Path,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    copy_from: Path | None = None,
    base: StoredTensors | None = None,
    merge: bool = False,
) -> Exported:
    """Write the checkpoint at `path` (its newest under a root) to the empty directory `out` (see the module);
    `merge`: a LoRA job's adapters merged into its base, read from `base`."""
    _refuse(out)
    ck = open_checkpoint(path, base)
    lora = (ck.marker.get("origin") or {}).get("lora") is not None
    if merge and not lora:
        raise ZeroSetupError(
            "--merge",
            True,
            f"checkpoint {ck.path} is of a job without spec.model.lora: it has no adapters",
            "drop --merge",
        )
    if lora and not merge:
        raise ZeroSetupError(
            "--format",
            "huggingface",
            f"checkpoint {ck.path} is of a LoRA job: its model is a base with adapters, which transformers does not "
            "load as one model",
            "add --merge to write the adapters merged into the base, or export the adapters with --format peft",
        )
    source = config_source(ck, copy_from)
    shards = plan_shards(items(ck, dtype, merge), max_shard_bytes)
    names = shard_names(len(shards))
    out.mkdir(parents=True, exist_ok=True)
    partial = [out / f".{name}.partial" for name in names]
    for shard, tmp in zip(shards, partial, strict=True):
        with tmp.open("wb") as f:
            f.write(_header(shard))
            for t in shard:
                _write_tensor(ck, t, f)
            f.flush()
            os.fsync(f.fileno())
    for name, tmp in zip(names, partial, strict=True):
        tmp.rename(out / name)
    total = sum(t.nbytes for shard in shards for t in shard)
    if len(shards) > 1:
        weight_map = {t.name: name for shard, name in zip(shards, names, strict=True) for t in shard}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        tmp_index = out / f".{INDEX}.partial"
        tmp_index.write_text(json.dumps(index, indent=2) + "\n")
        tmp_index.rename(out / INDEX)
    copied = copy_config(source, out, dtype or torch.float32) if source is not None else []
    return Exported(names, total, copied)
