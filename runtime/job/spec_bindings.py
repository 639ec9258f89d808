"""What the manifest's spec turns into for the engine: the rank's device and the optimizer factory; and the one
check of the model against the spec's declared Ψ. The engine (`zero/`) knows neither the spec nor its types; the
job side reads the spec and hands it these."""

from __future__ import annotations

import os

import torch
from torch import nn

from zerotrain.errors import ConfigError
from zerotrain.plan.inputs import declared_parameters
from zerotrain.runtime.job.task import check_declared_parameters
from zerotrain.runtime.models import lora as lora_adapters
from zerotrain.runtime.zero.optimizer import OptimizerFactory
from zerotrain.spec import OptimizerName, OptimizerSpec, ZeroTrainingJobSpec


def device_for(spec: ZeroTrainingJobSpec, local_rank: int) -> torch.device:
    """One GPU per rank when the job asks for GPUs (spec.resources.gpu > 0), else the CPU; a job that asks for GPUs
    on a rank that has none is refused before the process group forms, naming the setting."""
    if spec.resources.gpu == 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = "a CPU-only torch build" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
        raise ConfigError(
            f"spec.resources.gpu: got {spec.resources.gpu}, but this rank sees no CUDA device ({build}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); set resources.gpu: 0 to "
            "train on CPU, or run on GPU nodes with a CUDA build of torch"
        )
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"spec.resources.gpu: local rank {local_rank} has no GPU of its own ({torch.cuda.device_count()} "
            "visible); set nprocPerNode to at most the GPUs per node"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def optimizer_factory(opt: OptimizerSpec) -> OptimizerFactory:
    """spec.training.optimizer as the `optimizer=` callable the engine applies to its shard's param groups."""
    if opt.name == OptimizerName.ADAMW:
        return lambda groups: torch.optim.AdamW(
            groups, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay
        )
    if opt.name == OptimizerName.ADAM:
        return lambda groups: torch.optim.Adam(
            groups, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay
        )
    if opt.name == OptimizerName.SGD:
        return lambda groups: torch.optim.SGD(groups, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
    raise ConfigError(f"spec.training.optimizer.name: got {opt.name!r}; use one of {[o.value for o in OptimizerName]}")


def check_model_parameters(spec: ZeroTrainingJobSpec, model: nn.Module) -> None:
    """The model's parameters against the Ψ the manifest declares (spec.model, or its architecture block), LoRA's
    adapters not counted: the launcher's entry check and each rank's start run this one check."""
    try:
        declared = declared_parameters(spec)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    adapters = lora_adapters.adapter_names(model) if spec.model.lora is not None else ()
    check_declared_parameters(model, declared, adapters)
