"""The model of a ZeroTrainingJob (`spec.model`): its size or shape, pretrained weights, data on a claim, LoRA."""

from __future__ import annotations

from enum import Enum

from pydantic import Field

from zerotrain._model import Rule, SpecModel
from zerotrain.architecture import Architecture
from zerotrain.lora_config import LoraSpec


class Attention(str, Enum):
    """How a transformer layer's attention keeps what backward needs."""

    FUSED = "fused"
    """A fused kernel (flash or memory-efficient `scaled_dot_product_attention`): no s x s score tensor is saved,
    only the output and one fp32 log-sum-exp per head and token."""
    MATERIALIZED = "materialized"
    """Scores are formed and softmaxed as tensors, which backward keeps: 2·a·s²·b elements per layer (plus a
    dropout mask of a·s²·b bytes with dropout)."""


class ModelShape(SpecModel):
    """A decoder-only transformer's shape, from which the plan derives its units and its activations per micro-batch
    (pre-norm blocks of attention and a GeLU MLP, learned positions, the output projection tied to the embedding)."""

    rules = (
        Rule(
            "self.hidden % self.heads == 0",
            lambda m: m.hidden % m.heads == 0,
            "shape.heads must divide shape.hidden; use a divisor of hidden",
            ("heads", "hidden"),
        ),
    )

    layers: int = Field(ge=1)
    """Transformer blocks (each one ZeRO unit)."""
    hidden: int = Field(ge=1)
    """Hidden size h."""
    heads: int = Field(ge=1)
    """Attention heads a; must divide hidden."""
    sequence_length: int = Field(ge=1)
    """Tokens per sequence s."""
    vocabulary: int = Field(ge=1)
    """Vocabulary size V."""
    micro_batch_size: int = Field(ge=1)
    """Sequences b one rank runs per micro-batch."""
    ffn_multiplier: int = Field(default=4, ge=1)
    """The MLP's inner size as a multiple of hidden."""
    attention: Attention = Attention.FUSED
    """fused (flash / scaled_dot_product_attention) or materialized scores."""
    dropout: bool = False
    """Whether the layers apply dropout (each dropout keeps a 1-byte mask per element for backward)."""


def claim_rules(field: str, what: str, example: str) -> tuple[Rule, Rule]:
    """A read-only claim mounted at `path`: subPath needs the claim, and the mount point must be absolute."""
    return (
        Rule(
            "!has(self.subPath) || has(self.claimName)",
            lambda p: p.sub_path is None or p.claim_name is not None,
            f"{field}.subPath is a directory inside {field}.claimName; set claimName, or drop subPath and point path "
            f"at {what}",
            ("sub_path", "claim_name"),
        ),
        Rule(
            "!has(self.claimName) || self.path.startsWith('/')",
            lambda p: p.claim_name is None or p.path.startswith("/"),
            f"{field}.path is where the claim is mounted in the pods: use an absolute path such as {example}",
            ("path",),
        ),
    )


class PretrainedSpec(SpecModel):
    """Weights the job starts from instead of the model's own initialisation (fine-tuning). Each rank reads only
    the byte ranges of its own shard; names must match the model's exactly, up to one prefix (`model.` in the
    weights' names but not the model's, or the other way round: a model that wraps the pretrained one)."""

    rules = claim_rules("pretrained", "the weights", "/pretrained")

    path: str = Field(min_length=1)
    """The weights as every rank sees them: a directory as Hugging Face writes it (`model.safetensors`, or
    `model.safetensors.index.json` and its shards; any floating dtype, converted into the fp32 master), one
    .safetensors file (a zerotrain export), or a zerotrain checkpoint (its root or a step-* directory: weights and
    buffers only). In a pod, `claimName` is mounted here read-only."""
    claim_name: str | None = None
    """PersistentVolumeClaim holding the weights, mounted read-only at `path` in every pod."""
    sub_path: str | None = None
    """The directory inside the claim that holds the weights (mounted at `path`); the claim's root without it."""
    new_parameters: list[str] = Field(default_factory=list, max_length=256)
    """Glob patterns of the model's parameters and buffers the weights do not hold, initialised by the model's own
    code instead (a fresh head for fine-tuning, `score.*`). Any other the weights lack is refused, naming both
    sides."""
    unused_keys: list[str] = Field(default_factory=list, max_length=256)
    """Glob patterns of tensors in the weights the model does not have, left unread (a head the model replaces).
    Any other is refused, naming both sides."""


class DataSpec(SpecModel):
    """Training data on a PersistentVolumeClaim, mounted read-only at `path` in every pod (locally, `path` is read
    as it is). The entry point names the files under it: the built-in Hugging Face entry point takes token files
    (`zerotrain data prepare` writes them) as entrypointArgs.train and eval, paths or globs under this path."""

    rules = claim_rules("data", "the data", "/data")

    path: str = Field(min_length=1)
    """The data's directory as every rank sees it; in a pod, `claimName` is mounted here read-only."""
    claim_name: str | None = None
    """PersistentVolumeClaim holding the data, mounted read-only at `path` in every pod."""
    sub_path: str | None = None
    """The directory inside the claim that holds the data (mounted at `path`); the claim's root without it."""


class ModelInfo(SpecModel):
    """What the operator needs to know about the model to plan memory."""

    parameters: int | None = Field(default=None, ge=1)
    """Total parameter count Ψ; enables the memory plan at admission."""
    optimizer_multiplier: float | None = Field(default=None, gt=0)
    """K, optimizer-state bytes per parameter, stated outright; by default derived from training.optimizer and
    zero.precision (fp32 AdamW 8, mixed-precision AdamW 12 with the fp32 master, SGD 0 or 4, plus 4 when mixed)."""
    shape: ModelShape | None = None
    """The transformer's shape: the plan then counts activations, the stage-3 gathered units, the gradient arenas
    and the communication buffers, not only the model states."""
    architecture: Architecture | None = None
    """A Hugging Face model's architecture (family, layers, widths, vocabulary, experts, dropout), as `zerotrain plan
    -f JOB --fill` writes it from the entry point's config.json: the plan counts its exact parameters and its
    family's own activations from it, so the operator plans (and chooses `zero.stage: auto`) from the manifest
    alone. The pod's launcher refuses a job whose block disagrees with the config it loads."""
    activation_bytes: int | None = Field(default=None, ge=0)
    """Bytes one rank's micro-batch needs beyond parameters and gradients from its forward through its backward
    (saved activations plus backward's working set), as `zerotrain plan -f JOB --measure` prints it; replaces the
    shape's formula."""
    pretrained: PretrainedSpec | None = None
    """Weights to start from (fine-tuning): read into each rank's shard, never whole. A job that has a checkpoint
    of its own resumes from it instead (its frozen parameters, a LoRA job's base, are read from here again: the
    checkpoint holds what trains)."""
    lora: LoraSpec | None = None
    """Low-rank adapters (LoRA) on the frozen, sharded base: only they (and modulesToSave) train and are saved."""
