"""Pretrained weights into the rank's shard: names matched, shapes checked, every range read once.

Matching (`match`), decided from the names and shapes alone, before anything is read or allocated:

- A model tensor (each parameter under any of its names, tied ones included; each persistent buffer) takes the
  stored tensor of the same name. Failing that, one prefix may stand between them for all names at once: the
  stored names carry it and the model's do not (`model.` in: weights of `LlamaForCausalLM` into a `LlamaModel`), or
  the other way round (`model.` out: a model that wraps the pretrained one under `model`). The rule that matches
  the most names is used, and said; exact names win a tie.
- A model tensor the weights lack is refused unless `newParameters` names it, or it is one the runtime added (LoRA's
  adapters): it keeps the model's own init. A tensor the runtime renamed (peft's `<layer>.base_layer.weight`) is
  looked for under its name in the base model too.
- A stored tensor the model lacks is refused unless `unusedKeys` names it, it is one of the model's non-persistent
  buffers (Hugging Face once saved `rotary_emb.inv_freq`), or the model's own `_keys_to_ignore_on_load_unexpected`
  says so. Both refusals list both sides.
- Shapes must be equal; a parameter must be stored in a floating dtype (converted into the fp32 master).

`PretrainedValues` is then the engine's `ParameterSource`: each unit's range is read from the files (one read per
parameter piece, chunked), and a new parameter's values come from the partitioned construction (whose gather runs
only for units that hold one). A tied parameter is read once, from whichever of its names the weights hold.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch
from torch import nn

from zerotrain.runtime.construction.materialize import ConstructedValues
from zerotrain.runtime.construction.weight_files import WeightStore
from zerotrain.runtime.zero.buffers import persistent_buffers
from zerotrain.runtime.zero.collectives import Comm
from zerotrain.runtime.zero.param_source import ParameterSource
from zerotrain.runtime.zero.partition import UnitLayout
from zerotrain.spec import PretrainedSpec
from zerotrain.weights_layout import FLOAT_DTYPES, WeightsError

SHOWN = 5
"""Names listed per side in a refusal."""


@dataclass(frozen=True)
class Rule:
    """How a model name becomes a stored name: a prefix added to it, or removed from it."""

    add: str = ""
    strip: str = ""

    def stored(self, name: str) -> str | None:
        if self.strip:
            return self.add + name[len(self.strip) :] if name.startswith(self.strip) else None
        return self.add + name

    def __str__(self) -> str:
        if self.add:
            return f"the weights' names carry the prefix {self.add!r}, the model's do not"
        if self.strip:
            return f"the model's names carry the prefix {self.strip!r}, the weights' do not"
        return "exact names"


@dataclass
class Matched:
    """Which stored tensor each model tensor reads, and what is left to the model's own init."""

    params: dict[str, str] = field(default_factory=dict)
    """Parameter (the name its unit slot has) -> stored name."""
    buffers: dict[str, str] = field(default_factory=dict)
    """Persistent buffer -> stored name."""
    new: list[str] = field(default_factory=list)
    """Model tensors the weights do not hold, initialised by the model's own code (newParameters)."""
    unused: list[str] = field(default_factory=list)
    """Stored tensors left unread."""
    rule: Rule = field(default_factory=Rule)


def _names(model: nn.Module, renamed: Callable[[str], str]) -> dict[str, list[str]]:
    """Each parameter (under the name it is kept under) with all its names, then each persistent buffer; a name the
    runtime changed is followed by its name in the base model."""
    owner: dict[int, str] = {}
    out: dict[str, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first = owner.setdefault(id(p), name)
        out.setdefault(first, []).extend(dict.fromkeys([name, renamed(name)]))
    return out | {name: list(dict.fromkeys([name, renamed(name)])) for name in persistent_buffers(model)}


def _rules(model_names: list[str], stored: set[str]) -> list[Rule]:
    heads = {n.split(".", 1)[0] + "." for n in model_names if "." in n}
    stored_heads = {n.split(".", 1)[0] + "." for n in stored if "." in n}
    return [Rule(), *(Rule(strip=h) for h in sorted(heads)), *(Rule(add=h) for h in sorted(stored_heads))]


def _find(candidates: list[str], rule: Rule, stored: set[str]) -> str | None:
    return next((s for c in candidates if (s := rule.stored(c)) is not None and s in stored), None)


def _best_rule(names: dict[str, list[str]], stored: set[str]) -> Rule:
    scored = [
        (sum(_find(c, r, stored) is not None for c in names.values()), -i, r)
        for i, r in enumerate(_rules(list(names), stored))
    ]
    return max(scored, key=lambda x: (x[0], x[1]))[2]


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _ignored(model: nn.Module, name: str, spec: PretrainedSpec, rule: Rule) -> bool:
    if any(fnmatch.fnmatchcase(name, pat) for pat in spec.unused_keys):
        return True
    transient = {
        rule.stored(f"{prefix}.{b}" if prefix else b)
        for prefix, m in model.named_modules()
        for b in m._non_persistent_buffers_set
    }
    patterns = getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []
    return name in transient or any(re.search(pat, name) for pat in patterns)


def _same(name: str) -> str:
    return name


def match(
    model: nn.Module,
    store: WeightStore,
    spec: PretrainedSpec,
    added: Collection[str] = (),
    renamed: Callable[[str], str] = _same,
) -> Matched:
    """Map the model onto the stored tensors (see the module docstring); WeightsError when they do not fit. `added`:
    parameters the runtime added (new, whatever newParameters says); `renamed`: a name in the base model."""
    names, stored = _names(model, renamed), set(store.entries)
    rule = _best_rule(names, stored)
    params = dict(model.named_parameters())
    found, used = Matched(rule=rule), set()
    missing: list[str] = []
    for name, candidates in names.items():
        hit = _find(candidates, rule, stored)
        if hit is None:
            listed = name in added or any(fnmatch.fnmatchcase(name, p) for p in spec.new_parameters)
            (found.new if listed else missing).append(name)
            continue
        used.add(hit)
        (found.params if name in params else found.buffers)[name] = hit
    extra = sorted(n for n in stored - used if not _ignored(model, n, spec, rule))
    found.unused = sorted(stored - used - set(extra))
    if missing or extra:
        raise WeightsError(
            spec.path,
            f"the model's names and the weights' do not match ({rule}): {len(missing)} of the model's tensors are not "
            f"in the weights ({_listed(missing) or 'none'}), {len(extra)} of the weights' are not in the model "
            f"({_listed(extra) or 'none'})",
            "list the model's new tensors in spec.model.pretrained.newParameters (they keep the model's own init) "
            "and the weights' extra ones in unusedKeys, or point path at weights of this model",
        )
    _check_shapes(model, store, found, spec)
    return found


def _check_shapes(model: nn.Module, store: WeightStore, found: Matched, spec: PretrainedSpec) -> None:
    tensors = {**dict(model.named_parameters()), **persistent_buffers(model)}
    for name, hit in {**found.params, **found.buffers}.items():
        entry = store.entries[hit]
        if entry.shape != tuple(tensors[name].shape):
            raise WeightsError(
                spec.path,
                f"{hit} has shape {list(entry.shape)} in the weights but {name} has {list(tensors[name].shape)} in the "
                "model",
                "use weights of this model's configuration (or list it in newParameters to initialise it afresh)",
            )
        if name in found.params and entry.dtype not in FLOAT_DTYPES:
            raise WeightsError(
                spec.path,
                f"{hit} is stored as {entry.dtype}, which a parameter cannot be converted from",
                f"store parameters in one of {', '.join(FLOAT_DTYPES)}",
            )


def load_buffers(model: nn.Module, store: WeightStore, found: Matched) -> None:
    """The matched persistent buffers, read whole (they are small) into the model's own, in their dtypes."""
    live = persistent_buffers(model)
    with torch.no_grad():
        for name, hit in found.buffers.items():
            buf = live[name]
            values = torch.empty(buf.numel(), dtype=buf.dtype)
            store.read_into(hit, 0, buf.numel(), values)
            buf.copy_(values.view_as(buf))


class PretrainedValues:
    """The engine's source for a model that starts from pretrained weights (see the module docstring)."""

    def __init__(self, store: WeightStore, found: Matched, base: ParameterSource) -> None:
        """`base` gives the new parameters' values: the partitioned construction, or a model built whole."""
        self.store, self.found, self.base = store, found, base

    def fill(self, layout: UnitLayout, lo: int, hi: int, out: torch.Tensor, comm: Comm) -> None:
        new = {s.name for s in layout.slots if s.name in self.found.new}
        if isinstance(self.base, ConstructedValues):
            out.zero_()
            if new:  # a collective: every rank decides it from the same names
                self.base.fill(layout, lo, hi, out, comm, only=new)
            self.base.drop([s.name for s in layout.slots if s.name not in new])
        else:
            self.base.fill(layout, lo, hi, out, comm)
        self.read_loaded(layout, lo, hi, out)

    def read_loaded(self, layout: UnitLayout, lo: int, hi: int, out: torch.Tensor) -> None:
        """The pretrained parameters' part of [lo, hi) into `out`, the rest of it left as it is."""
        for slot in layout.slots:
            a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
            if a < b and slot.name in self.found.params:
                self.store.read_into(
                    self.found.params[slot.name], a - slot.offset, b - slot.offset, out[a - lo : b - lo]
                )
