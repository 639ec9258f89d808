"""Pure builders of a job's gang: one Pod per replica (with the gang's ConfigMap, `build_gang`), the elastic
capacity probes, and the job's Events. What the gang needs first (Service, RBAC, PodGroup) is `supporting`'s; the
owner reference and labels every child carries, `job_ref`'s. No I/O."""

from __future__ import annotations

import uuid
from datetime import datetime

from zerotrain import elastic, gpu_env
from zerotrain import pod_contract as contract
from zerotrain.operator.children import kueue, naming, pod_template
from zerotrain.operator.children.job_ref import JobRef, child_metadata
from zerotrain.operator.children.supporting import build_config_map, checkpoint_dir
from zerotrain.operator.objects import Obj
from zerotrain.spec import (
    API_VERSION,
    KIND,
    TERMINATION_MARGIN_SECONDS,
    DataSpec,
    GangMode,
    PretrainedSpec,
    ZeroTrainingJobSpec,
)

# Scheduler names used when a gang mode is asked for and spec.scheduling.schedulerName is empty.
COSCHEDULING_SCHEDULER = "scheduler-plugins-scheduler"
VOLCANO_SCHEDULER = "volcano"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
CONFIG_VOLUME = naming.CONFIG_VOLUME
CHECKPOINT_VOLUME = "zerotrain-checkpoints"
PRETRAINED_VOLUME = "zerotrain-pretrained"
DATA_VOLUME = "zerotrain-data"
SHM_VOLUME = "zerotrain-shm"
# The runtime image's user and group; fsGroup makes a checkpoint PVC writable for it where the driver supports it.
RUNTIME_UID = RUNTIME_GID = 65532
# Pod Security Standard "restricted": training needs no privilege (GPUs come through the device plugin), so pods
# pass a namespace that enforces it. See docs/operator.md for what some GPU networking setups need instead.
POD_SECURITY: Obj = {
    "runAsNonRoot": True,
    "runAsUser": RUNTIME_UID,
    "runAsGroup": RUNTIME_GID,
    "fsGroup": RUNTIME_GID,
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY: Obj = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def scheduler_name(spec: ZeroTrainingJobSpec) -> str | None:
    if spec.scheduling.scheduler_name:
        return spec.scheduling.scheduler_name
    return {GangMode.COSCHEDULING: COSCHEDULING_SCHEDULER, GangMode.VOLCANO: VOLCANO_SCHEDULER}.get(
        spec.scheduling.gang
    )


# Env the operator sets in every pod: rendezvous and identity; neither spec.env nor a pod template may set them.
# (GPU jobs also get zerotrain.gpu_env.GPU_ENV, which both may set: those are defaults, not in this list.)
FIXED_ENV = frozenset(
    {
        *contract.RENDEZVOUS_ENV,
        contract.JOB_NAME_ENV,
        contract.NAMESPACE_ENV,
        contract.POD_NAME_ENV,
        contract.GANG_ENV,
    }
)


def pod_env(job: JobRef, spec: ZeroTrainingJobSpec, replica: int) -> list[Obj]:
    """The torchrun-style rendezvous env of one pod; for a GPU job the GPU defaults (`zerotrain.gpu_env`) that
    neither spec.env nor the pod template's training container sets; then spec.env (which may override nothing
    of the rendezvous env; the template's env follows it in the container, see `pod_template.merge`)."""
    fixed = {
        "MASTER_ADDR": naming.master_addr(job.name, job.namespace),
        "MASTER_PORT": str(naming.MASTER_PORT),
        "NNODES": str(spec.replicas),
        "NODE_RANK": str(replica),
        "NPROC_PER_NODE": str(spec.nproc_per_node),
        "WORLD_SIZE": str(spec.world_size),
        contract.JOB_NAME_ENV: job.name,
        contract.NAMESPACE_ENV: job.namespace,
    }
    env: list[Obj] = [{"name": k, "value": v} for k, v in fixed.items()]
    env.append({"name": contract.POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    gang_label = {"fieldPath": f"metadata.labels['{naming.LABEL_GANG}']"}
    env.append({"name": contract.GANG_ENV, "valueFrom": {"fieldRef": gang_label}})
    user = [{"name": e.name, "value": e.value} for e in spec.env if e.name not in FIXED_ENV]
    if spec.resources.gpu > 0:
        theirs = {e["name"] for e in user} | pod_template.trainer_env_names(spec.pod_template)
        env += [{"name": k, "value": v} for k, v in gpu_env.gpu_env_missing(theirs).items()]
    return env + user


def _resources(spec: ZeroTrainingJobSpec) -> Obj:
    amounts: dict[str, str] = {}
    if spec.resources.cpu:
        amounts["cpu"] = spec.resources.cpu
    if spec.resources.memory:
        amounts["memory"] = spec.resources.memory
    if spec.resources.gpu:
        amounts["nvidia.com/gpu"] = str(spec.resources.gpu)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def image(spec: ZeroTrainingJobSpec) -> str:
    """spec.image, which admission requires before anything is built."""
    assert spec.image is not None, "admission refuses a job without spec.image"
    return spec.image


def _container(job: JobRef, spec: ZeroTrainingJobSpec, replica: int) -> Obj:
    mounts: list[Obj] = [
        {"name": CONFIG_VOLUME, "mountPath": naming.CONFIG_DIR, "readOnly": True},
        {"name": CHECKPOINT_VOLUME, "mountPath": checkpoint_dir(spec)},
        # Container runtimes give /dev/shm 64 MiB; NCCL and torch's shared-memory transports need more.
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
    ]
    for name, claim in _read_only_claims(spec):
        mount: Obj = {"name": name, "mountPath": claim.path, "readOnly": True}
        mounts.append(mount | ({"subPath": claim.sub_path} if claim.sub_path else {}))
    mounts += [m.to_wire() for m in spec.volume_mounts]
    container: Obj = {
        "name": naming.CONTAINER_NAME,
        "image": image(spec),
        "command": ["python", "-m", "zerotrain.runtime", "--config", f"{naming.CONFIG_DIR}/{naming.CONFIG_KEY}"],
        "env": pod_env(job, spec, replica),
        "ports": [{"name": "rendezvous", "containerPort": naming.MASTER_PORT}],
        "volumeMounts": mounts,
    }
    if spec.metrics.enabled:
        container["ports"] += [
            {"name": f"metrics-{r}", "containerPort": contract.metrics_port(spec.metrics.port, r)}
            for r in range(spec.nproc_per_node)
        ]
    if resources := _resources(spec):
        container["resources"] = resources
    container["securityContext"] = dict(CONTAINER_SECURITY)
    return container


def build_pod(job: JobRef, spec: ZeroTrainingJobSpec, replica: int, gang: int, config: str | None = None) -> Obj:
    """Pod `replica` (NODE_RANK) of gang incarnation `gang`, on the job's pod template (mounting ConfigMap `config`,
    by default the gang's own)."""
    return pod_template.merge(operator_pod(job, spec, replica, gang, config), spec.pod_template)


def _read_only_claims(spec: ZeroTrainingJobSpec) -> list[tuple[str, PretrainedSpec | DataSpec]]:
    """The claims every pod reads and none writes: spec.model.pretrained's weights and spec.data, by volume name."""
    named = ((PRETRAINED_VOLUME, spec.model.pretrained), (DATA_VOLUME, spec.data))
    return [(name, claim) for name, claim in named if claim is not None and claim.claim_name]


def _read_only_volumes(spec: ZeroTrainingJobSpec) -> list[Obj]:
    return [
        {"name": name, "persistentVolumeClaim": {"claimName": claim.claim_name, "readOnly": True}}
        for name, claim in _read_only_claims(spec)
    ]


def operator_pod(job: JobRef, spec: ZeroTrainingJobSpec, replica: int, gang: int, config: str | None = None) -> Obj:
    """What the operator itself puts in pod `replica` of gang `gang`: it runs nprocPerNode local ranks, from round
    `gang` on (`pod_contract.ROUND_ANNOTATION`), reading ConfigMap `config` (the gang's own unless the pod joins
    pods an in-place restart kept, whose config it shares)."""
    labels = {naming.LABEL_REPLICA: str(replica), naming.LABEL_GANG: str(gang)}
    if spec.scheduling.gang == GangMode.COSCHEDULING:
        labels[COSCHEDULING_LABEL] = naming.pod_group_name(job.name)
    if job.queue:
        labels |= kueue.pod_labels(job.queue, job.name, gang, job.priority_class)
    metadata = child_metadata(job, naming.pod_name(job.name, replica), labels)
    metadata["annotations"] = {contract.ROUND_ANNOTATION: str(gang)}
    if spec.scheduling.gang == GangMode.VOLCANO:
        metadata["annotations"][VOLCANO_ANNOTATION] = naming.pod_group_name(job.name)
    if job.queue:
        metadata["annotations"] = {**metadata.get("annotations", {}), **kueue.pod_annotations(spec.replicas)}
    checkpoint: Obj = (
        {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": spec.checkpoint.claim_name}}
        if spec.checkpoint.claim_name
        else {"name": CHECKPOINT_VOLUME, "emptyDir": {}}
    )
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "hostname": naming.pod_name(job.name, replica),
        "subdomain": naming.service_name(job.name),
        "serviceAccountName": naming.service_account_name(job.name),
        "containers": [_container(job, spec, replica)],
        "volumes": [
            {"name": CONFIG_VOLUME, "configMap": {"name": config or naming.config_map_name(job.name, gang)}},
            checkpoint,
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
            *_read_only_volumes(spec),
            *spec.volumes,
        ],
        "securityContext": dict(POD_SECURITY),
        # Room for the SIGTERM checkpoint: Kubernetes' default 30 s would cut most saves short.
        "terminationGracePeriodSeconds": spec.checkpoint.termination_budget_seconds + TERMINATION_MARGIN_SECONDS,
    }
    if name := scheduler_name(spec):
        pod_spec["schedulerName"] = name
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    if spec.scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(spec.scheduling.node_selector)
    if spec.scheduling.tolerations:
        pod_spec["tolerations"] = [t.to_wire() for t in spec.scheduling.tolerations]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def build_pods(job: JobRef, spec: ZeroTrainingJobSpec, gang: int, config: str | None = None) -> list[Obj]:
    return [build_pod(job, spec, r, gang, config) for r in range(spec.replicas)]


def at_replicas(spec: ZeroTrainingJobSpec, replicas: int) -> ZeroTrainingJobSpec:
    """The manifest `spec` as a gang of `replicas` pods runs it (an elastic job's size in force): that many pods,
    and the accumulation that keeps the manifest's global batch (the ranks derive the same from the manifest, which
    their config keeps), so a plan of it counts what those ranks hold."""
    if replicas == spec.replicas:
        return spec
    acc = elastic.accumulation_at(spec.replicas, spec.nproc_per_node, spec.zero.gradient_accumulation_steps, replicas)
    zero = spec.zero.model_copy(update={"gradient_accumulation_steps": acc})
    return spec.model_copy(update={"replicas": replicas, "zero": zero})


def build_gang(
    job: JobRef, spec: ZeroTrainingJobSpec, gang: int, replicas: int | None = None, config: str | None = None
) -> list[Obj]:
    """Gang `gang` of `replicas` pods (default spec.replicas): its config (the manifest's spec, so the ranks know
    the layout they absorb) first, then its pods (mounting ConfigMap `config` where it is not the gang's own)."""
    sized = at_replicas(spec, spec.replicas if replicas is None else replicas)
    return [build_config_map(job, spec, gang), *build_pods(job, sized, gang, config)]


PROBE_COMMAND = ["python", "-c", "import signal; signal.pause()"]
"""What a capacity probe's containers run: nothing, until the operator deletes it (SIGTERM's default ends it)."""
PROBE_INIT_COMMAND = ["python", "-c", "pass"]
"""What its init containers run: they must end for the pod to start, as the real ones do."""


def _idle(container: Obj, image: str, command: list[str]) -> Obj:
    """A container that asks the scheduler for what `container` asks (resources, host ports) and runs nothing."""
    keys = ("name", "resources", "ports", "securityContext", "restartPolicy")
    kept: Obj = {k: container[k] for k in keys if k in container}
    sidecar = container.get("restartPolicy") == "Always"  # an init container that keeps running
    return {**kept, "image": image, "command": list(PROBE_COMMAND if sidecar else command)}


def build_probe(job: JobRef, spec: ZeroTrainingJobSpec, gang: int, index: int) -> Obj:
    """A capacity probe: a rank pod's placement (node selector, affinity, tolerations, priority, volumes and so their
    topology) and every container's and init container's requests and host ports, so the scheduler places it only
    where a new rank pod would fit; its containers run nothing (the trainer's image, which has Python). Labelled as
    a probe of gang `gang`; not a member of the gang's PodGroup or Kueue workload."""
    pod = build_pod(job, spec, spec.replicas + index, gang)
    labels = {**naming.job_labels(job.name), naming.LABEL_GANG: str(gang), naming.LABEL_PROBE: str(index)}
    pod["metadata"] = child_metadata(job, naming.probe_name(job.name, index), labels)
    body = pod["spec"]
    body["containers"] = [_idle(c, image(spec), PROBE_COMMAND) for c in body["containers"]]
    if body.get("initContainers"):
        body["initContainers"] = [_idle(c, image(spec), PROBE_INIT_COMMAND) for c in body["initContainers"]]
    for key in ("hostname", "subdomain", "schedulingGates"):
        body.pop(key, None)
    body["terminationGracePeriodSeconds"] = 0
    return pod


def build_event(job: JobRef, event_type: str, reason: str, message: str, now: datetime) -> Obj:
    """A core/v1 Event about the job (unique name, as generateName would give)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{job.name}.{uuid.uuid4().hex[:12]}", "namespace": job.namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": job.name,
            "namespace": job.namespace,
            "uid": job.uid,
        },
        "type": event_type,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": naming.MANAGER},
        "reportingComponent": naming.MANAGER,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
