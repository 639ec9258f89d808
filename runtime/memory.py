"""Bytes per category measured from the tensors the engine holds, next to the ZeRO formula's prediction.

Measured, per rank, from live storages (each storage counted once, in the first category that
holds it, so a view aliasing another buffer is never double counted):

- parameters: what stays allocated between steps - full compute buffers (stages 0-2) or the
  compute-dtype shard (stage 3). With fp32 compute the fp32 master *is* this storage.
- gathered: stage 3 full buffers allocated right now, and the peak since construction.
- gradients: flat gradient buffers, fp32 gradient shards and any unsharded `.grad` still alive.
- optimizer: every tensor in the optimizer's state plus a separate fp32 master (mixed precision only).
- activations: tensors autograd saved for backward in the last forward, and the peak (`saved`).
- communication buffers: temporaries allocated only to send or receive, now and at peak.

Predicted: `zerotrain.planner.stage_bytes` with Ψ = the model's real elements, N = world size,
w = compute element size, g = element size of the gradients the stage holds between steps (the
compute dtype for stages 0/1, whose fp32 copy lives only from reduction to step; the fp32 shard
for stages 2/3) and K = per-element optimizer state bytes (measured once the optimizer has state;
Adam's 8 before) plus 4 for a separate fp32 master. So fp32 AdamW is K = 8 (with fp32 compute the
parameters are the master: no second copy exists, and none is counted), bf16 AdamW K = 12, as the
ZeRO paper counts. Frozen parameters count in Ψ but hold no gradient or optimizer state. Padding
to a multiple of N is real memory, reported apart so a comparison can allow for it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from zerotrain._model import SpecModel
from zerotrain.planner import PlanInput, stage_bytes
from zerotrain.runtime.config import Stage


class MemoryReport(SpecModel):
    """One rank's memory by category, measured and predicted."""

    rank: int
    """This rank."""
    stage: Stage
    """ZeRO stage."""
    parameters: int
    """Ψ: real parameter elements of the model (padding excluded)."""
    world_size: int
    """N."""
    padding_elements: int
    """Elements added to reach a multiple of N, summed over units (full buffers; a shard holds 1/N)."""
    parameter_bytes: int
    """Parameter storage held between steps (full buffers, or the shard in stage 3)."""
    gathered_bytes: int
    """Stage 3: gathered full parameters allocated now."""
    gathered_peak_bytes: int
    """Stage 3: most gathered full-parameter bytes alive at once since construction."""
    gradient_bytes: int
    """Gradient buffers, shards and live unsharded gradients."""
    optimizer_bytes: int
    """Optimizer state tensors plus a separate fp32 master copy, if any."""
    activation_bytes: int = 0
    """Activations the last forward saved for backward (checkpointed units: their inputs only)."""
    activation_peak_bytes: int = 0
    """Most activation bytes any forward saved since construction."""
    comm_buffer_bytes: int
    """Communication-only temporaries alive now."""
    comm_buffer_peak_bytes: int
    """Most communication-only bytes alive at once since construction."""
    model_state_bytes: int
    """parameter + gradient + optimizer bytes (the ZeRO paper's model states)."""
    bytes_per_weight: float
    """w used for the prediction."""
    bytes_per_gradient: float
    """g used for the prediction."""
    optimizer_multiplier: float
    """K used for the prediction."""
    predicted_parameter_bytes: int
    """Formula: w·Ψ, or w·Ψ/N in stage 3."""
    predicted_gradient_bytes: int
    """Formula: g·Ψ, or g·Ψ/N from stage 2."""
    predicted_optimizer_bytes: int
    """Formula: K·Ψ, or K·Ψ/N from stage 1."""
    predicted_model_state_bytes: int
    """Sum of the three predictions."""


class StorageCounter:
    """Sums storage bytes, counting each storage once across categories."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def count(self, tensors: Iterable[torch.Tensor | None]) -> int:
        total = 0
        for t in tensors:
            if t is None:
                continue
            st = t.untyped_storage()
            key = st.data_ptr() if st.nbytes() else id(st)
            if key in self._seen or st.nbytes() == 0:
                continue
            self._seen.add(key)
            total += st.nbytes()
        return total


def predict(stage: Stage, psi: int, n: int, w: float, g: float, k: float) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer) bytes per rank the ZeRO formula predicts."""
    pb, gb, ob = stage_bytes(
        stage,
        PlanInput(parameters=psi, data_parallel=n, optimizer_multiplier=k, bytes_per_weight=w, bytes_per_gradient=g),
    )
    return round(pb), round(gb), round(ob)
