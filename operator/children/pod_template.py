"""The user's `spec.podTemplate` (a Kubernetes PodTemplateSpec) under the operator's own pod: everything a platform
needs (affinity, topology spread, tolerations, imagePullSecrets, a ServiceAccount, env from Secrets, extra volumes,
init and sidecar containers, runtimeClassName, device-plugin resources such as an RDMA device...) passes through;
what the operator owns it sets itself, and a template that sets an owned field differently is refused with the
field, the value and the fix.

Pure: `problems()` is what admission refuses, `merge()` what the builders produce.
"""

from __future__ import annotations

import copy

from zerotrain.operator.children import naming
from zerotrain.operator.objects import Obj
from zerotrain.spec import GROUP

BASE = "spec.podTemplate"
# Pod-spec keys the operator sets and a template may not: the gang's identity and rendezvous DNS.
OWNED_POD_KEYS = ("restartPolicy", "hostname", "subdomain")
# Keys of the training container the operator sets from the spec, with where to set them instead.
OWNED_CONTAINER_KEYS = {
    "image": "spec.image",
    "command": "spec.entrypoint (the operator runs the zerotrain runtime)",
    "args": "spec.args",
    "ports": "spec.metrics.port (rendezvous and metrics ports are the operator's)",
}
# The training container's resources the spec sets (spec.resources: cpu, memory, gpu; admission's memory plan and the
# one-GPU-per-rank rule read them there). Any other resource, such as a device plugin's (`rdma/hca_shared_devices_a`
# for InfiniBand/RoCE), the template may request: it is added to the operator's limits and requests.
OWNED_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
RESOURCE_KEYS = ("limits", "requests")
# Pod-spec keys the spec also sets: a template may set them only to the same value (or when the spec does not).
SHARED_VALUES = {
    "schedulerName": "spec.scheduling.schedulerName",
    "priorityClassName": "spec.scheduling.priorityClassName",
    "terminationGracePeriodSeconds": "spec.checkpoint.terminationBudgetSeconds (plus 15 s)",
}
# Volumes the operator mounts into every pod.
OPERATOR_VOLUMES = (
    "zerotrain-config",
    "zerotrain-checkpoints",
    "zerotrain-shm",
    "zerotrain-pretrained",
    "zerotrain-data",
)


def _trainer(spec: Obj) -> Obj | None:
    return next((c for c in spec.get("containers") or [] if c.get("name") == naming.CONTAINER_NAME), None)


def problems(template: Obj, built: Obj, fixed_env: set[str], allow_host_path: bool) -> list[str]:
    """Why `template` cannot go under the operator's pod `built` (empty: it can)."""
    out: list[str] = []
    md = template.get("metadata") or {}
    for key in (md.get("labels") or {}) | (md.get("annotations") or {}):
        if key.startswith(f"{GROUP}/") or key == naming.LABEL_MANAGED_BY:
            out.append(f"{BASE}.metadata: {key!r} is the operator's label; remove it")
    for key in ("name", "namespace", "ownerReferences", "generateName"):
        if key in md:
            out.append(f"{BASE}.metadata.{key}: the operator names and owns the pods; remove it")
    t_spec, b_spec = template.get("spec") or {}, built["spec"]
    out += [
        f"{BASE}.spec.{k}: set by the operator (got {t_spec[k]!r}); remove it" for k in OWNED_POD_KEYS if k in t_spec
    ]
    for key, where in SHARED_VALUES.items():
        if key in t_spec and key in b_spec and t_spec[key] != b_spec[key]:
            out.append(f"{BASE}.spec.{key}: got {t_spec[key]!r} but {where} gives {b_spec[key]!r}; set only one")
    for key, value in (t_spec.get("nodeSelector") or {}).items():
        mine = (b_spec.get("nodeSelector") or {}).get(key)
        if mine is not None and mine != value:
            out.append(f"{BASE}.spec.nodeSelector.{key}: got {value!r} but spec.scheduling.nodeSelector has {mine!r}")
    for v in t_spec.get("volumes") or []:
        if v.get("name") in OPERATOR_VOLUMES or v.get("name") in {x["name"] for x in b_spec.get("volumes") or []}:
            out.append(f"{BASE}.spec.volumes[{v.get('name')}]: the name is taken by the operator's volumes; rename it")
        if "hostPath" in v and not allow_host_path:
            out.append(host_path_problem(f"{BASE}.spec.volumes[{v.get('name')}]"))
    trainer = _trainer(t_spec)
    if trainer is not None:
        out += _trainer_problems(trainer, fixed_env)
    return out


def host_path_problem(where: str) -> str:
    return (
        f"{where}.hostPath: this operator does not allow hostPath volumes (chart value operator.allowHostPath, off by "
        "default: a hostPath gives pods the node's files); use a PersistentVolumeClaim, or ask the cluster admin"
    )


def _trainer_problems(trainer: Obj, fixed_env: set[str]) -> list[str]:
    where = f"{BASE}.spec.containers[{naming.CONTAINER_NAME}]"
    out = [
        f"{where}.{k}: set by the operator from {v}; remove it" for k, v in OWNED_CONTAINER_KEYS.items() if k in trainer
    ]
    for e in trainer.get("env") or []:
        if e.get("name") in fixed_env:
            out.append(f"{where}.env[{e.get('name')}]: set by the operator (rendezvous and job identity); remove it")
    resources = trainer.get("resources") or {}
    out += [
        f"{where}.resources.{k}: a template may add only limits and requests (of resources spec.resources does not "
        "set); remove it"
        for k in resources
        if k not in RESOURCE_KEYS
    ]
    for kind in RESOURCE_KEYS:
        out += [
            f"{where}.resources.{kind}.{name}: set by the operator from spec.resources (cpu, memory, gpu); set it there"
            for name in resources.get(kind) or {}
            if name in OWNED_RESOURCES
        ]
    return out


def trainer_env_names(template: Obj | None) -> set[str]:
    """Names the template's training container sets in `env` (not `envFrom`: its keys are unknown until the pod
    starts)."""
    trainer = _trainer((template or {}).get("spec") or {})
    return {str(e.get("name")) for e in (trainer or {}).get("env") or []}


def merge(built: Obj, template: Obj | None) -> Obj:
    """The pod `built` with `template` under it: the template's fields, then the operator's on top."""
    if not template:
        return built
    pod = copy.deepcopy(built)
    md, t_md = pod["metadata"], template.get("metadata") or {}
    md["labels"] = {**(t_md.get("labels") or {}), **md.get("labels", {})}
    if annotations := {**(t_md.get("annotations") or {}), **(md.get("annotations") or {})}:
        md["annotations"] = annotations
    t_spec = copy.deepcopy(template.get("spec") or {})
    spec = pod["spec"]
    merged: Obj = {**t_spec, **spec}
    # The restricted pod security defaults stay unless the template says otherwise.
    merged["securityContext"] = {**spec.get("securityContext", {}), **(t_spec.get("securityContext") or {})}
    merged["nodeSelector"] = {**(t_spec.get("nodeSelector") or {}), **(spec.get("nodeSelector") or {})}
    merged["tolerations"] = [*(spec.get("tolerations") or []), *(t_spec.get("tolerations") or [])]
    merged["volumes"] = [*spec.get("volumes", []), *(t_spec.get("volumes") or [])]
    for key in ("nodeSelector", "tolerations"):
        if not merged[key]:
            del merged[key]
    merged["containers"] = _containers(spec["containers"], t_spec.get("containers") or [])
    # The template's own containers get the operator's restricted container defaults unless they set their own.
    defaults = spec["containers"][0].get("securityContext", {})
    for key in ("containers", "initContainers"):
        for c in merged.get(key) or []:
            c["securityContext"] = {**defaults, **(c.get("securityContext") or {})}
    if "serviceAccountName" in t_spec:
        merged["serviceAccountName"] = t_spec["serviceAccountName"]
    pod["spec"] = merged
    return pod


def _containers(mine: list[Obj], theirs: list[Obj]) -> list[Obj]:
    """The training container with the template's additions, then the template's other containers (sidecars)."""
    trainer = mine[0]
    extra = next((c for c in theirs if c.get("name") == trainer["name"]), None)
    if extra is not None:
        trainer = {
            **extra,
            **trainer,
            "env": [*trainer.get("env", []), *(extra.get("env") or [])],
            "volumeMounts": [*trainer.get("volumeMounts", []), *(extra.get("volumeMounts") or [])],
            "securityContext": {**trainer.get("securityContext", {}), **(extra.get("securityContext") or {})},
        }
        trainer.pop("resources", None)
        if resources := _resources(mine[0].get("resources") or {}, extra.get("resources") or {}):
            trainer["resources"] = resources
    return [trainer, *(c for c in theirs if c.get("name") != trainer["name"])]


def _resources(mine: Obj, theirs: Obj) -> Obj:
    """The operator's limits and requests with the template's other resources added (problems() refused any that
    spec.resources sets)."""
    merged = {kind: {**(theirs.get(kind) or {}), **(mine.get(kind) or {})} for kind in RESOURCE_KEYS}
    return {kind: amounts for kind, amounts in merged.items() if amounts}


def service_account(template: Obj | None, default: str) -> str:
    """The ServiceAccount the pods run as: the template's, else the operator's per-job one."""
    return str(((template or {}).get("spec") or {}).get("serviceAccountName") or default)
