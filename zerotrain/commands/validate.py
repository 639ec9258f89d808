"""`zerotrain validate JOB.yaml`: check a manifest the way the operator will, without a cluster: the spec, the
names of its children, its pod template, and its memory plan against the GPUs' memory (the operator's admission)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from zerotrain import elastic, hf_config
from zerotrain.commands import runtime_calls as rt
from zerotrain.errors import UserError
from zerotrain.hf_config import HF_ENTRYPOINT
from zerotrain.local_paths import load_document
from zerotrain.manifest import parse_job
from zerotrain.plan import JobPlan, host, plan_job
from zerotrain.plan.model_states import MemoryPlan
from zerotrain.plan.start_up import describe
from zerotrain.quantity import format_bytes
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.training_spec import RestartStrategy
from zerotrain.weights_layout import layout
from zerotrain.zero_config import Stage

if TYPE_CHECKING:
    from zerotrain.operator.controller.admission import Admission


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a ZeroTrainingJob manifest", description=__doc__)
    p.add_argument("manifest", help="path of the ZeroTrainingJob YAML")
    p.add_argument(
        "--gpu-memory",
        help="memory of one GPU (80Gi) when the manifest sets none: the operator's operator.defaultGpuMemory",
    )
    p.add_argument("--allow-host-path", action="store_true", help="as an operator run with operator.allowHostPath=true")
    p.add_argument(
        "--no-import",
        action="store_true",
        help="skip importing the entry point (its code is only in the image): Ψ, units and arguments go unchecked",
    )
    p.set_defaults(func=run)


def elastic_line(raw: Any, name: str, args: argparse.Namespace, spec: ZeroTrainingJobSpec) -> str:
    """Which sizes of the elastic range the operator could run the gang at, with each one's accumulation, and why
    not the others (a size that does not divide the global batch, a plan that does not fit there)."""
    from zerotrain.operator.controller.admission import admit

    assert spec.elastic is not None
    acc = spec.zero.gradient_accumulation_steps
    usable = set(elastic.sizes(spec.replicas, spec.nproc_per_node, acc, spec.elastic))
    runs, nots = [], []
    for r in range(spec.elastic.min_replicas, spec.elastic.max_replicas + 1):
        if r not in usable:
            nots.append(
                f"{r} (does not divide the {elastic.step_slots(spec.replicas, spec.nproc_per_node, acc)} slots)"
            )
            continue
        at = admit(raw, name, args.gpu_memory, args.allow_host_path, replicas=r)
        if not at.admitted:
            nots.append(f"{r} ({at.message})")
            continue
        stage = at.spec.zero.fixed_stage.value if at.spec is not None else "?"
        per = elastic.accumulation_at(spec.replicas, spec.nproc_per_node, acc, r)
        runs.append(f"{r} pods (stage {stage}, {per} micro-batches a rank)")
    line = "elastic: the gang can run at " + ", ".join(runs)
    return line + (f"; not at {'; '.join(nots)}" if nots else "")


def pretrained_line(spec: ZeroTrainingJobSpec, manifest: str) -> str:
    """What spec.model.pretrained holds, checked as far as this machine can read it: the files (refused when
    missing or unreadable), then the names and shapes against the model built on the meta device."""
    pretrained = spec.model.pretrained
    assert pretrained is not None
    path = Path(pretrained.path)
    if not path.exists() and pretrained.claim_name is not None:
        return (
            f"pretrained: {path} is on claim {pretrained.claim_name}, not readable here: each pod checks it before "
            "its ranks start"
        )
    held = layout(path)
    from zerotrain.pod_contract import ENTRYPOINT_PATH_ENV

    with rt.scoped_environ({ENTRYPOINT_PATH_ENV: str(Path(manifest).resolve().parent)}):
        found = rt.match_on_meta(spec.entrypoint, spec.entrypoint_args, spec.world_size, pretrained)
    if isinstance(found, str):
        return (
            f"pretrained: {held.describe()}; names not checked (the model cannot be built on the meta device: {found})"
        )
    loaded = len(found.params) + len(found.buffers)
    new = f", {len(found.new)} new ({', '.join(found.new)})" if found.new else ""
    return f"pretrained: {held.describe()}; {loaded} of the model's tensors match ({found.rule}){new}"


def memory_lines(job: JobPlan, planned: MemoryPlan | None, gpu_memory: str | None) -> list[str]:
    """The memory plan against what the ranks have: each GPU's memory, and the pod's host memory (each rank's
    process, start-up, a CPU rank's training peak); "not checked" only when something is missing, naming it. An
    admitted job fits: admission refused it otherwise."""
    spec = job.spec
    stage, cpu = spec.zero.fixed_stage, spec.resources.gpu == 0
    lines = []
    if cpu and gpu_memory:
        lines.append(
            f"--gpu-memory {gpu_memory}: not applied: this job's ranks train on the CPU (resources.gpu 0); "
            "their memory is resources.memory"
        )
    held_on_host = host.describe(spec, job.host)
    if planned is not None:
        chosen = planned.stages[stage]
        held = f"{format_bytes(chosen.model_state_bytes)} of model states"
        if chosen.peak is not None:
            held = f"{format_bytes(chosen.peak.peak)} at its peak ({held})"
        return [*lines, f"memory plan: {held} per GPU at stage {stage.value}; {planned.reason}", held_on_host]
    if job.memory is None:
        return [
            *lines,
            "memory plan: not checked: the model's size is unknown; set spec.model.parameters or shape",
            held_on_host,
        ]
    chosen = job.memory.stages[stage]
    need = chosen.peak.peak if chosen.peak is not None else chosen.model_state_bytes
    held = "at its peak" if chosen.peak is not None else "of model states (spec.model.shape adds the rest)"
    line = f"memory plan: {format_bytes(need)} per rank {held} at stage {stage.value}"
    if not cpu:
        line += "; no GPU memory to check it against: set resources.gpuMemory or pass --gpu-memory"
    return [*lines, line, held_on_host]


def entrypoint_line(spec: ZeroTrainingJobSpec, args: argparse.Namespace) -> str:
    """The entry point imported, its arguments bound, its model built on the meta device and checked against the
    spec, as `zerotrain run` and the pod launcher check it before any rank starts."""
    if args.no_import:
        return f"entry point: {spec.entrypoint} not imported (--no-import): its arguments, Ψ and units are unchecked"
    from zerotrain.pod_contract import ENTRYPOINT_PATH_ENV

    data = spec.data
    elsewhere = data is not None and data.claim_name is not None and not Path(data.path).exists()
    with rt.scoped_environ({ENTRYPOINT_PATH_ENV: str(Path(args.manifest).resolve().parent)}):
        said = rt.check_entrypoint(spec, build=not elsewhere)
    return said + (f" (its data is on claim {data.claim_name}, not readable here)" if elsewhere and data else "")


def architecture_lines(spec: ZeroTrainingJobSpec) -> list[str]:
    """What the plan knows of a Hugging Face job's model: the manifest's architecture block (which the entry check
    holds to the config), or why the operator could not plan it without one."""
    block = spec.model.architecture
    if block is not None:
        return [f"model.architecture: {block.family.value} as its config says: the operator plans it from the manifest"]
    config = hf_config.read_config(spec.entrypoint_args.get("config"))
    if config is None:
        return []
    if hf_config.architecture(config) is None:
        return [
            f"memory plan: model_type {config.get('model_type')!r} is not one the plan counts "
            f"({', '.join(hf_config.FAMILIES)}), so its activations are not planned: measure them with `zerotrain "
            "plan -f JOB --measure` into spec.model.activationBytes, with spec.model.shape for its units"
        ]
    if spec.model.parameters is not None or spec.model.shape is not None:
        return []
    return [
        "model.architecture: not in the manifest: this machine plans from the config, but the operator reads no "
        f"file a job names and cannot (nor choose stage: auto); write the block with `{hf_config.FILL}`"
    ]


def hf_line(spec: ZeroTrainingJobSpec) -> str:
    """The built-in Hugging Face entry point's config, model class and token files, checked as each rank checks
    them before it builds the model; files on spec.data's claim, not readable here, are left to the ranks."""
    entry_args = dict(spec.entrypoint_args)
    data = spec.data
    elsewhere = data is not None and data.claim_name is not None and not Path(data.path).exists()
    if elsewhere:
        assert data is not None
        on_claim = [k for k, v in entry_args.items() if isinstance(v, str) and v.startswith(data.path)]
        entry_args = {k: v for k, v in entry_args.items() if k not in on_claim}
        if "config" not in entry_args:
            return f"model: config and data on claim {data.claim_name}, not readable here: each rank checks them"
    evaluation = spec.training.evaluation
    wanted = evaluation.batches if evaluation is not None and not elsewhere else None
    said = rt.describe_hf(spec.world_size, entry_args, wanted)
    return said + (f"; files on claim {data.claim_name} are checked by each rank" if elsewhere and data else "")


def admitted(
    manifest: str, raw: object, name: str, gpu_memory: str | None = None, allow_host_path: bool = False
) -> Admission:
    """The operator's admission of a manifest's spec (`raw`), as `validate` and `zerotrain run` both make it before
    anything starts: UserError with the operator's reason and message when it would refuse the job. A missing
    spec.image is filled in: `zerotrain run` needs none, and validate says so apart."""
    from zerotrain.operator.controller.admission import admit

    if isinstance(raw, dict) and raw.get("image") is None:
        raw = {**raw, "image": "zerotrain-validate-placeholder"}
    verdict = admit(raw, name or "job", gpu_memory, allow_host_path)
    if not verdict.admitted:
        raise UserError(f"{manifest}: the operator would refuse it ({verdict.reason}): {verdict.message}")
    assert verdict.spec is not None
    return verdict


def restart_line(spec: ZeroTrainingJobSpec) -> str | None:
    """What a restart will do where the manifest asks for one in place that cannot be (None where it can, or the
    manifest asks for Recreate)."""
    if spec.failure_policy.restart_strategy != RestartStrategy.IN_PLACE or spec.checkpoint.claim_name:
        return None
    return (
        "spec.failurePolicy.restartStrategy: InPlace (the default), but spec.checkpoint.claimName is not set: on the "
        "operator a restart recreates every pod instead (a recreated pod must find the newest checkpoint on a shared "
        "claim); set checkpoint.claimName to restart the living pods in place"
    )


def run(args: argparse.Namespace) -> int:
    doc = load_document(args.manifest, strict=not args.no_import)
    job = parse_job(doc, source=args.manifest)  # the field-by-field errors first
    name = str(job.metadata.get("name") or "")
    local_only = job.spec.image is None  # run needs none; the operator's other checks still apply
    verdict = admitted(args.manifest, doc.get("spec"), name, args.gpu_memory, args.allow_host_path)
    assert verdict.spec is not None
    spec = verdict.spec  # with stage: auto resolved
    stage = spec.zero.fixed_stage
    lines = [
        f"{args.manifest}: ZeroTrainingJob {name or '(unnamed)'} is valid: stage {stage.value}, "
        f"{spec.replicas} pod(s) × {spec.nproc_per_node} rank(s) = {spec.world_size} ranks"
    ]
    if local_only:
        lines.append("spec.image: not set: `zerotrain run` needs none, but the operator refuses the job without it")
    if verdict.stage_choice is not None:
        lines.append(f"stage auto chose {verdict.stage_choice.message}")
    group = spec.shard_group_ranks
    if group != spec.world_size and stage is not Stage.DATA_PARALLEL:
        lines.append(
            f"hybrid sharding: {spec.world_size // group} groups of {group} ranks, each holding one copy of the model "
            f"states (planned at N = {group}); only the gradient all-reduce of each shard crosses between groups"
        )
    planned = plan_job(spec)
    lines += memory_lines(planned, verdict.plan, args.gpu_memory)
    lines.append(entrypoint_line(spec, args))
    if planned.start_up is not None:
        lines.append(describe(planned.start_up, spec))
    if spec.model.pretrained is not None:
        lines.append(pretrained_line(spec, args.manifest))
    if spec.entrypoint == HF_ENTRYPOINT:
        lines += architecture_lines(spec)
    if spec.entrypoint == HF_ENTRYPOINT and not args.no_import:
        lines.append(hf_line(spec))
    if spec.elastic is not None:
        lines.append(elastic_line(doc.get("spec"), name or "job", args, spec))
    if (restart := restart_line(spec)) is not None:
        lines.append(restart)
    console = Console()
    for line in lines:
        console.print(Text(line), soft_wrap=True)
    return 0
