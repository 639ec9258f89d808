"""Pure builders: table-driven over job shapes, including a 64-replica gang."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import kubernetes_validate
import pytest
import yaml

from zerotrain.manifest import parse_spec
from zerotrain.operator.children import builders, job_ref, naming, supporting
from zerotrain.operator.children.job_ref import JobRef

JOB = JobRef("llm", "team-a", "uid-1")
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def spec(**extra: Any) -> Any:
    return parse_spec({"image": "img:1", "entrypoint": "pkg.mod:build", **extra})


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<ref>") for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize(
    ("replicas", "nproc", "gpu"),
    [(1, 1, 0), (2, 4, 4), (64, 8, 8), (3, 2, 0)],
)
def test_pods_rendezvous_env_and_identity(replicas: int, nproc: int, gpu: int) -> None:
    s = spec(replicas=replicas, nprocPerNode=nproc, resources={"gpu": gpu}, env=[{"name": "HF_HOME", "value": "/x"}])
    pods = builders.build_pods(JOB, s, gang=3)
    assert [p["metadata"]["name"] for p in pods] == [f"llm-worker-{r}" for r in range(replicas)]
    for rank, pod in enumerate(pods):
        e = env(pod)
        assert e["MASTER_ADDR"] == "llm-worker-0.llm.team-a.svc"
        assert (e["NODE_RANK"], e["NNODES"], e["NPROC_PER_NODE"]) == (str(rank), str(replicas), str(nproc))
        assert e["WORLD_SIZE"] == str(replicas * nproc) and e["MASTER_PORT"] == "29500"
        assert (e["ZEROTRAIN_JOB_NAME"], e["ZEROTRAIN_NAMESPACE"], e["HF_HOME"]) == ("llm", "team-a", "/x")
        assert e["POD_NAME"] == "<ref>" and not any(k.startswith("ZEROTRAIN_CHECKPOINT") for k in e)
        assert pod["metadata"]["labels"][naming.LABEL_GANG] == "3"
        assert pod["metadata"]["ownerReferences"] == [job_ref.owner_reference(JOB)]
        assert pod["spec"]["hostname"] == f"llm-worker-{rank}" and pod["spec"]["subdomain"] == "llm"
        c = pod["spec"]["containers"][0]
        assert c["command"] == ["python", "-m", "zerotrain.runtime", "--config", "/etc/zerotrain/job.yaml"]
        assert [p["containerPort"] for p in c["ports"][1:]] == [9400 + r for r in range(nproc)]
        assert ("nvidia.com/gpu" in c.get("resources", {}).get("limits", {})) == (gpu > 0)


def test_user_env_cannot_override_rendezvous() -> None:
    pod = builders.build_pod(JOB, spec(env=[{"name": "WORLD_SIZE", "value": "99"}]), 0, 0)
    assert [e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "WORLD_SIZE"] == ["1"]


@pytest.mark.parametrize(
    ("checkpoint", "volume"),
    [({}, {"emptyDir": {}}), ({"claimName": "ckpt"}, {"persistentVolumeClaim": {"claimName": "ckpt"}})],
)
def test_checkpoint_volume(checkpoint: dict[str, Any], volume: dict[str, Any]) -> None:
    pod = builders.build_pod(JOB, spec(checkpoint={**checkpoint, "path": "/ck"}), 0, 0)
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == builders.CHECKPOINT_VOLUME)
    assert {k: v for k, v in vol.items() if k != "name"} == volume
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts == {
        builders.CONFIG_VOLUME: "/etc/zerotrain",
        builders.CHECKPOINT_VOLUME: "/ck",
        builders.SHM_VOLUME: "/dev/shm",
    }


@pytest.mark.parametrize(
    ("pretrained", "mount"),
    [
        ({"path": "/models/llama"}, None),  # on a volume of the user's own (spec.volumes), or baked into the image
        ({"path": "/pretrained", "claimName": "models"}, {"mountPath": "/pretrained", "readOnly": True}),
        (
            {"path": "/pretrained", "claimName": "models", "subPath": "llama-3-8b"},
            {"mountPath": "/pretrained", "readOnly": True, "subPath": "llama-3-8b"},
        ),
    ],
)
def test_the_pretrained_claim_is_mounted_read_only_where_the_ranks_read_it(
    pretrained: dict[str, Any], mount: dict[str, Any] | None
) -> None:
    pod = builders.build_pod(JOB, spec(model={"pretrained": pretrained}), 0, 0)
    kubernetes_validate.validate(pod, "1.30", strict=True)
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    if mount is None:
        assert builders.PRETRAINED_VOLUME not in mounts and builders.PRETRAINED_VOLUME not in volumes
        return
    assert {k: v for k, v in mounts[builders.PRETRAINED_VOLUME].items() if k != "name"} == mount
    claim = volumes[builders.PRETRAINED_VOLUME]["persistentVolumeClaim"]
    assert claim == {"claimName": "models", "readOnly": True}


def test_the_data_claim_is_mounted_read_only_beside_the_pretrained_one() -> None:
    data = {"path": "/data", "claimName": "corpora", "subPath": "tokens"}
    pretrained = {"path": "/pretrained", "claimName": "models"}
    pod = builders.build_pod(JOB, spec(data=data, model={"pretrained": pretrained}), 0, 0)
    kubernetes_validate.validate(pod, "1.30", strict=True)
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mounts[builders.DATA_VOLUME] == {
        "name": builders.DATA_VOLUME,
        "mountPath": "/data",
        "readOnly": True,
        "subPath": "tokens",
    }
    assert volumes[builders.DATA_VOLUME]["persistentVolumeClaim"] == {"claimName": "corpora", "readOnly": True}
    assert volumes[builders.PRETRAINED_VOLUME]["persistentVolumeClaim"]["claimName"] == "models"
    local = builders.build_pod(JOB, spec(data={"path": "data"}), 0, 0)  # no claim: nothing mounted
    assert builders.DATA_VOLUME not in {v["name"] for v in local["spec"]["volumes"]}


@pytest.mark.parametrize(("path", "mounted"), [(None, "/checkpoints"), ("/ck", "/ck")])
def test_the_ranks_read_their_checkpoint_root_from_the_spec_where_the_volume_is_mounted(
    path: str | None, mounted: str
) -> None:
    s = spec(checkpoint={"path": path} if path else {})
    pod = builders.build_pod(JOB, s, 0, 0)
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    config = yaml.safe_load(supporting.build_config_map(JOB, s, 0)["data"][naming.CONFIG_KEY])
    assert mounts[builders.CHECKPOINT_VOLUME] == config["spec"]["checkpoint"]["path"] == mounted


def test_pods_get_shared_memory_and_a_writable_checkpoint_group() -> None:
    pod = builders.build_pod(JOB, spec(checkpoint={"claimName": "ckpt"}), 0, 0)
    shm = next(v for v in pod["spec"]["volumes"] if v["name"] == builders.SHM_VOLUME)
    assert shm["emptyDir"] == {"medium": "Memory"}
    assert pod["spec"]["securityContext"]["fsGroup"] == builders.RUNTIME_GID == 65532


@pytest.mark.parametrize(
    ("gang", "api", "scheduler"),
    [
        ("none", None, None),
        ("coscheduling", "scheduling.x-k8s.io/v1alpha1", "scheduler-plugins-scheduler"),
        ("volcano", "scheduling.volcano.sh/v1beta1", "volcano"),
    ],
)
def test_gang_scheduling(gang: str, api: str | None, scheduler: str | None) -> None:
    s = spec(replicas=64, scheduling={"gang": gang})
    group = supporting.build_pod_group(JOB, s)
    pod = builders.build_pod(JOB, s, 5, 0)
    assert pod["spec"].get("schedulerName") == scheduler
    if api is None:
        assert group is None
        return
    assert group is not None and group["apiVersion"] == api and group["spec"]["minMember"] == 64
    assert group["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    marks = {**pod["metadata"]["labels"], **pod["metadata"].get("annotations", {})}
    assert marks.get(builders.COSCHEDULING_LABEL if gang == "coscheduling" else builders.VOLCANO_ANNOTATION) == "llm"


def test_supporting_objects_are_owned_and_rbac_is_narrow() -> None:
    objs = supporting.build_supporting(JOB, spec())
    assert [o["kind"] for o in objs] == ["ServiceAccount", "Role", "RoleBinding", "Service"]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == "uid-1" for o in objs)
    role = objs[1]
    assert role["rules"] == [
        {
            "apiGroups": ["zerotrain.dev"],
            "resources": ["zerotrainingjobs/status"],
            "resourceNames": ["llm"],
            "verbs": ["patch"],
        },
        # Each launcher watches and annotates its own pod (in-place restarts): the gang's pods, nothing else.
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "resourceNames": ["llm-worker-0"],
            "verbs": ["get", "list", "watch", "patch"],
        },
    ]
    svc = objs[3]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True


def test_each_gang_reads_its_own_immutable_config() -> None:
    config, *pods = builders.build_gang(JOB, spec(replicas=2, env=[{"name": "A", "value": "1"}]), gang=3)
    assert config["kind"] == "ConfigMap" and config["metadata"]["name"] == "llm-config-3"
    assert config["immutable"] is True and config["metadata"]["labels"][naming.LABEL_GANG] == "3"
    assert "value: '1'" in config["data"]["job.yaml"] or 'value: "1"' in config["data"]["job.yaml"]
    for pod in pods:
        (volume,) = [v for v in pod["spec"]["volumes"] if "configMap" in v]
        assert volume["configMap"]["name"] == "llm-config-3"


def test_builders_are_deterministic() -> None:
    s = spec(replicas=4)
    assert builders.build_pods(JOB, s, 0) == builders.build_pods(JOB, s, 0)
    assert supporting.build_supporting(JOB, s) == supporting.build_supporting(JOB, s)


@pytest.mark.parametrize(
    ("name", "replicas", "ok"),
    [("llm", 64, True), ("Bad_Name", 1, False), ("a" * 54, 1, True), ("a" * 54, 100, False)],
)
def test_name_limits(name: str, replicas: int, ok: bool) -> None:
    problem = naming.name_problem(name, replicas)
    assert (problem is None) == ok
    if problem:
        assert problem.startswith("metadata.name: got")


@pytest.mark.parametrize("gang", ["none", "coscheduling", "volcano"])
def test_built_objects_validate_against_the_kubernetes_schema(gang: str) -> None:
    """What a real API server would accept (PodGroups are CRDs outside the bundled schemas)."""
    s = spec(
        replicas=2,
        nprocPerNode=2,
        resources={"gpu": 2, "cpu": "8", "memory": "64Gi"},
        checkpoint={"claimName": "ckpt"},
        scheduling={"gang": gang, "tolerations": [{"key": "gpu", "operator": "Exists"}], "nodeSelector": {"a": "b"}},
        volumes=[{"name": "data", "emptyDir": {}}],
        volumeMounts=[{"name": "data", "mountPath": "/data"}],
    )
    objs = [o for o in supporting.build_supporting(JOB, s) if o["kind"] != "PodGroup"]
    objs += builders.build_pods(JOB, s, 0)
    objs.append(builders.build_event(JOB, "Warning", "RankFailed", "pod llm-worker-1 exited with code 1", NOW))
    version = kubernetes_validate.latest_version()
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ({}, {"metrics-0": 9400, "metrics-1": 9401, "metrics-2": 9402}),
        ({"port": 9500}, {"metrics-0": 9500, "metrics-1": 9501, "metrics-2": 9502}),
        ({"enabled": False}, {}),
    ],
)
def test_metrics_ports_follow_spec_metrics(metrics: dict[str, Any], expected: dict[str, int]) -> None:
    pod = builders.build_pod(JOB, spec(nprocPerNode=3, metrics=metrics), replica=0, gang=0)
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert {k: v for k, v in ports.items() if k.startswith("metrics")} == expected


def test_fixed_env_names_exactly_the_env_the_operator_sets() -> None:
    """One list guards spec.env and pod templates: it must be what pod_env really sets before the user's env."""
    s = spec(env=[{"name": "MASTER_ADDR", "value": "evil"}, {"name": "HF_HOME", "value": "/x"}])
    names = [e["name"] for e in builders.pod_env(JOB, s, replica=0)]
    assert names[:-1] == [n for n in names[:-1] if n in builders.FIXED_ENV]
    assert set(names[:-1]) == builders.FIXED_ENV and names[-1] == "HF_HOME"


@pytest.mark.parametrize(("checkpoint", "grace"), [({}, 135), ({"terminationBudgetSeconds": 600}, 615)])
def test_pods_get_a_grace_period_that_fits_the_sigterm_checkpoint(checkpoint: dict[str, Any], grace: int) -> None:
    # Kubernetes' default 30 s would SIGKILL a rank in the middle of its save.
    pods = builders.build_pods(JOB, spec(replicas=2, checkpoint=checkpoint), gang=0)
    assert {p["spec"]["terminationGracePeriodSeconds"] for p in pods} == {grace}


def test_the_gang_config_reads_back_as_the_python_emitter_writes_it() -> None:
    # The ConfigMap is written by libyaml's emitter where PyYAML has it: the ranks must read what the pure-Python
    # emitter would have written, long lines, quoting and non-ASCII text included.
    args = ["--note", "héllo: wörld # ünïcode", "x" * 300, "yes", "0o17", ""]
    s = spec(args=args, env=[{"name": "PROMPT", "value": "a\nb"}])
    text = supporting.build_config_map(JOB, s, 0)["data"][naming.CONFIG_KEY]
    assert supporting._DUMPER is yaml.CSafeDumper  # PyYAML's wheels bring libyaml: the test checks the C emitter
    manifest = yaml.safe_load(text)
    assert text == yaml.safe_dump(manifest, sort_keys=False)
    assert manifest["spec"]["args"] == args


def test_a_queued_job_s_pods_carry_its_kueue_queue_group_size_and_priority_class() -> None:
    body = {
        "metadata": {
            "name": "llm",
            "namespace": "team-a",
            "uid": "u",
            "labels": {"kueue.x-k8s.io/queue-name": "team-q", "kueue.x-k8s.io/priority-class": "high"},
        }
    }
    job = JobRef.from_body(body)
    spec = parse_spec({"image": "i", "entrypoint": "m:f", "replicas": 2})
    pod = builders.build_pod(job, spec, replica=1, gang=3)
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-q" and labels["kueue.x-k8s.io/priority-class"] == "high"
    assert labels["kueue.x-k8s.io/pod-group-name"] == "llm-gang-3"
    assert annotations["kueue.x-k8s.io/pod-group-total-count"] == "2"
    assert annotations["kueue.x-k8s.io/retriable-in-group"] == "false"  # a restart is a new group, never a refill
    plain = builders.build_pod(JobRef.from_body({"metadata": {**body["metadata"], "labels": {}}}), spec, 1, 3)
    assert not [k for k in plain["metadata"]["labels"] if k.startswith("kueue.x-k8s.io/")]
