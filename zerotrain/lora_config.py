"""`spec.model.lora`: low-rank adapters trained on a frozen base (LoRA), and what they add to a model. Torch-free.

The runtime builds the adapters with the `peft` library on the partitioned model (`zerotrain.runtime.models.lora`):
each targeted linear layer of shape (out, in) keeps its weight, frozen, and gains `lora_A` (rank × in) and `lora_B`
(out × rank), trained, its output becoming `W·x + (alpha / rank)·B·A·dropout(x)`. The base stays sharded at every
stage that shards parameters, in the compute dtype; only the adapters (and `modulesToSave`) hold gradients, fp32
masters and optimizer state, so a rank holds about w·Ψ/N + (w + g + K)·Ψ_t/N at stage 3, Ψ_t a fraction of a
per cent of Ψ. The plan counts Ψ_t from the same shapes (`adapter_parameters`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from zerotrain._model import SpecModel
from zerotrain.architecture import Architecture, Family


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


GPT_ENTRYPOINT = "zerotrain.runtime.examples.gpt:build"
"""The built-in GPT, whose layers `spec.model.shape` describes (`zerotrain.plan.transformer`)."""


@dataclass(frozen=True)
class Layers:
    """A model's layers as LoRA sees them: each block's linear layers (in, out) by their names inside the block, and
    the root's modules that can be trained in full (their parameter counts) or adapted (their (in, out))."""

    block: dict[str, tuple[int, int]]
    root_sizes: dict[str, int] = field(default_factory=dict)
    root_linear: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class LoraSizes:
    """What LoRA makes of the model's units: per block and in the root, the parameters that train (the adapters and
    modulesToSave) and those left frozen, as the runtime lays them out."""

    blocks: int
    """How many blocks the model has."""
    block_trainable: int
    block_frozen: int
    root_trainable: int
    root_frozen: int

    @property
    def parameters(self) -> int:
        """Ψ with the adapters."""
        return self.blocks * (self.block_trainable + self.block_frozen) + self.root_trainable + self.root_frozen

    @property
    def trainable(self) -> int:
        """Ψ_t: the adapters and the modules to save."""
        return self.blocks * self.block_trainable + self.root_trainable


def _named(name: str, targets: list[str]) -> bool:
    return any(name == t or name.endswith(f".{t}") or name.rsplit(".", 1)[-1] == t for t in targets)


def sizes(lora: LoraSpec, layers: Layers, blocks: int, block: int, root: int) -> LoraSizes | None:
    """The units' trainable and frozen parameters for a model of `blocks` blocks of `block` parameters and `root`
    outside them; None when a module to save is not one this plan can size (then it counts every parameter as
    trained)."""
    targets = lora.target_modules
    every = targets == ["all-linear"]
    adapters = sum(
        lora.rank * (fan_in + fan_out)
        for name, (fan_in, fan_out) in layers.block.items()
        if every or _named(name, targets)
    )
    root_adapters = sum(
        lora.rank * (fan_in + fan_out)
        for name, (fan_in, fan_out) in layers.root_linear.items()
        if _named(name, targets)
    )
    saved = 0
    for module in lora.modules_to_save:
        if module not in layers.root_sizes:
            return None
        saved += layers.root_sizes[module]
    return LoraSizes(blocks, adapters, block, root_adapters + saved, root - saved)


def hf_layers(a: Architecture) -> Layers:
    """The layers of a Hugging Face model as LoRA sees them: the Llama family's (attention q/k/v/o and a gated MLP),
    Mixtral's (the same attention; its experts are not linear layers) and GPT-2's (c_attn, c_proj, c_fc)."""
    hidden, vocab = a.hidden, a.vocabulary
    head = {} if a.tied_embeddings else {"lm_head": (hidden, vocab)}
    root_sizes = {"lm_head": hidden * vocab} if not a.tied_embeddings else {}
    if a.family is Family.GPT2:
        inner = a.intermediate
        block = {"attn.c_attn": (hidden, 3 * hidden), "attn.c_proj": (hidden, hidden)}
        block |= {"mlp.c_fc": (hidden, inner), "mlp.c_proj": (inner, hidden)}
        return Layers(block, root_sizes | {"wte": vocab * hidden, "ln_f": 2 * hidden}, head)
    q, kv = a.heads * a.head_width, a.key_value_heads * a.head_width
    block = {
        "self_attn.q_proj": (hidden, q),
        "self_attn.k_proj": (hidden, kv),
        "self_attn.v_proj": (hidden, kv),
        "self_attn.o_proj": (q, hidden),
    }
    if a.experts is None:  # Mixtral's experts are one fused module each, which LoRA does not adapt
        inter = a.intermediate
        block |= {"mlp.gate_proj": (hidden, inter), "mlp.up_proj": (hidden, inter), "mlp.down_proj": (inter, hidden)}
    return Layers(block, root_sizes | {"embed_tokens": vocab * hidden, "norm": hidden}, head)


def gpt_layers(hidden: int, ffn_multiplier: int) -> Layers:
    """The built-in GPT's block (`zerotrain.runtime.examples.gpt.Block`); its head is tied to the embedding."""
    inner = ffn_multiplier * hidden
    block = {"qkv": (hidden, 3 * hidden), "proj": (hidden, hidden), "fc_in": (hidden, inner), "fc_out": (inner, hidden)}
    return Layers(block)
