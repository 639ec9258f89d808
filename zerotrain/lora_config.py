"""`spec.model.lora`: low-rank adapters trained on a frozen base (LoRA), and what they add to a model. Torch-free.

The runtime builds the adapters with the `peft` library on the partitioned model (`zerotrain.runtime.models.lora`):
each targeted linear layer of shape (out, in) keeps its weight, frozen, and gains `lora_A` (rank × in) and `lora_B`
(out × rank), trained, its output becoming `W·x + (alpha / rank)·B·A·dropout(x)`. The base stays sharded at every
stage that shards parameters, in the compute dtype; only the adapters (and `modulesToSave`) hold gradients, fp32
masters and optimizer state, so a rank holds about w·Ψ/N + (w + g + K)·Ψ_t/N at stage 3, Ψ_t a fraction of a
per cent of Ψ. The plan counts Ψ_t from the same shapes (`adapter_parameters`).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from zerotrain._model import SpecModel


class LoraSpec(SpecModel):
    """Low-rank adapters (LoRA, built with peft) trained on the frozen, sharded base: peft's LoraConfig fields."""

    rank: int = Field(default=8, ge=1, le=4096)
    """r: the adapters' inner dimension (peft's `r`, default 8). Each targeted (out × in) layer gains r·(in + out)
    trainable parameters."""
    alpha: float = Field(default=8.0, gt=0)
    """lora_alpha: the adapters' output is scaled by alpha / rank (peft's default 8)."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """lora_dropout: dropout on the adapters' input while training."""
    target_modules: list[str] = Field(min_length=1, max_length=256)
    """The layers that get adapters, as peft matches them: a module's name or the end of its dotted path (`q_proj`
    matches every `...self_attn.q_proj`), or `all-linear` (every linear layer but the output head)."""
    modules_to_save: list[str] = Field(default_factory=list, max_length=64)
    """Modules trained in full beside the adapters (a new classification head), matched as targetModules are, and
    saved and exported with them."""


def linear_shapes(config: dict[str, object]) -> dict[str, tuple[int, int]] | None:
    """(in, out) of each linear layer a decoder block of this Hugging Face config holds, by its name, for the Llama
    family's layout (attention q/k/v/o and a gated MLP), GPT-2's (c_attn, c_proj, c_fc) and Mixtral's experts
    (w1, w2, w3, per expert, counted in `experts_of`); None for a family whose layout is not known here."""
    hidden = _int(config, "hidden_size", "n_embd")
    heads = _int(config, "num_attention_heads", "n_head")
    if hidden is None or heads is None:
        return None
    head_dim = _int(config, "head_dim") or hidden // heads
    kv = _int(config, "num_key_value_heads") or heads
    inter = _int(config, "intermediate_size", "n_inner")
    model_type = str(config.get("model_type", ""))
    if model_type == "gpt2":
        inner = inter or 4 * hidden
        return {
            "c_attn": (hidden, 3 * hidden),
            "attn.c_proj": (hidden, hidden),
            "c_fc": (hidden, inner),
            "mlp.c_proj": (inner, hidden),
        }
    if inter is None:
        return None
    shapes = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv * head_dim),
        "v_proj": (hidden, kv * head_dim),
        "o_proj": (heads * head_dim, hidden),
    }
    if model_type == "mixtral":
        return shapes | {"w1": (hidden, inter), "w3": (hidden, inter), "w2": (inter, hidden)}
    return shapes | {"gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def experts_of(config: dict[str, object], name: str) -> int:
    """How many copies of layer `name` a block holds (Mixtral's experts), 1 for the rest."""
    experts = _int(config, "num_local_experts")
    return experts if experts and name in ("w1", "w2", "w3") else 1


def adapter_parameters(
    shapes: dict[str, tuple[int, int]], targets: Iterable[str], rank: int, copies: dict[str, int]
) -> int:
    """Ψ_t of one block: r·(in + out) for every layer a target names (by its name or the end of it)."""
    wanted = list(targets)
    total = 0
    for name, (fan_in, fan_out) in shapes.items():
        last = name.rsplit(".", 1)[-1]
        if "all-linear" in wanted or any(t in (name, last) or name.endswith(f".{t}") for t in wanted):
            total += copies.get(name, 1) * rank * (fan_in + fan_out)
    return total


def _int(config: dict[str, object], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
