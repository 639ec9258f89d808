"""What a rank process holds besides its tensors: the interpreter, torch, the gloo process group, the /metrics
server's thread, and transformers (with peft for LoRA) where the entry point imports them.

The plan adds it to every rank's host memory (`zerotrain plan -f`, `validate`, admission, `stage: auto`, the local
run's limits): a CPU rank's tensors have its share of resources.memory less the headroom and this. Measured with
`python -m zerotrain.runtime.job.process_memory`, which runs a tiny job of each kind for real (`zerotrain run`, two
gloo ranks, torch 2.13 CPU build, Python 3.12) and reads each rank's peak as it exits: the largest of its resident
set, its resident high-water mark and its private writable address space, which are what a container's limit and
`zerotrain run`'s RLIMIT_DATA count. The tiny jobs' tensors are a few MB, so the peak is the process.
tests/runtime/job/test_process_memory.py measures again and fails past `DRIFT`. A user's own entry point is counted
as torch only; what it imports beyond that is its own.

GPU ranks also hold the CUDA context, cuBLAS workspaces and NCCL's buffers on the device; those stay in the plan's
device headroom (unmeasured here: no GPU), while this baseline is counted in the pod's host memory.
"""

from __future__ import annotations

from enum import Enum

from zerotrain.hf_config import HF_ENTRYPOINT
from zerotrain.spec import ZeroTrainingJobSpec

MB = 1_000_000


class ProcessKind(str, Enum):
    """What a rank imports beyond the runtime, which sets its baseline."""

    TORCH = "torch"
    TRANSFORMERS = "transformers"
    PEFT = "transformers+peft"


BASELINE_BYTES = {
    ProcessKind.TORCH: 360 * MB,
    ProcessKind.TRANSFORMERS: 402 * MB,
    ProcessKind.PEFT: 414 * MB,
}
"""Measured per rank (see the module), rounded up to the MB."""

DRIFT = 0.25
"""How far a measurement may move from `BASELINE_BYTES` before the test fails and the figures are re-measured."""


def process_kind(spec: ZeroTrainingJobSpec) -> ProcessKind:
    """The Hugging Face entry point imports transformers, and peft with spec.model.lora; others count as torch."""
    if spec.entrypoint != HF_ENTRYPOINT:
        return ProcessKind.TORCH
    return ProcessKind.PEFT if spec.model.lora is not None else ProcessKind.TRANSFORMERS


def baseline_bytes(spec: ZeroTrainingJobSpec) -> int:
    """One rank's process baseline for `spec`."""
    return BASELINE_BYTES[process_kind(spec)]
