"""A Hugging Face causal LM's size from its config alone: no torch, no transformers, so the operator can plan.

`zerotrain.runtime.models.huggingface:build` builds the model from `spec.entrypointArgs.config` (a directory
holding config.json, or the config's fields inline); this module reads the same config with `json` and counts,
for the families below, exactly what transformers builds:

- llama, mistral, qwen2: pre-norm blocks of grouped-query attention (q, k, v, o projections; head_dim and
  num_key_value_heads from the config), a gated MLP of intermediate_size (gate, up, down) and two RMSNorms; biases
  where the family has them (llama: attention_bias on q, k, v, o and mlp_bias; qwen2: on q, k, v); the root is the
  embedding, the final norm and the output head unless tie_word_embeddings.
- mixtral: the same attention, and num_local_experts gated experts of intermediate_size plus a bias-free router.
- gpt2: learned positions (n_positions), LayerNorms with biases, fused QKV, an MLP of n_inner (4h by default) and
  the head tied to the embedding (tie_word_embeddings, true by default).

A field the config leaves out takes the value transformers' config class gives it, so Ψ is exact either way. The
activations are not counted here: `activation_shape` maps the config onto `spec.model.shape`'s GPT formula
(`zerotrain.plan.transformer`), which is approximate for gated MLPs and mixtures of experts (see there).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerotrain.model_spec import Attention, ModelShape

HF_ENTRYPOINT = "zerotrain.runtime.models.huggingface:build"
"""The built-in entry point that builds a Hugging Face model from `entrypointArgs.config`."""
CONFIG_FILE = "config.json"
DEFAULT_SEQ_LEN = 256
"""The entry point's `seq_len` when entrypointArgs leaves it out."""
DEFAULT_BATCH_SIZE = 8
"""The entry point's `batch_size` (the global micro-batch, all ranks together) when entrypointArgs leaves it out."""
FIELD = "spec.entrypointArgs.config"

# transformers' defaults for every field counted, per family (its config classes' own, as of 4.45-5.x).
_GATED = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "tie_word_embeddings": False}
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_GATED, "vocab_size": 32000, "intermediate_size": 11008, "num_key_value_heads": None,
              "attention_bias": False, "mlp_bias": False},
    "mistral": {**_GATED, "vocab_size": 32000, "intermediate_size": 14336, "num_key_value_heads": 8},
    "qwen2": {**_GATED, "vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32},
    "mixtral": {**_GATED, "vocab_size": 32000, "intermediate_size": 14336, "num_key_value_heads": 8,
                "num_local_experts": 8, "num_experts_per_tok": 2},
    "gpt2": {"vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_inner": None,
             "tie_word_embeddings": True, "add_cross_attention": False, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
             "attn_pdrop": 0.1},
}  # fmt: skip
# Other names transformers accepts for a field (its config classes' attribute_map).
ALIASES = {
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_positions": "max_position_embeddings",
    "num_local_experts": "num_experts",
}


@dataclass(frozen=True)
class ModelSize:
    """What the plan needs of the model: its units' exact parameter counts and its transformer dimensions."""

    model_type: str
    layers: int
    """Decoder layers: the ZeRO units (`_no_split_modules`), all of one size."""
    block: int
    """Parameters of one decoder layer."""
    root: int
    """Parameters outside the layers: embeddings, the final norm, an untied head (each tied parameter once)."""
    hidden: int
    heads: int
    vocabulary: int
    inner_per_token: int
    """Elements of MLP activation one token keeps, in the GPT formula's terms (2·f·h for an f·h GeLU MLP)."""
    dropout: bool
    """Whether any dropout probability in the config is above zero."""

    @property
    def parameters(self) -> int:
        """Ψ: every parameter once."""
        return self.layers * self.block + self.root


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

    def flag(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise ValueError(f"{FIELD}.{key}: got {value!r}; it must be true or false; fix the model config")
        return value

    def dropout(self, *keys: str) -> bool:
        values = [self.raw(k) for k in keys]
        return any(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)


def _attention(model_type: str, f: _Fields) -> int:
    """Grouped-query attention: q and o of heads × head_dim, k and v of num_key_value_heads × head_dim, and the
    biases the family has (llama: attention_bias on all four; qwen2: always on q, k and v, never on o)."""
    h, a = f.count("hidden_size"), f.count("num_attention_heads")
    kv = f.count("num_key_value_heads", fallback=a)
    d = f.count("head_dim", fallback=h // a)
    weights = 2 * h * a * d + 2 * h * kv * d
    if model_type == "llama" and f.flag("attention_bias"):
        return weights + a * d + 2 * kv * d + h
    if model_type == "qwen2":
        return weights + a * d + 2 * kv * d
    return weights


def _gated(model_type: str, f: _Fields) -> ModelSize:
    """llama, mistral, qwen2 and mixtral: attention, a gated MLP (or experts) and two RMSNorms per layer."""
    h, inner, vocab = f.count("hidden_size"), f.count("intermediate_size"), f.count("vocab_size")
    mlp = 3 * h * inner + (2 * inner + h if model_type == "llama" and f.flag("mlp_bias") else 0)
    routed = 1
    if model_type == "mixtral":
        experts, routed = f.count("num_local_experts"), f.count("num_experts_per_tok")
        mlp = experts * 3 * h * inner + experts * h  # the experts' gate, up and down, and the router
    head = 0 if f.flag("tie_word_embeddings") else vocab * h
    return ModelSize(
        model_type=model_type,
        layers=f.count("num_hidden_layers"),
        block=_attention(model_type, f) + mlp + 2 * h,
        root=vocab * h + h + head,
        hidden=h,
        heads=f.count("num_attention_heads"),
        vocabulary=vocab,
        # gate, up, their product and the down projection's input, for each expert a token is routed to.
        inner_per_token=4 * routed * inner,
        dropout=f.dropout("attention_dropout"),
    )


def _gpt2(model_type: str, f: _Fields) -> ModelSize:
    """gpt2: LayerNorm, fused QKV (Conv1D, with biases), projection, a GeLU MLP; learned positions."""
    h, vocab, positions = f.count("n_embd"), f.count("vocab_size"), f.count("n_positions")
    inner = f.count("n_inner", fallback=4 * h)
    block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * inner + inner) + (inner * h + h)
    if f.flag("add_cross_attention"):
        block += (2 * h * h + 2 * h) + (h * h + h) + (h * h + h) + 2 * h  # k/v, q, projection, their norm
    head = 0 if f.flag("tie_word_embeddings") else vocab * h
    return ModelSize(
        model_type=model_type,
        layers=f.count("n_layer"),
        block=block,
        root=vocab * h + positions * h + 2 * h + head,
        hidden=h,
        heads=f.count("n_head"),
        vocabulary=vocab,
        inner_per_token=2 * inner,
        dropout=f.dropout("resid_pdrop", "embd_pdrop", "attn_pdrop"),
    )


_FAMILIES: dict[str, Callable[[str, _Fields], ModelSize]] = {
    "llama": _gated,
    "mistral": _gated,
    "qwen2": _gated,
    "mixtral": _gated,
    "gpt2": _gpt2,
}
FAMILIES = tuple(_FAMILIES)
"""The model types counted here; any other is left to spec.model.parameters (or --measure)."""


def model_size(config: Mapping[str, Any]) -> ModelSize | None:
    """The model's size from its config's fields; None for a model_type not counted here; ValueError naming the
    field when a counted one is not a positive integer (or a flag not a boolean)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in _FAMILIES:
        return None
    return _FAMILIES[model_type](model_type, _Fields(config, DEFAULTS[model_type]))


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


def size_from_args(args: Mapping[str, Any]) -> ModelSize | None:
    """The model of `spec.entrypointArgs` for the Hugging Face entry point; None when its config is not readable
    here, its model_type is not counted, or `model_class` names a class other than a causal LM (another head, or
    none, has other parameters)."""
    model_class = args.get("model_class")
    if model_class is not None and not (isinstance(model_class, str) and model_class.endswith(CAUSAL_LM_SUFFIXES)):
        return None
    config = read_config(args.get("config"))
    return model_size(config) if config is not None else None


def _positive(args: Mapping[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"spec.entrypointArgs.{key}: got {value!r}; it must be a positive integer, e.g. {default}")
    return value


def activation_shape(size: ModelSize, args: Mapping[str, Any], world_size: int) -> ModelShape:
    """The shape `zerotrain.plan.transformer` counts activations from: seq_len and this rank's rows of batch_size
    (rounded up) from entrypointArgs; the MLP's width as the GPT formula's f, so a gated MLP's four inner tensors
    (times top-k for experts) count as a GeLU MLP's two. An approximation for gated MLPs and experts (router logits
    and the dispatch's index tensors are left out); measure with `zerotrain plan -f JOB --measure` for a figure."""
    seq_len = _positive(args, "seq_len", DEFAULT_SEQ_LEN)
    rows = -(-_positive(args, "batch_size", DEFAULT_BATCH_SIZE) // world_size)
    # ModelShape wants heads to divide hidden; heads only sizes the fused attention's per-head log-sum-exp.
    heads = size.heads if size.hidden % size.heads == 0 else math.gcd(size.hidden, size.heads)
    eager = args.get("attn_implementation") == "eager"
    return ModelShape(
        layers=size.layers,
        hidden=size.hidden,
        heads=heads,
        sequence_length=seq_len,
        vocabulary=size.vocabulary,
        micro_batch_size=rows,
        ffn_multiplier=max(1, -(-size.inner_per_token // (2 * size.hidden))),
        attention=Attention.MATERIALIZED if eager else Attention.FUSED,
        dropout=size.dropout,
    )
