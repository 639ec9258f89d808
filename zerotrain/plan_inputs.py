"""From a job spec to the planner's input: one derivation for `zerotrain plan -f`, admission and the runtime.

Ψ, N and the device memory come from the spec; the bytes per element from its precision, stage and optimizer
(`planner.element_bytes`), unless `spec.model.optimizerMultiplier` states K outright.
"""

from __future__ import annotations

from zerotrain.planner import PlanInput, element_bytes
from zerotrain.quantity import parse_bytes
from zerotrain.runtime.config import Precision
from zerotrain.spec import OptimizerName, OptimizerSpec, ZeroTrainingJobSpec

PRECISION_BYTES = {Precision.FP32: 4.0, Precision.BF16: 2.0, Precision.FP16: 2.0}


def optimizer_state_bytes(opt: OptimizerSpec) -> float:
    """fp32 state bytes per element of the spec's optimizer (what torch keeps for fp32 parameters)."""
    if opt.name in (OptimizerName.ADAMW, OptimizerName.ADAM):
        return 8.0  # exp_avg, exp_avg_sq
    return 4.0 if opt.momentum else 0.0  # SGD's momentum buffer


def plan_input(spec: ZeroTrainingJobSpec, device_memory: int | None = None) -> PlanInput:
    """The planner's input for `spec` (Ψ must be set); `device_memory` in bytes, else the spec's gpuMemory."""
    assert spec.model.parameters is not None, "spec.model.parameters is needed to plan"
    w, g, k = element_bytes(
        spec.zero.stage, PRECISION_BYTES[spec.zero.precision], optimizer_state_bytes(spec.training.optimizer)
    )
    if spec.model.optimizer_multiplier is not None:
        k = spec.model.optimizer_multiplier
    if device_memory is None and spec.resources.gpu_memory:
        device_memory = gpu_memory_bytes(spec.resources.gpu_memory)
    return PlanInput(
        parameters=spec.model.parameters,
        data_parallel=spec.world_size,
        optimizer_multiplier=k,
        bytes_per_weight=w,
        bytes_per_gradient=g,
        device_memory=device_memory,
    )


def gpu_memory_bytes(text: str) -> int:
    """A GPU memory quantity ("80Gi", "40G") in bytes; ValueError naming it when it is not one."""
    value = parse_bytes(text)
    if value is None or value < 1:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return value
