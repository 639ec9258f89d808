"""Pure builders of what a job's gang needs before its pods: the headless Service, the per-gang ConfigMap, RBAC
for status reports and the optional PodGroup. No I/O; every object carries the job's owner reference."""

from __future__ import annotations

import yaml

from zerotrain.operator.children import naming, pod_template
from zerotrain.operator.children.job_ref import JobRef, child_metadata
from zerotrain.operator.objects import Obj
from zerotrain.spec import DEFAULT_CHECKPOINT_DIR, GROUP, PLURAL, GangMode, ZeroTrainingJob, ZeroTrainingJobSpec


def build_service(job: JobRef) -> Obj:
    """Headless; publishes not-ready pods so ranks resolve MASTER_ADDR before rank 0 is Ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(job, naming.service_name(job.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {naming.LABEL_JOB: job.name},
            "ports": [{"name": "rendezvous", "port": naming.MASTER_PORT, "targetPort": naming.MASTER_PORT}],
        },
    }


def checkpoint_dir(spec: ZeroTrainingJobSpec) -> str:
    """Where every pod of the job mounts its checkpoint volume."""
    return spec.checkpoint.path or DEFAULT_CHECKPOINT_DIR


# libyaml's emitter where PyYAML has it (its wheels do): the same text as SafeDumper's at a quarter of the CPU. In
# pure Python it took about 2 ms, the largest share of a job's first pass when a hundred jobs arrive at once.
_DUMPER: type[yaml.SafeDumper] | type[yaml.CSafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def build_config_map(job: JobRef, spec: ZeroTrainingJobSpec, gang: int) -> Obj:
    """The full, defaulted manifest gang `gang` reads from /etc/zerotrain/job.yaml.

    One immutable ConfigMap per gang: a spec edit never changes what a running gang's pods (or one of its pods
    started late) read; it applies from the next gang on.
    """
    # The ranks read their checkpoint root from this spec: where the pod mounts the volume.
    checkpoint = spec.checkpoint.model_copy(update={"path": checkpoint_dir(spec)})
    spec = spec.model_copy(update={"checkpoint": checkpoint})
    manifest = ZeroTrainingJob(metadata={"name": job.name, "namespace": job.namespace}, spec=spec).to_wire()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(job, naming.config_map_name(job.name, gang), {naming.LABEL_GANG: str(gang)}),
        "immutable": True,
        "data": {naming.CONFIG_KEY: yaml.dump(manifest, Dumper=_DUMPER, sort_keys=False)},
    }


def build_rbac(job: JobRef, spec: ZeroTrainingJobSpec) -> list[Obj]:
    """ServiceAccount + Role + RoleBinding letting the job's pods (as the template's ServiceAccount, else the job's
    own) patch only this job's status, and read, watch and annotate the job's rank pods (each launcher its own: the
    in-place restart's word comes on its pod, and its round's end goes there)."""
    sa = naming.service_account_name(job.name)
    most = spec.elastic.max_replicas if spec.elastic is not None else spec.replicas
    pods = [naming.pod_name(job.name, r) for r in range(max(most, spec.replicas))]
    runs_as = pod_template.service_account(spec.pod_template, sa)
    role = naming.role_name(job.name)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": child_metadata(job, sa)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": child_metadata(job, role),
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "resources": [f"{PLURAL}/status"],
                    "resourceNames": [job.name],
                    "verbs": ["patch"],
                },
                # A watch names its pod by fieldSelector metadata.name, which RBAC checks against resourceNames.
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "resourceNames": pods,
                    "verbs": ["get", "list", "watch", "patch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": child_metadata(job, role),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": runs_as, "namespace": job.namespace}],
        },
    ]


def build_pod_group(job: JobRef, spec: ZeroTrainingJobSpec) -> Obj | None:
    """A PodGroup with minMember = replicas for the gang scheduler, or None without gang scheduling."""
    mode = spec.scheduling.gang
    if mode == GangMode.NONE:
        return None
    api = "scheduling.x-k8s.io/v1alpha1" if mode == GangMode.COSCHEDULING else "scheduling.volcano.sh/v1beta1"
    body: Obj = {"minMember": spec.replicas}
    if mode == GangMode.COSCHEDULING:
        body["scheduleTimeoutSeconds"] = spec.scheduling.startup_timeout_seconds
    return {
        "apiVersion": api,
        "kind": "PodGroup",
        "metadata": child_metadata(job, naming.pod_group_name(job.name)),
        "spec": body,
    }


def build_supporting(job: JobRef, spec: ZeroTrainingJobSpec) -> list[Obj]:
    """Everything but the gang, all of which must exist before its pods are created (in no order among themselves)."""
    objs = [*build_rbac(job, spec), build_service(job)]
    if (group := build_pod_group(job, spec)) is not None:
        objs.append(group)
    return objs
