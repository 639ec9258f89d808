"""The optimizer step's one control all-reduce: everything the ranks must agree on, in a few float64 numbers.

Per optimizer step the ranks need the loss averaged over them (what a run reports) or, for losses given as sums
over counted tokens, the sum and the count of every rank and micro-batch (the step divides the gradients by that
count, so the update is one process's on the whole global batch), the global gradient norm
(for clipping and the fp16 overflow test, when asked for), any vote a caller wants counted (SIGTERM: every rank
stops after the same step) and the divergence check (did every rank run the same units in the same order?).
Each used to be its own blocking collective; here they ride one all-reduce of `len(Slot)` float64 values
(64 bytes), issued once per step before the optimizer applies anything. Asynchronous checkpoints count there which
ranks' background writes are on disk, so the commit needs no collective of its own to agree on.

The divergence fingerprint rides a SUM: each rank adds two `bits`-bit pieces h of its running order hash and
their squares. All ranks hold the same h exactly when N·Σh² = (Σh)² (equality in Cauchy-Schwarz); every term is
an integer below 2^53, so float64 sums them exactly. A mismatch is seen by every rank at once, so the follow-up
collective that names the culprit (`consistency.OrderCheck.explain`) is matched on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from zerotrain.runtime.zero.collectives import Comm
    from zerotrain.runtime.zero.consistency import OrderCheck
    from zerotrain.runtime.zero.unit import Unit

_EXACT_BITS = 52  # float64 holds every integer below 2^53: keep each sum under 2^52


class Slot(IntEnum):
    """Positions in the control vector."""

    LOSS = 0
    VOTES = 1
    NORM_SQ = 2
    FINGERPRINT_LO = 3
    FINGERPRINT_LO_SQ = 4
    FINGERPRINT_HI = 5
    FINGERPRINT_HI_SQ = 6
    WRITTEN = 7
    """Ranks whose background checkpoint write has finished (asynchronous checkpoints commit when all have)."""
    TOKENS = 8
    """Counted tokens (items) of the losses given as sums, over every rank and micro-batch of the step."""


def fingerprint_bits(world_size: int) -> int:
    """Bits per fingerprint piece such that N·Σh² (< N²·2^(2b)) stays exact in float64."""
    log_n = max(1, (world_size - 1).bit_length())
    return max(1, min(24, (_EXACT_BITS - 2 * log_n) // 2))


@dataclass
class Agreed:
    """What the ranks agreed on, after the all-reduce."""

    loss: float | None
    """Mean loss over ranks and micro-batches, or over the counted tokens of losses given as sums (None when no loss
    was seen)."""
    tokens: float | None
    """The counted tokens of every rank's and micro-batch's summed losses (None: the losses were means)."""
    votes: int
    """How many ranks voted."""
    written: int
    """How many ranks said their checkpoint write in flight is on disk."""
    norm_sq: float
    """Sum over ranks of the squared gradient-norm contributions."""
    consistent: bool
    """Every rank sent the same fingerprint."""


def pack(
    loss_sum: torch.Tensor | None,
    vote: bool,
    norm_sq: torch.Tensor | None,
    fingerprint: int | None,
    world_size: int,
    device: torch.device,
    written: bool = False,
    tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """This rank's control vector; tensors stay on their device (no sync before the collective)."""
    out = torch.zeros(len(Slot), dtype=torch.float64, device=device)
    if loss_sum is not None:
        out[Slot.LOSS] = loss_sum.detach().to(torch.float64).reshape(())
    if tokens is not None:
        out[Slot.TOKENS] = tokens.to(torch.float64).reshape(())
    out[Slot.VOTES] = float(vote)
    out[Slot.WRITTEN] = float(written)
    if norm_sq is not None:
        out[Slot.NORM_SQ] = norm_sq.to(torch.float64).reshape(())
    if fingerprint is not None:
        bits = fingerprint_bits(world_size)
        mask = (1 << bits) - 1
        lo, hi = fingerprint & mask, (fingerprint >> bits) & mask
        pieces = torch.tensor([lo, lo * lo, hi, hi * hi], dtype=torch.float64)
        out[Slot.FINGERPRINT_LO : Slot.FINGERPRINT_HI_SQ + 1] = pieces.to(device)
    return out


def unpack(summed: torch.Tensor, world_size: int, micro_batches: int, had_loss: bool, counted: bool = False) -> Agreed:
    """Read the all-reduced vector (one device-to-host copy); `counted`: the losses were sums over counted tokens
    (a step that counted none reports 0, as its gradients are)."""
    v = summed.cpu().tolist()
    consistent = all(
        world_size * v[sq] == v[s] * v[s]
        for s, sq in ((Slot.FINGERPRINT_LO, Slot.FINGERPRINT_LO_SQ), (Slot.FINGERPRINT_HI, Slot.FINGERPRINT_HI_SQ))
    )
    tokens = v[Slot.TOKENS] if counted else None
    if tokens is not None:
        loss = v[Slot.LOSS] / tokens if tokens > 0 else 0.0
    else:
        loss = v[Slot.LOSS] / (world_size * micro_batches) if had_loss else None
    votes, written = round(v[Slot.VOTES]), round(v[Slot.WRITTEN])
    return Agreed(
        loss=loss, tokens=tokens, votes=votes, written=written, norm_sq=v[Slot.NORM_SQ], consistent=consistent
    )


def local_norm_sq(units: list[Unit]) -> torch.Tensor:
    """This rank's squared norm of the fp32 gradients the optimizer reads (its shard, or all of them in stage 0)."""
    norms = torch._foreach_norm([u.step_grads for u in units])  # fp32 shards, one multi-tensor kernel
    return (torch.stack(norms).double() ** 2).sum().reshape(1)


def token_factor(tokens: float | None, world_size: int, accumulation: int) -> float:
    """What the averaged gradients are multiplied by when the losses were sums over `tokens` counted tokens: they
    hold Σ∇sum / (N·G) (averaged over ranks, divided by the accumulation), and one process's mean over the T counted
    tokens is Σ∇sum / T. Mean losses: 1; no counted token at all: 0 (nothing to learn from)."""
    if tokens is None:
        return 1.0
    return world_size * accumulation / tokens if tokens else 0.0


class StepControl:
    """One engine's control all-reduce: the losses seen since the last step, and the agreement at the step."""

    def __init__(
        self, comm: Comm, order_check: OrderCheck | None, accumulation: int, sharded: bool, copies: int = 1
    ) -> None:
        self.comm, self.order_check, self.accumulation, self.sharded = comm, order_check, accumulation, sharded
        self.copies = copies
        """Shard groups holding the same shards (hybrid sharding): the summed norm counts each shard this often."""
        self.loss_sum: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None
        """The counted tokens of this step's summed losses so far (None: its losses are means)."""

    def note_loss(self, loss: torch.Tensor, tokens: torch.Tensor | float | None = None) -> None:
        """A micro-batch's loss, kept on its device (no sync) until the step: a mean, or with `tokens` a sum over
        that many counted tokens. A step's micro-batches are all of one kind."""
        if self.loss_sum is not None and (tokens is None) != (self.tokens is None):
            raise ValueError(
                "backward: a step mixes mean losses and summed ones (tokens=); give every micro-batch's loss the "
                "same way"
            )
        seen = loss.detach().float()
        self.loss_sum = seen if self.loss_sum is None else self.loss_sum + seen
        if tokens is not None:
            count = torch.as_tensor(tokens, dtype=torch.float64, device=seen.device).detach().reshape(())
            self.tokens = count if self.tokens is None else self.tokens + count

    def agree(
        self, units: list[Unit], vote: bool, need_norm: bool, written: bool = False
    ) -> tuple[Agreed, float | None]:
        """The all-reduce, and the global gradient norm when asked; raises on rank divergence before any update."""
        local_sq = local_norm_sq(units) if need_norm else None
        fingerprint = self.order_check.hash if self.order_check is not None else None
        world, device = self.comm.world_size, units[0].grad_shard.device
        # Stage 0's gradients are whole on every rank: its norm is local, and summing it would count it N times.
        sharded_sq = local_sq if self.sharded else None
        vec = pack(self.loss_sum, vote, sharded_sq, fingerprint, world, device, written, self.tokens)
        self.comm.all_reduce(vec, "<step>", label="control")
        agreed = unpack(vec, world, self.accumulation, self.loss_sum is not None, self.tokens is not None)
        self.loss_sum = self.tokens = None
        if self.order_check is not None:
            if not agreed.consistent:
                raise self.order_check.explain("optimizer step")
            self.order_check.reset()
        if local_sq is None:
            return agreed, None
        return agreed, math.sqrt(agreed.norm_sq / self.copies if self.sharded else float(local_sq.item()))
