"""`zerotrain plan -f JOB --measure`: a micro-batch's activations measured without allocating them.

The entry point builds its model and data under torch's fake-tensor mode (tensors have shapes, dtypes and a device,
and no storage; operators choose the kernels they would choose on the CPU); one batch runs forward, the loss and
backward while a dispatch mode counts every tensor operators return until it is freed: what autograd saves,
backward's working set, and anything else the model makes. `spec.model.lora`'s adapters are added first, as the
runtime adds them (the frozen base saves less for backward; each adapter keeps its own inner activations).
Parameter gradients are dropped as soon as they are accumulated (the runtime keeps them in its own flat buffers,
which the plan counts apart), so the figure is the activations alone: what `spec.model.activationBytes` takes. With
`zero.activationCheckpointing` the unit modules are checkpointed as the runtime does.
"""

from __future__ import annotations

import json

from rich.console import Console
from rich.text import Text

from zerotrain.commands import runtime_calls as rt
from zerotrain.errors import UserError
from zerotrain.local_paths import load_job
from zerotrain.quantity import format_bytes
from zerotrain.spec import ZeroTrainingJobSpec


def measure_activations(spec: ZeroTrainingJobSpec, real: bool = False) -> int:
    """Peak activation bytes of one rank's micro-batch (rank 0 of the job's world size), under the fake-tensor mode;
    UserError naming the operation when the model cannot run there. `real`: on real CPU tensors instead (the model's
    memory and one micro-batch's, for a model fake tensors cannot run)."""
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(spec.training.seed)  # as the runtime does before it builds the task
    fake: contextlib.AbstractContextManager[object] = (
        contextlib.nullcontext() if real else FakeTensorMode(allow_non_fake_inputs=True)
    )
    with fake:
        task = rt.build_task(spec.entrypoint, rank=0, world_size=spec.world_size, args=spec.entrypoint_args)
        if spec.model.lora is not None:  # as the runtime adds them: only the adapters train
            rt.add_adapters(task.model, spec.model.lora)
        model, dtype = task.model, rt.DTYPES[spec.zero.precision]
        for p in model.parameters():  # in place: fake parameters cannot be swapped as Module.to would
            p.data = p.data.to(dtype)
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda q: setattr(q, "grad", None))
    if spec.zero.activation_checkpointing:
        names = set(spec.zero.unit_modules or task.unit_modules)
        units = [m for m in model.modules() if type(m).__name__ in names]
        rt.apply_checkpointing(units, False, lambda _t: None, torch.device("cpu"))
    # The parameters are the runtime's to count: views of them (a transposed weight autograd saves) are not
    # activations.
    meter = rt.LiveBytes(held=[*model.parameters(), *model.buffers()])
    try:
        with fake, meter:
            batch = next(task.batches)
            loss = task.loss(rt.call_model(model, task.inputs(batch)), batch)
            (loss.total if isinstance(loss, rt.LossSum) else loss).backward()
    except (NotImplementedError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"{spec.entrypoint}: the model cannot run under torch's fake tensors ({first}); measure it on real CPU "
            "tensors with --measure-real (it allocates the model and one micro-batch), or give spec.model.shape"
        ) from None
    return int(meter.peak)


def measure_command(path: str, as_json: bool, real: bool = False) -> int:
    spec = load_job(path).spec
    measured = measure_activations(spec, real)
    if as_json:
        print(json.dumps({"activationBytes": measured}))
        return 0
    Console().print(
        Text(
            f"{path}: one micro-batch needs {format_bytes(measured)} of activations per rank ({measured} bytes, "
            f"activation checkpointing {'on' if spec.zero.activation_checkpointing else 'off'}); put it in the "
            f"manifest as spec.model.activationBytes: {measured}"
        ),
        soft_wrap=True,
    )
    return 0
