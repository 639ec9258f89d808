"""A Hugging Face causal LM's architecture from its config alone: no torch, no transformers.

`zerotrain.runtime.models.huggingface:build` builds the model from `spec.entrypointArgs.config` (a directory
holding config.json, or the config's fields inline); this module reads the same config with `json` into the
`spec.model.architecture` block (`zerotrain.architecture.Architecture`) the plan counts parameters and activations
from: `zerotrain plan -f JOB --fill` writes that block into the manifest, so the operator, which reads no file a job
names, plans from the manifest alone, and the pod's launcher checks it against the config it loads.

A field the config leaves out takes the value transformers' config class gives it, so the count is exact either
way; a config this module does not count (another model_type, GPT-2 with cross-attention, an activation the plan
does not know) gives None.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from zerotrain.architecture import Activation, Architecture, Family

HF_ENTRYPOINT = "zerotrain.runtime.models.huggingface:build"
"""The built-in entry point that builds a Hugging Face model from `entrypointArgs.config`."""
CONFIG_FILE = "config.json"
DEFAULT_SEQ_LEN = 256
"""The entry point's `seq_len` when entrypointArgs leaves it out."""
DEFAULT_BATCH_SIZE = 8
"""The entry point's `batch_size` (the global micro-batch, all ranks together) when entrypointArgs leaves it out."""
FIELD = "spec.entrypointArgs.config"

# transformers' defaults for every field read, per family (its config classes' own, as of 4.45-5.x).
_GATED = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "sliding_window": None,
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_GATED, "vocab_size": 32000, "intermediate_size": 11008, "num_key_value_heads": None,
              "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 2048},
    "mistral": {**_GATED, "vocab_size": 32000, "intermediate_size": 14336, "num_key_value_heads": 8,
                "max_position_embeddings": 131072, "sliding_window": 4096},
    "qwen2": {**_GATED, "vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32,
              "max_position_embeddings": 32768, "use_sliding_window": False},
    "qwen3": {**_GATED, "vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32,
              "head_dim": 128, "max_position_embeddings": 32768, "attention_bias": False,
              "use_sliding_window": False},
    "mixtral": {**_GATED, "vocab_size": 32000, "intermediate_size": 14336, "num_key_value_heads": 8,
                "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 131072},
    "gpt2": {"vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_inner": None,
             "tie_word_embeddings": True, "add_cross_attention": False, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
             "attn_pdrop": 0.1, "activation_function": "gelu_new"},
}  # fmt: skip
# Other names transformers accepts for a field (its config classes' attribute_map).
ALIASES = {
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_positions": "max_position_embeddings",
    "num_local_experts": "num_experts",
}


class _Fields:
    """A config's fields with the family's defaults behind them; each read checked and named in its errors."""

    def __init__(self, config: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
        self.config, self.defaults = config, defaults

    def raw(self, key: str) -> Any:
        alias = ALIASES.get(key)
        if key in self.config:
            return self.config[key]
        if alias is not None and alias in self.config:
            return self.config[alias]
        return self.defaults.get(key)

    def count(self, key: str, fallback: int | None = None) -> int:
        value = self.raw(key)
        if value is None and fallback is not None:
            return fallback
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{FIELD}.{key}: got {value!r}; it must be a positive integer; fix the model config")
        return value

    def optional(self, key: str) -> int | None:
        return None if self.raw(key) is None else self.count(key)

    def flag(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise ValueError(f"{FIELD}.{key}: got {value!r}; it must be true or false; fix the model config")
        return value

    def probability(self, key: str) -> float:
        value = self.raw(key) or 0.0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"{FIELD}.{key}: got {value!r}; it must be a probability below 1; fix the model config")
        return float(value)

    def activation(self, key: str) -> Activation | None:
        try:
            return Activation(self.raw(key))
        except ValueError:
            return None


def _gated(family: Family, f: _Fields) -> Architecture | None:
    """llama, mistral, qwen2, qwen3 and mixtral."""
    activation = f.activation("hidden_act")
    if activation is None:
        return None
    window = f.optional("sliding_window")
    if family in (Family.QWEN2, Family.QWEN3) and not f.flag("use_sliding_window"):
        window = None
    heads = f.count("num_attention_heads")
    return Architecture(
        family=family,
        layers=f.count("num_hidden_layers"),
        hidden=f.count("hidden_size"),
        intermediate=f.count("intermediate_size"),
        heads=heads,
        kv_heads=f.count("num_key_value_heads", fallback=heads),
        head_dim=f.optional("head_dim"),
        vocabulary=f.count("vocab_size"),
        positions=f.count("max_position_embeddings"),
        tied_embeddings=f.flag("tie_word_embeddings"),
        activation=activation,
        attention_bias=f.flag("attention_bias") if family in (Family.LLAMA, Family.QWEN3) else False,
        mlp_bias=f.flag("mlp_bias") if family is Family.LLAMA else False,
        experts=f.count("num_local_experts") if family is Family.MIXTRAL else None,
        experts_per_token=f.count("num_experts_per_tok") if family is Family.MIXTRAL else None,
        sliding_window=window,
        attention_dropout=f.probability("attention_dropout"),
    )


def _gpt2(family: Family, f: _Fields) -> Architecture | None:
    """gpt2: learned positions, LayerNorms, fused QKV, a GeLU MLP of n_inner (4h by default)."""
    activation = f.activation("activation_function")
    if activation is None or f.flag("add_cross_attention"):
        return None
    hidden = f.count("n_embd")
    return Architecture(
        family=family,
        layers=f.count("n_layer"),
        hidden=hidden,
        intermediate=f.count("n_inner", fallback=4 * hidden),
        heads=f.count("n_head"),
        vocabulary=f.count("vocab_size"),
        positions=f.count("n_positions"),
        tied_embeddings=f.flag("tie_word_embeddings"),
        activation=activation,
        attention_dropout=f.probability("attn_pdrop"),
        residual_dropout=f.probability("resid_pdrop"),
        embedding_dropout=f.probability("embd_pdrop"),
    )


FAMILIES = tuple(f.value for f in Family)
"""The model types counted here; any other is left to spec.model.parameters (or --measure)."""


def architecture(config: Mapping[str, Any]) -> Architecture | None:
    """The `spec.model.architecture` block of a config's fields; None for a model this module does not count;
    ValueError naming the field when a counted one is not a positive integer (or a flag not a boolean)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        return None
    family = Family(model_type)
    fields = _Fields(config, DEFAULTS[model_type])
    return _gpt2(family, fields) if family is Family.GPT2 else _gated(family, fields)


_LOCAL_FILES: ContextVar[bool] = ContextVar("zerotrain_local_files", default=False)


@contextmanager
def local_files() -> Iterator[None]:
    """Let `read_config` read a job's config.json from this machine: the `zerotrain` command and the pod's launcher,
    where the job's files are the user's own. The operator never enters it: its admission plans from what the
    manifest carries, since a job naming a path could otherwise probe the operator's own filesystem or leak a
    file's fragments through the refusal's message."""
    token = _LOCAL_FILES.set(True)
    try:
        yield
    finally:
        _LOCAL_FILES.reset(token)


def read_config(source: object) -> Mapping[str, Any] | None:
    """The config's fields: the inline dict, or config.json of the directory; None when it cannot be read here
    (outside `local_files`, as in the operator, or where the directory exists only in the pods); ValueError when
    config.json is not a JSON object."""
    if isinstance(source, Mapping):
        return source
    if not isinstance(source, str) or not _LOCAL_FILES.get():
        return None
    path = Path(source).expanduser() / CONFIG_FILE
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        config = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{FIELD}: {path} is not valid JSON ({e}); write it again (save_pretrained)") from None
    if not isinstance(config, dict):
        raise ValueError(f"{FIELD}: {path} holds {type(config).__name__}, not an object; write it again")
    return config


CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
"""The class names whose parameters are counted here: a family's decoder with its language-model head."""


def architecture_from_args(args: Mapping[str, Any]) -> Architecture | None:
    """The architecture of `spec.entrypointArgs` for the Hugging Face entry point, from its config; None when the
    config is not readable here, its model is not counted, or `model_class` names a class other than a causal LM
    (another head, or none, has other parameters)."""
    model_class = args.get("model_class")
    if model_class is not None and not (isinstance(model_class, str) and model_class.endswith(CAUSAL_LM_SUFFIXES)):
        return None
    config = read_config(args.get("config"))
    return architecture(config) if config is not None else None


def positive_arg(args: Mapping[str, Any], key: str, default: int) -> int:
    """An entrypointArgs count (seq_len, batch_size) as the entry point takes it; ValueError naming it."""
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"spec.entrypointArgs.{key}: got {value!r}; it must be a positive integer, e.g. {default}")
    return value


FILL = "zerotrain plan -f JOB --fill"
"""The command that writes (or rewrites) spec.model.architecture from the model's config.json."""


def architecture_mismatch(declared: Architecture, config: Mapping[str, Any], where: str) -> str | None:
    """What is wrong with a manifest's architecture block against the config the ranks build the model from (`where`
    names it): one line naming the first field that differs, both values and the command that rewrites the block
    (and how many other fields differ); None when they agree."""
    found = architecture(config)
    if found is None:
        return (
            f"spec.model.architecture: {where} is a model the plan does not count (model_type "
            f"{config.get('model_type')!r}); drop the block and measure its activations with `zerotrain plan -f JOB "
            "--measure` into spec.model.activationBytes"
        )
    ours, theirs = _normalized(declared), _normalized(found)
    differ = [name for name in ours if ours[name] != theirs[name]]
    if not differ:
        return None
    name = differ[0]
    more = f" (and {len(differ) - 1} other field(s): {', '.join(differ[1:])})" if len(differ) > 1 else ""
    return (
        f"spec.model.architecture.{name}: the manifest says {ours[name]}, but {where} says {theirs[name]}{more}; "
        f"the plan was made for another model: rewrite the block with `{FILL}`"
    )


def _normalized(a: Architecture) -> dict[str, object]:
    """The block's fields by their manifest names, defaults resolved (kvHeads, headDim), enums as their values."""
    fields = a.model_dump(by_alias=True, mode="json")
    fields["kvHeads"], fields["headDim"] = a.key_value_heads, a.head_width
    return fields
