"""`spec.model.architecture`: a Hugging Face model's architecture as the plan counts it, carried in the manifest.

The operator plans a job before any pod exists and never reads a file a job names, so what the plan needs of a model
travels in the manifest: the family and the few numbers its layers are made of. `zerotrain plan -f JOB --fill`
writes this block from the model's config.json (`zerotrain.hf_config.architecture`), and the pod's launcher checks
it against the config it loads, refusing a mismatch before the first step. Torch-free.
"""

from __future__ import annotations

from enum import Enum

from pydantic import Field

from zerotrain._model import Rule, SpecModel


class Family(str, Enum):
    """The model families whose parameters and activations the plan counts (transformers' model_type)."""

    LLAMA = "llama"
    MISTRAL = "mistral"
    QWEN2 = "qwen2"
    QWEN3 = "qwen3"
    MIXTRAL = "mixtral"
    GPT2 = "gpt2"


class Activation(str, Enum):
    """The MLP's activation (transformers' hidden_act / activation_function) as the plan knows it."""

    SILU = "silu"
    GELU = "gelu"
    GELU_TANH = "gelu_pytorch_tanh"
    GELU_NEW = "gelu_new"
    """GPT-2's: written out as tensor operations, so it keeps four tensors of the MLP's width."""
    RELU = "relu"


GATED = (Family.LLAMA, Family.MISTRAL, Family.QWEN2, Family.QWEN3, Family.MIXTRAL)
"""Pre-norm blocks of grouped-query attention with rotary positions, RMSNorm and a gated MLP (or gated experts)."""


class Architecture(SpecModel):
    """A Hugging Face causal LM's architecture, as `zerotrain plan -f JOB --fill` writes it from config.json: what
    the plan counts parameters and activations from, so the operator can plan (and choose `stage: auto`) without the
    file. The pod's launcher refuses a job whose block disagrees with the config it loads."""

    rules = (
        Rule(
            "self.heads % (has(self.kvHeads) ? self.kvHeads : self.heads) == 0",
            lambda a: a.heads % a.key_value_heads == 0,
            "architecture.kvHeads must divide architecture.heads (grouped-query attention); rewrite the block with "
            "`zerotrain plan -f JOB --fill`",
            ("heads", "kv_heads"),
        ),
        Rule(
            "(self.family == 'mixtral') == (has(self.experts) && has(self.expertsPerToken))",
            lambda a: (a.family is Family.MIXTRAL) == (a.experts is not None and a.experts_per_token is not None),
            "architecture.experts and expertsPerToken are a mixture of experts' (family mixtral), and it needs both; "
            "rewrite the block with `zerotrain plan -f JOB --fill`",
            ("family", "experts", "experts_per_token"),
        ),
        Rule(
            "!has(self.experts) || !has(self.expertsPerToken) || self.expertsPerToken <= self.experts",
            lambda a: a.experts is None or a.experts_per_token is None or a.experts_per_token <= a.experts,
            "architecture.expertsPerToken cannot exceed architecture.experts",
            ("experts", "experts_per_token"),
        ),
    )

    family: Family
    """transformers' model_type."""
    layers: int = Field(ge=1)
    """Decoder layers (num_hidden_layers, n_layer): the ZeRO units."""
    hidden: int = Field(ge=1)
    """hidden_size (n_embd)."""
    intermediate: int = Field(ge=1)
    """The MLP's inner size (intermediate_size; GPT-2's n_inner, 4·hidden when unset); each expert's for mixtral."""
    heads: int = Field(ge=1)
    """num_attention_heads (n_head)."""
    kv_heads: int | None = Field(default=None, ge=1)
    """num_key_value_heads: grouped-query attention's key and value heads; as many as `heads` when unset."""
    head_dim: int | None = Field(default=None, ge=1)
    """Each head's width; hidden / heads when unset."""
    vocabulary: int = Field(ge=1)
    """vocab_size."""
    positions: int = Field(ge=1)
    """max_position_embeddings (GPT-2's n_positions, its learned position table): the longest seq_len."""
    tied_embeddings: bool
    """tie_word_embeddings: the output head is the input embedding."""
    activation: Activation = Activation.SILU
    """hidden_act (GPT-2's activation_function)."""
    attention_bias: bool = False
    """Llama's and Qwen3's attention_bias (biases on q, k, v and o); Qwen2 always has them on q, k and v."""
    mlp_bias: bool = False
    """Llama's mlp_bias."""
    experts: int | None = Field(default=None, ge=1)
    """num_local_experts (mixtral)."""
    experts_per_token: int | None = Field(default=None, ge=1)
    """num_experts_per_tok: the experts each token is routed to (mixtral)."""
    sliding_window: int | None = Field(default=None, ge=1)
    """The attention window, where the config turns one on (mistral's sliding_window; Qwen's with use_sliding_window):
    sequences this long or longer need a mask."""
    attention_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the attention probabilities (attention_dropout; GPT-2's attn_pdrop)."""
    residual_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """GPT-2's resid_pdrop: dropout on each sublayer's output."""
    embedding_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """GPT-2's embd_pdrop: dropout on the embeddings."""

    @property
    def key_value_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_width(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def routed(self) -> int:
        """Experts a token runs through (1 without experts)."""
        return self.experts_per_token or 1


def _attention(a: Architecture) -> int:
    """q and o of heads × head_dim, k and v of kv_heads × head_dim, the biases the family has, Qwen3's q/k norms."""
    h, d = a.hidden, a.head_width
    q, kv = a.heads * d, a.key_value_heads * d
    weights = 2 * h * q + 2 * h * kv
    if a.family is Family.QWEN2:
        weights += q + 2 * kv
    elif a.attention_bias and a.family in (Family.LLAMA, Family.QWEN3):
        weights += q + 2 * kv + h
    if a.family is Family.QWEN3:
        weights += 2 * d
    return weights


def block_parameters(a: Architecture) -> int:
    """One decoder layer's parameters, as transformers builds it."""
    h, inner = a.hidden, a.intermediate
    if a.family is Family.GPT2:
        # LayerNorms with biases, fused QKV and the projection (Conv1D, with biases), the MLP.
        return 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * inner + inner) + (inner * h + h)
    mlp = 3 * h * inner + (2 * inner + h if a.family is Family.LLAMA and a.mlp_bias else 0)
    if a.experts is not None:
        mlp = a.experts * 3 * h * inner + a.experts * h  # the experts' gate, up and down, and the router
    return _attention(a) + mlp + 2 * h


def root_parameters(a: Architecture) -> int:
    """Everything outside the layers: the embeddings, the final norm and an untied head (each tied parameter once)."""
    h, vocab = a.hidden, a.vocabulary
    head = 0 if a.tied_embeddings else vocab * h
    if a.family is Family.GPT2:
        return vocab * h + a.positions * h + 2 * h + head
    return vocab * h + h + head


def parameters(a: Architecture) -> int:
    """Ψ: every parameter once."""
    return a.layers * block_parameters(a) + root_parameters(a)
