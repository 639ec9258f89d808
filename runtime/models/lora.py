"""`spec.model.lora`: peft's LoRA adapters added to the entry point's model, inside its partitioned construction.

The adapters are injected with `peft.inject_adapter_in_model` right after the entry point returns its task, while
the construction is still open: each new `lora_A`/`lora_B` is handed over as every other parameter is (the rank
keeps its slice; peft's own init, `kaiming_uniform_` and `zeros_`, is recorded and replayed), so a rank never holds
more than its share, and the values are exactly those a single process gets from `peft` with the same seed. peft
freezes every other parameter; `modulesToSave` are unfrozen (trained in full, no copy kept). The model keeps its
class and its units; its targeted layers' weights are renamed `<layer>.base_layer.weight`, as peft names them, and
the adapters are `<layer>.lora_A.default.weight` and `<layer>.lora_B.default.weight`.

Everything a manifest can get wrong is refused before peft runs, naming the field, the value and the fix.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType

from torch import nn

from zerotrain.lora_config import LoraSpec
from zerotrain.runtime.job.task import ConfigError

FIELD = "spec.model.lora"
ADAPTER = "default"
"""peft's adapter name: the one adapter a job trains."""
ALL_LINEAR = "all-linear"
ADAPTER_LAYERS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")
"""The attributes of peft's LoRA layers that hold adapter parameters."""
BASE_LAYER = ".base_layer"
"""What peft puts between a targeted layer's name and its own parameters."""


def _peft() -> ModuleType:
    try:
        return importlib.import_module("peft")
    except ImportError:
        raise ConfigError(
            f"{FIELD}: set, but the peft library is not installed in this image; pip install peft "
            "(or zerotrain[hf]), or drop spec.model.lora"
        ) from None


def _adaptable(module: nn.Module) -> bool:
    """A layer peft's LoRA can wrap: linear, embedding, convolution, or transformers' Conv1D (GPT-2)."""
    kinds = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    return isinstance(module, kinds) or type(module).__name__ == "Conv1D"


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith(f".{target}")


def _layer_names(model: nn.Module) -> list[str]:
    """The last part of every adaptable layer's name, once each: what a manifest can target."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if name and _adaptable(m)})


def check_targets(model: nn.Module, lora: LoraSpec) -> None:
    """Every target and every module to save names at least one layer of this model (peft itself goes on when some
    of them match nothing); a target names layers peft can wrap."""
    layers = {name: m for name, m in model.named_modules() if name}
    known = ", ".join(_layer_names(model))
    for field, wanted in (("targetModules", lora.target_modules), ("modulesToSave", lora.modules_to_save)):
        for i, target in enumerate(wanted):
            if field == "targetModules" and target == ALL_LINEAR:
                continue
            hits = [m for name, m in layers.items() if _matches(name, target)]
            if not hits:
                raise ConfigError(
                    f"{FIELD}.{field}[{i}]: got {target!r}, which names no module of "
                    f"{type(model).__name__}; use the name (or the end of the dotted name) of one of its layers: "
                    f"{known}"
                )
            if field == "targetModules" and not any(_adaptable(m) for m in hits):
                kinds = sorted({type(m).__name__ for m in hits})
                raise ConfigError(
                    f"{FIELD}.targetModules[{i}]: got {target!r}, which names {', '.join(kinds)} module(s); LoRA "
                    f"adapts linear, embedding and convolution layers: target one of {known}"
                )
    both = [
        name
        for name in layers
        if any(_matches(name, t) for t in lora.modules_to_save) and any(_matches(name, t) for t in lora.target_modules)
    ]
    if both:  # with all-linear, the modules to save are left out of the adapted ones (`peft_config`)
        raise ConfigError(
            f"{FIELD}.modulesToSave: names {both[0]}, which targetModules names too; a module trains either through "
            "adapters or in full: leave it out of one of them"
        )
    if ALL_LINEAR in lora.target_modules and len(lora.target_modules) > 1:
        raise ConfigError(
            f"{FIELD}.targetModules: got {lora.target_modules}; {ALL_LINEAR} already names every linear layer, so "
            "give it alone or list the layers"
        )


def _check_tied(model: nn.Module, lora: LoraSpec) -> None:
    """A module to save must not share a weight with another module (peft would train a copy of it; here the one
    weight would train under both names)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    for i, target in enumerate(lora.modules_to_save):
        for mname, module in model.named_modules():
            if not mname or not _matches(mname, target):
                continue
            for pname, p in module.named_parameters(prefix=mname):
                shared = [n for n in names[id(p)] if n != pname]
                if shared:
                    raise ConfigError(
                        f"{FIELD}.modulesToSave[{i}]: got {target!r}, whose {pname} is tied to {shared[0]}; training "
                        "it would train both: untie them (tie_word_embeddings: false) or leave it out"
                    )


def peft_config(lora: LoraSpec, saved: list[str]) -> object:
    """peft's LoraConfig for the spec (the adapters' own; the modules to save, `saved`, are trained by unfreezing
    them, and left out of all-linear)."""
    every = lora.target_modules == [ALL_LINEAR]
    targets: str | list[str] = ALL_LINEAR if every else list(lora.target_modules)
    return _peft().LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        exclude_modules=saved if every and saved else None,
    )


def apply(model: nn.Module, lora: LoraSpec) -> nn.Module:
    """Add the adapters to `model` in place (peft), freeze the rest but `modulesToSave`; the same model."""
    check_targets(model, lora)
    _check_tied(model, lora)
    try:
        _peft().inject_adapter_in_model(peft_config(lora, saved_modules(model, lora)), model, adapter_name=ADAPTER)
    except ValueError as e:  # what peft refuses beyond the checks above (a layer type it cannot wrap)
        first = str(e).strip().splitlines()[0]
        raise ConfigError(f"{FIELD}: peft cannot add these adapters ({first}); target other layers") from None
    for name in saved_modules(model, lora):
        model.get_submodule(name).requires_grad_(True)
    return model


def saved_modules(model: nn.Module, lora: LoraSpec) -> list[str]:
    """The full names of the modules `modulesToSave` names (its entries match a name or the end of a dotted one;
    an adapter export lists these names, so that peft's own suffix match finds exactly them)."""
    return [name for name, _ in model.named_modules() if name and any(_matches(name, t) for t in lora.modules_to_save)]


def adapter_names(model: nn.Module) -> list[str]:
    """The adapters' parameter names (new parameters: no pretrained weights hold them)."""
    pattern = re.compile(r"\.(" + "|".join(ADAPTER_LAYERS) + r")\.")
    return [name for name, _ in model.named_parameters() if pattern.search(f".{name}")]


def base_name(name: str) -> str:
    """A parameter's name in the base model: peft's `.base_layer` left out."""
    return name.replace(BASE_LAYER + ".", ".")


def layers(model: nn.Module) -> dict[str, dict[str, object]]:
    """Every adapted layer, as a checkpoint records it for an export that merges the adapters into the base:
    its weight's name, its adapters' (A, B), their scale (alpha / rank) and whether the weight is stored transposed
    to B·A (GPT-2's Conv1D, embeddings): W' = W + scale·(B·A), or its transpose."""
    tuner = importlib.import_module("peft.tuners.lora")
    out: dict[str, dict[str, object]] = {}
    for name, module in model.named_modules():
        if not isinstance(module, tuner.LoraLayer):
            continue
        base = module.get_base_layer()
        embedding = ADAPTER in getattr(module, "lora_embedding_A", {})
        a, b = ("lora_embedding_A", "lora_embedding_B") if embedding else ("lora_A", "lora_B")
        suffix = "" if embedding else ".weight"
        out[name] = {
            "weight": f"{name}{BASE_LAYER}.weight",
            "a": f"{name}.{a}.{ADAPTER}{suffix}",
            "b": f"{name}.{b}.{ADAPTER}{suffix}",
            "scale": float(module.scaling[ADAPTER]),
            "transposed": embedding or bool(getattr(module, "fan_in_fan_out", False)),
            "mergeable": isinstance(base, (nn.Linear, nn.Embedding)) or type(base).__name__ == "Conv1D",
        }
    return out
