"""What a rank must save besides model and optimizer state to continue exactly: position, randomness, loss scale.

- Position: micro-batches consumed (the engine's `micro_steps`, which counts fp16-skipped steps' micro-batches too,
  unlike its `steps`), and from it the loop's step (`Position.record`). Data is skipped by micro-batches, never by
  updates.
- Randomness: torch's CPU generator, every CUDA device's, Python's `random`, and NumPy's when it is loaded (dropout,
  user augmentation). Per rank: each rank restores its own; at another world size a new rank without a saved
  counterpart keeps its fresh state (its data and dropout streams differ then anyway).
- The loss scaler in full (scale, skipped steps, the growth counter).
"""

from __future__ import annotations

import dataclasses
import random
import sys
from typing import Any

import torch

from zerotrain.runtime.zero.engine_state import EngineState

TORCH_RNG = "rng.torch"
CUDA_RNG = "rng.cuda."


def rng_tensors() -> dict[str, torch.Tensor]:
    out = {TORCH_RNG: torch.get_rng_state()}
    if torch.cuda.is_available():
        out.update({f"{CUDA_RNG}{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return out


def _jsonable(state: Any) -> Any:
    return [_jsonable(v) for v in state] if isinstance(state, (tuple, list)) else state


def _tupled(state: Any) -> Any:
    return tuple(_tupled(v) for v in state) if isinstance(state, list) else state


def capture(state: EngineState) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This rank's state as tensors (RNG byte states) and a JSON record (the rest)."""
    record: dict[str, Any] = {
        "position": state.position.record(),
        "scaler": state.scaler,
        "python_rng": _jsonable(random.getstate()),
    }
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        record["numpy_rng"] = [kind, keys.tolist(), pos, has_gauss, gauss]
    return rng_tensors(), record


def continued(state: EngineState, record: dict[str, Any]) -> EngineState:
    """`state` with a rank record's step counters and loss scaler (identical on every rank, so any rank's record
    serves). A checkpoint ends a step: the micro-batches consumed are its steps at this engine's accumulation, which
    in a gang of another size (spec.elastic) differs from the saving one's."""
    pos = record["position"]
    micro_steps = int(pos["step"]) * state.position.accumulation
    position = dataclasses.replace(state.position, steps=int(pos["optimizer_steps"]), micro_steps=micro_steps)
    return dataclasses.replace(state, position=position, scaler=record["scaler"])


def restore_rng(tensors: dict[str, torch.Tensor], record: dict[str, Any]) -> None:
    """This rank's own generators, as saved."""
    torch.set_rng_state(tensors[TORCH_RNG])
    cuda = sorted((k for k in tensors if k.startswith(CUDA_RNG)), key=lambda k: int(k[len(CUDA_RNG) :]))
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    random.setstate(_tupled(record["python_rng"]))
    np = sys.modules.get("numpy")
    if np is not None and "numpy_rng" in record:
        kind, keys, pos, has_gauss, gauss = record["numpy_rng"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
