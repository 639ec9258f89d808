"""One rank's micro-batch of activations for a job: what the plan counts between the forward and the step.

Two sources, by what the manifest says of its model:

- `spec.model.architecture` (a Hugging Face family, written by `zerotrain plan -f JOB --fill`; locally also read
  from the entry point's config.json): the family's forward replayed as transformers runs it
  (`hf_forward`), with the run's sequence length, this rank's rows, the compute dtype, the attention
  implementation, the device, packed records, LoRA and activation checkpointing;
- `spec.model.shape`: the GPT formula (`transformer`).

Each gives the bytes at backward's worst moment outside the blocks (the head, the final norm, the embedding) and
inside them (a block's backward, or its recompute with checkpointing), and what checkpointing offloads to host
memory. Torch-free.
"""

from __future__ import annotations

from dataclasses import replace

from zerotrain import hf_config
from zerotrain.architecture import Architecture
from zerotrain.plan import hf_forward, transformer
from zerotrain.plan.hf_ops import Adapters, Run
from zerotrain.spec import ModelShape, ZeroTrainingJobSpec

PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def job_architecture(spec: ZeroTrainingJobSpec) -> Architecture | None:
    """The Hugging Face architecture the plan counts: `spec.model.architecture`, else (the built-in entry point
    with neither parameters nor shape stated) its config's, where this machine can read it; None otherwise."""
    if spec.model.architecture is not None:
        return spec.model.architecture
    if spec.entrypoint != hf_config.HF_ENTRYPOINT or spec.model.parameters is not None or spec.model.shape is not None:
        return None
    return hf_config.architecture_from_args(spec.entrypoint_args)


def rows_per_rank(spec: ZeroTrainingJobSpec) -> int:
    """This rank's sequences per micro-batch: entrypointArgs.batch_size over the ranks, rounded up."""
    batch = hf_config.positive_arg(spec.entrypoint_args, "batch_size", hf_config.DEFAULT_BATCH_SIZE)
    return -(-batch // spec.world_size)


def runs(spec: ZeroTrainingJobSpec) -> list[Run]:
    """How the job's micro-batch runs. Whether its data are token windows or records is in the files, not the
    manifest (unless it packs records), so both are planned and the larger kept."""
    args = spec.entrypoint_args
    lora = spec.model.lora
    adapters = None
    if lora is not None:
        adapters = Adapters(
            rank=lora.rank,
            targets=frozenset(lora.target_modules),
            dropout=lora.dropout > 0,
            saved_modules=frozenset(lora.modules_to_save),
        )
    run = Run(
        rows=rows_per_rank(spec),
        seq=hf_config.positive_arg(args, "seq_len", hf_config.DEFAULT_SEQ_LEN),
        compute=PRECISION_BYTES[spec.zero.precision.value],
        eager=args.get("attn_implementation") == "eager",
        cuda=spec.resources.gpu > 0,
        adapters=adapters,
    )
    if args.get("packing") is True:
        return [replace(run, records=True, packed=True)]
    return [run, replace(run, records=True)]


def hf_activations(spec: ZeroTrainingJobSpec, a: Architecture) -> tuple[int, int, int]:
    """Device bytes at backward's worst moment outside the blocks and inside them, and host bytes offloaded."""
    z = spec.zero
    ckpt = z.activation_checkpointing
    at_head = in_block = 0
    host = 0
    for run in runs(spec):
        peak = hf_forward.micro_batch_peak(a, run, ckpt)
        outside = max(peak.by_region.get("", 0), peak.by_region.get("ends", 0))
        inside = peak.by_region.get("block", 0)
        if ckpt and z.offload_activation_checkpoints:
            # Each block's input waits in host memory; the block being recomputed has its own back on the device.
            one = run.tokens * a.hidden * run.compute
            host = max(host, a.layers * one)
            outside, inside = outside - a.layers * one, inside - (a.layers - 1) * one
        at_head, in_block = max(at_head, outside), max(in_block, inside)
    return at_head, in_block, host


def activation_bytes(spec: ZeroTrainingJobSpec, shape: ModelShape | None) -> tuple[int, int, int] | None:
    """The job's activations (`hf_activations`, or the GPT formula of `shape`); None when neither describes it."""
    a = job_architecture(spec)
    if a is not None:
        return hf_activations(spec, a)
    if shape is None:
        return None
    w = PRECISION_BYTES[spec.zero.precision.value]
    z = spec.zero
    return transformer.activation_peak(shape, w, z.activation_checkpointing, z.offload_activation_checkpoints)
