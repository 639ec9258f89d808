"""A transformer's units and activations from its shape (`spec.model.shape`): the standard activation formula,
adapted to what the layers of a modern implementation keep.

Korthikanti et al. (2022, "Reducing Activation Recomputation in Large Transformer Models") count a layer's saved
activations as s·b·h·(34 + 5·a·s/h) bytes in 16-bit: 11·sbh + 5·a·s²·b for attention (its input, Q, K, V, the
softmax output, its dropout mask and output, the projection's input, one dropout mask), 19·sbh for the MLP and 4·sbh
for two LayerNorms. In elements of the compute dtype (d bytes each), with an MLP f·h wide, that is, per layer:

    (8 + 2f)·sbh·d          both norms' inputs, the QKV input and output, the attention output, the MLP's
                            input, its inner activation before and after GeLU
    + 2·2·s·b·d             the norms' mean and reciprocal deviation
    + a·s·b·4               fused attention: one fp32 log-sum-exp per head and token (no s×s scores)
      or a·s²·b·d           materialized attention: the softmax output
    + 2·sbh (+ a·s²·b)      with dropout: 1-byte masks (and the attention-probability dropout's)

and for the model's ends: the final norm's input and the head's input (2·sbh·d + its stats), the loss's fp32 log-
probabilities (s·b·V·4) and the token ids (int64). Backward then needs, at its start, the gradient of the log-
probabilities and of the fp32 logits (2·s·b·V·4) while every saved tensor is still alive (the logits' gradient in a
16-bit dtype comes after the log-probabilities are freed), and inside a block the gradients flowing through it
((f+1)·sbh·d). With activation checkpointing a block keeps only its input (sbh·d) and recomputes the rest in its
backward, one block at a time; with offload that input waits in host memory instead.

Assumed, and stated: pre-norm blocks with learned positions and the output projection tied to the embedding (as
`zerotrain.runtime.examples.gpt`); another architecture should measure (`zerotrain plan -f JOB --measure`).
"""

from __future__ import annotations

from zerotrain._model import SpecModel
from zerotrain.spec import Attention, ModelShape

TOKEN_BYTES = 8  # int64 token ids


def block_parameters(shape: ModelShape) -> int:
    """One block: QKV (3h² + 3h), the projection (h² + h), the MLP (2f·h² + f·h + h), two norms (4h)."""
    h, f = shape.hidden, shape.ffn_multiplier
    return (4 + 2 * f) * h * h + (9 + f) * h


def root_parameters(shape: ModelShape) -> int:
    """Embedding (V·h, shared with the head), positions (s·h) and the final norm (2h)."""
    h = shape.hidden
    return shape.vocabulary * h + shape.sequence_length * h + 2 * h


def parameters(shape: ModelShape) -> int:
    """Ψ of the shape."""
    return shape.layers * block_parameters(shape) + root_parameters(shape)


class Activations(SpecModel):
    """One micro-batch's activation bytes by part, per rank."""

    block_saved: int
    """What one block keeps for backward without checkpointing."""
    block_input: int
    """A block's input: all a checkpointed block keeps."""
    ends_saved: int
    """The final norm, the head and the loss's log-probabilities, the token ids."""
    head_backward: int
    """Backward's working set at its start (gradients of the log-probabilities and logits)."""
    block_backward: int
    """Backward's working set inside a block."""


def activations(shape: ModelShape, compute_bytes: float) -> Activations:
    """The formula's parts for this shape and compute dtype."""
    s, b, h, a, v, f = (
        shape.sequence_length,
        shape.micro_batch_size,
        shape.hidden,
        shape.heads,
        shape.vocabulary,
        shape.ffn_multiplier,
    )
    d = compute_bytes
    sbh = s * b * h
    attention: float
    if shape.attention is Attention.FUSED:
        attention = a * s * b * 4
    else:
        attention = a * s * s * b * d + (a * s * s * b if shape.dropout else 0)
    block = (8 + 2 * f) * sbh * d + 4 * s * b * d + attention + (2 * sbh if shape.dropout else 0)
    ends = 2 * sbh * d + 2 * s * b * d + s * b * v * 4 + TOKEN_BYTES * (b * (s + 1) + s + s * b)
    head = 2 * s * b * v * 4
    return Activations(
        block_saved=round(block),
        block_input=round(sbh * d),
        ends_saved=round(ends),
        head_backward=round(head),
        block_backward=round((f + 1) * sbh * d),
    )


def activation_peak(
    shape: ModelShape, compute_bytes: float, checkpointing: bool, offload: bool
) -> tuple[int, int, int]:
    """Device bytes when backward starts and while a block's backward runs, and host bytes offloaded, for one
    micro-batch."""
    parts = activations(shape, compute_bytes)
    kept = shape.layers * (parts.block_input if checkpointing else parts.block_saved)
    host = kept if checkpointing and offload else 0
    device_kept = kept - host
    at_head = device_kept + parts.ends_saved + parts.head_backward
    # Checkpointed: the last block recomputed, its working set beside it (the head's part is done by then).
    in_block = device_kept + parts.block_backward + (parts.block_saved if checkpointing else 0)
    return at_head, in_block, host
