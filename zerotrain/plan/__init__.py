"""The planner, one room: what a job will hold, per rank, before anything runs. Torch-free, pure arithmetic.

`plan_job(spec)` is the front door: the `JobPlan` of a manifest (every stage's model states and whole peak, the
start-up peak, the pod's host memory), read by `zerotrain plan -f` and `zerotrain validate`; the operator's
admission, `stage: auto` and the runtime's sizing read the same modules behind it:

- `inputs`: from a spec to the planner's input (Ψ from the shape, a Hugging Face config or the declared count;
  LoRA; offload; element sizes), and `memory_plan`, the per-stage plan;
- `model_states`: the ZeRO formula per stage (parameters, gradients, optimizer states) and the communication;
- `peak`: the whole per-rank peak beyond the model states (gathered units, buckets, arenas, activations), whose
  terms the runtime's allocations call so plan and measurement cannot drift;
- `transformer`: a transformer's units and activations from its shape;
- `start_up`: the peak from process start to the first step;
- `stage_choice`: `zero.stage: auto`, the lowest stage that fits;
- `host`: a pod's host memory, whole: each rank's process (`process_baseline`) and its tensors.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zerotrain.plan.job_plan import JobPlan, plan_job

__all__ = ["JobPlan", "plan_job"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: the spec's own modules import the planner's (job_status, model_states) while the spec
    # is still being built.
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("zerotrain.plan.job_plan"), name)
