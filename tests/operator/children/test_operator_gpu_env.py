"""GPU jobs' pods get zerotrain.gpu_env's defaults (after the rendezvous env, unless the job sets the variable);
CPU jobs none. The RDMA example of docs/install.md is examples/gpu-rdma.yaml, admitted, and renders to a pod with
the device, IPC_LOCK and the Multus network, in a namespace at the PodSecurity level the docs name."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pod_security import baseline_violations, level

from zerotrain import gpu_env
from zerotrain.manifest import parse_job, parse_spec
from zerotrain.operator.children import builders, pod_template
from zerotrain.operator.children.job_ref import JobRef
from zerotrain.operator.controller.admission import admit

ROOT = Path(__file__).resolve().parents[3]
JOB = JobRef("llm", "team-a", "uid-1")
GPU = {"nprocPerNode": 2, "resources": {"gpu": 2}}


def spec(**extra: Any) -> Any:
    return parse_spec({"image": "img:1", "entrypoint": "pkg.mod:build", **extra})


def env_list(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod["spec"]["containers"][0]["env"])


def names(pod: dict[str, Any]) -> list[str]:
    return [e["name"] for e in env_list(pod)]


# ---------------------------------------------------------------- the module


def test_the_defaults_are_the_documented_ones() -> None:
    assert dict(gpu_env.GPU_ENV) == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "NCCL_DEBUG": "WARN",
    }
    install = (ROOT / "docs" / "install.md").read_text()
    for name, value in gpu_env.GPU_ENV.items():
        assert f"`{name}={value}`" in install, f"docs/install.md does not state {name}={value}"
    with pytest.raises(TypeError):
        gpu_env.GPU_ENV["NCCL_DEBUG"] = "INFO"  # type: ignore[index]


def test_merging_never_overrides_what_is_set() -> None:
    assert gpu_env.gpu_env_missing({}) == dict(gpu_env.GPU_ENV)
    mine = {"NCCL_DEBUG": "INFO", "TORCH_NCCL_DUMP_ON_TIMEOUT": "", "HF_HOME": "/x"}
    merged = {**mine, **gpu_env.gpu_env_missing(mine)}
    assert merged.items() >= mine.items()  # an empty value is a choice too
    assert merged["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert gpu_env.gpu_env_missing(mine).keys() == gpu_env.GPU_ENV.keys() - {"NCCL_DEBUG", "TORCH_NCCL_DUMP_ON_TIMEOUT"}
    assert gpu_env.gpu_env_missing(set(gpu_env.GPU_ENV)) == {}


@pytest.mark.parametrize(
    ("alias", "default"),
    [
        ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"),
        ("NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
        ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    ],
)
def test_a_setting_under_another_name_keeps_the_default_out(alias: str, default: str) -> None:
    """torch would read the default's name first (PYTORCH_CUDA_ALLOC_CONF over PYTORCH_ALLOC_CONF...): adding it
    would silently override the job's own setting."""
    missing = gpu_env.gpu_env_missing({alias: "x"})
    assert default not in missing and len(missing) == len(gpu_env.GPU_ENV) - 1


def test_none_of_the_defaults_is_operator_fixed_env() -> None:
    """The job may set every one of them (spec.env and the template refuse only FIXED_ENV)."""
    assert not builders.FIXED_ENV & set(gpu_env.GPU_ENV)
    assert not builders.FIXED_ENV & {a for aliases in gpu_env.ALIASES.values() for a in aliases}


# ---------------------------------------------------------------- the pods


@pytest.mark.parametrize(("replicas", "nproc"), [(1, 1), (2, 8)])
def test_gpu_pods_get_the_defaults_after_the_rendezvous_env(replicas: int, nproc: int) -> None:
    s = spec(replicas=replicas, nprocPerNode=nproc, resources={"gpu": nproc}, env=[{"name": "HF_HOME", "value": "/x"}])
    for pod in builders.build_pods(JOB, s, gang=0):
        env = env_list(pod)
        n = len(builders.FIXED_ENV)
        assert {e["name"] for e in env[:n]} == builders.FIXED_ENV
        assert {e["name"]: e["value"] for e in env[n:-1]} == dict(gpu_env.GPU_ENV)
        assert env[-1] == {"name": "HF_HOME", "value": "/x"}


@pytest.mark.parametrize("resources", [{}, {"cpu": "4", "memory": "8Gi"}])
def test_cpu_pods_get_none_of_them(resources: dict[str, str]) -> None:
    pod = builders.build_pod(JOB, spec(replicas=2, resources=resources), replica=1, gang=0)
    assert not set(names(pod)) & set(gpu_env.GPU_ENV)
    assert set(names(pod)) == builders.FIXED_ENV


def test_the_jobs_own_value_wins_and_appears_once() -> None:
    s = spec(
        **GPU,
        env=[
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "PYTORCH_ALLOC_CONF", "value": "backend:cudaMallocAsync"},
        ],
        podTemplate={
            "spec": {
                "containers": [
                    {
                        "name": "trainer",
                        "env": [
                            {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
                            {
                                "name": "TORCH_NCCL_TRACE_BUFFER_SIZE",
                                "valueFrom": {"configMapKeyRef": {"name": "s", "key": "k"}},
                            },
                        ],
                    }
                ]
            }
        },
    )
    assert admit(s.model_dump(by_alias=True, exclude_none=True), "llm").admitted
    pod = builders.build_pod(JOB, s, replica=0, gang=0)
    got = names(pod)
    assert len(got) == len(set(got)), f"duplicate env names: {got}"
    env = {e["name"]: e.get("value", "<ref>") for e in env_list(pod)}
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "<ref>"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and env["PYTORCH_ALLOC_CONF"] == "backend:cudaMallocAsync"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"  # what the job did not set stays
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)


# ---------------------------------------------------------------- the RDMA example of docs/install.md

EXAMPLE = ROOT / "examples" / "gpu-rdma.yaml"


def _section(doc: str, title: str) -> str:
    start = doc.index(f"## {title}\n")
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end != -1 else None]


def docs_example() -> dict[str, Any]:
    section = _section((ROOT / "docs" / "install.md").read_text(), "GPUs and fast interconnects")
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", section, re.S) if "podTemplate:" in b]
    return dict(yaml.safe_load(block))


def rdma_pod(manifest: dict[str, Any]) -> dict[str, Any]:
    verdict = admit(manifest["spec"], manifest["metadata"]["name"])
    assert verdict.admitted, f"{verdict.reason}: {verdict.message}"
    job = parse_job(manifest, source="docs/install.md")
    return builders.build_pod(JobRef(job.metadata["name"], "ml", "uid-2"), job.spec, replica=1, gang=0)


def test_the_docs_example_is_the_example_file() -> None:
    """tests/chart/test_chart_examples.py checks every examples/*.yaml against the CRD's schema, the spec models and
    admission; this keeps the manifest in the docs the same."""
    (job,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    assert docs_example() == job


def test_the_rdma_example_renders_what_nccl_needs() -> None:
    pod = rdma_pod(docs_example())
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    trainer = pod["spec"]["containers"][0]
    assert trainer["name"] == "trainer"
    limits, requests = trainer["resources"]["limits"], trainer["resources"]["requests"]
    assert limits == {"cpu": "64", "memory": "480Gi", "nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": 1}
    assert "rdma/rdma_shared_device_a" not in requests  # the API server defaults an extended resource's request
    assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert trainer["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["spec"]["securityContext"]["runAsUser"] == 0 and pod["spec"]["securityContext"]["fsGroup"] == 65532
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net"
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["NCCL_IB_HCA"] == "mlx5" and env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env.items() >= gpu_env.GPU_ENV.items()
    shm = next(v for v in pod["spec"]["volumes"] if v["name"] == builders.SHM_VOLUME)
    assert shm == {"name": builders.SHM_VOLUME, "emptyDir": {"medium": "Memory"}}  # bounded by the memory limit


def test_the_rdma_example_needs_the_privileged_level() -> None:
    pod = rdma_pod(docs_example())
    assert level(pod) == "privileged"
    assert baseline_violations(pod) == ["trainer: capability IPC_LOCK beyond baseline"]


def test_without_ipc_lock_the_rdma_pods_stay_restricted() -> None:
    """With the nodes' container runtime granting an unlimited memlock limit, no capability and no root: the device
    and the Multus network alone keep the pods `restricted`."""
    manifest = docs_example()
    template = manifest["spec"]["podTemplate"]["spec"]
    del template["securityContext"], template["containers"][0]["securityContext"]
    assert level(rdma_pod(manifest)) == "restricted"
    root_only = docs_example()
    del root_only["spec"]["podTemplate"]["spec"]["containers"][0]["securityContext"]
    assert level(rdma_pod(root_only)) == "baseline"  # root alone is baseline


def test_host_network_instead_of_multus_is_privileged() -> None:
    manifest = docs_example()
    del manifest["spec"]["podTemplate"]["metadata"]
    template = manifest["spec"]["podTemplate"]["spec"]
    template |= {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
    del template["securityContext"], template["containers"][0]["securityContext"]
    pod = rdma_pod(manifest)
    assert pod["spec"]["hostNetwork"] is True and pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert level(pod) == "privileged" and "host namespaces: hostNetwork" in baseline_violations(pod)


# ---------------------------------------------------------------- device-plugin resources in a pod template


def test_a_template_adds_device_plugin_resources_to_the_operators() -> None:
    template = {
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "resources": {
                        "limits": {"rdma/hca_shared_devices_a": "1"},
                        "requests": {"rdma/hca_shared_devices_a": "1"},
                    },
                }
            ]
        }
    }
    s = spec(**GPU, podTemplate=template)
    assert admit(s.model_dump(by_alias=True, exclude_none=True), "llm").admitted
    resources = builders.build_pod(JOB, s, replica=0, gang=0)["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": "2", "rdma/hca_shared_devices_a": "1"}
    assert resources["requests"] == {"nvidia.com/gpu": "2", "rdma/hca_shared_devices_a": "1"}
    cpu_only = builders.build_pod(JOB, spec(podTemplate=copy.deepcopy(template)), replica=0, gang=0)
    assert cpu_only["spec"]["containers"][0]["resources"]["limits"] == {"rdma/hca_shared_devices_a": "1"}


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            {"limits": {"nvidia.com/gpu": "8"}},
            "spec.podTemplate.spec.containers[trainer].resources.limits.nvidia.com/gpu: set by the operator from "
            "spec.resources (cpu, memory, gpu); set it there",
        ),
        ({"requests": {"memory": "1Gi"}}, "containers[trainer].resources.requests.memory: set by the operator"),
        ({"limits": {"cpu": "2"}}, "containers[trainer].resources.limits.cpu: set by the operator"),
        ({"claims": [{"name": "gpu"}]}, "containers[trainer].resources.claims: a template may add only limits"),
    ],
)
def test_a_template_may_not_request_what_spec_resources_sets(resources: dict[str, Any], message: str) -> None:
    raw = {
        "image": "runtime:1",
        "entrypoint": "pkg.mod:build",
        "podTemplate": {"spec": {"containers": [{"name": "trainer", "resources": resources}]}},
    }
    verdict = admit(raw, "llm")
    assert not verdict.admitted and verdict.reason == "InvalidPodTemplate"
    assert message in verdict.message, verdict.message


def test_trainer_env_names_reads_only_the_training_container() -> None:
    template = {
        "spec": {
            "containers": [
                {"name": "sidecar", "env": [{"name": "NCCL_DEBUG", "value": "INFO"}]},
                {"name": "trainer", "env": [{"name": "A", "value": "1"}], "envFrom": [{"configMapRef": {"name": "c"}}]},
            ]
        }
    }
    assert pod_template.trainer_env_names(template) == {"A"}
    assert pod_template.trainer_env_names(None) == set() == pod_template.trainer_env_names({"metadata": {}})
