"""spec.podTemplate: a platform's pod fields pass through under the operator's own; owned fields are refused with
the field and the fix; hostPath volumes only when the operator allows them."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from pod_security import violations

from zerotrain.manifest import parse_spec
from zerotrain.operator.children import builders, supporting
from zerotrain.operator.children.job_ref import JobRef
from zerotrain.operator.controller.admission import admit

JOB = JobRef("llm", "team-a", "uid-1")
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "nlp"}, "annotations": {"cost-center": "42"}},
    "spec": {
        "serviceAccountName": "trainer-sa",
        "imagePullSecrets": [{"name": "registry"}],
        "runtimeClassName": "nvidia",
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]
                }
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"team": "nlp"}},
            }
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "training"},
        "initContainers": [{"name": "fetch", "image": "busybox:1", "command": ["true"]}],
        "containers": [
            {
                "name": "trainer",
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                "envFrom": [{"configMapRef": {"name": "site-env"}}],
                "volumeMounts": [{"name": "datasets", "mountPath": "/data", "readOnly": True}],
            },
            {"name": "log-shipper", "image": "fluent-bit:3", "args": ["--quiet"]},
        ],
        "volumes": [{"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets"}}],
    },
}


def spec(**extra: Any) -> Any:
    return parse_spec({"image": "runtime:1", "entrypoint": "pkg.mod:build", "replicas": 2, **extra})


def test_the_template_passes_through_under_the_operators_fields() -> None:
    s = spec(podTemplate=TEMPLATE, scheduling={"nodeSelector": {"arch": "amd64"}})
    plain = builders.build_pod(JOB, spec(scheduling={"nodeSelector": {"arch": "amd64"}}), replica=1, gang=0)
    pod = builders.build_pod(JOB, s, replica=1, gang=0)
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    md, ps = pod["metadata"], pod["spec"]
    assert md["labels"]["team"] == "nlp" and md["annotations"] == {"cost-center": "42", "zerotrain.dev/round": "0"}
    assert md["labels"].items() >= plain["metadata"]["labels"].items()
    for key in (
        "serviceAccountName",
        "imagePullSecrets",
        "runtimeClassName",
        "affinity",
        "topologySpreadConstraints",
    ):
        assert ps[key] == TEMPLATE["spec"][key], key
    (init,) = ps["initContainers"]
    assert init.items() >= TEMPLATE["spec"]["initContainers"][0].items()
    assert init["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert ps["nodeSelector"] == {"pool": "training", "arch": "amd64"}
    assert ps["tolerations"] == TEMPLATE["spec"]["tolerations"]
    assert [c["name"] for c in ps["containers"]] == ["trainer", "log-shipper"]
    trainer, mine = ps["containers"][0], plain["spec"]["containers"][0]
    for key in ("image", "command", "ports", "securityContext"):
        assert trainer[key] == mine[key], key
    assert trainer["env"][: len(mine["env"])] == mine["env"] and trainer["env"][-1]["name"] == "HF_TOKEN"
    assert trainer["envFrom"] == [{"configMapRef": {"name": "site-env"}}]
    assert trainer["volumeMounts"][-1]["mountPath"] == "/data"
    assert [v["name"] for v in ps["volumes"]][-1] == "datasets" and len(ps["volumes"]) == len(
        plain["spec"]["volumes"]
    ) + 1
    for key in ("restartPolicy", "hostname", "subdomain"):
        assert ps[key] == plain["spec"][key]
    assert violations(pod) == [], "the template keeps the restricted defaults it does not override"


def test_status_reports_run_as_the_templates_service_account() -> None:
    objs = supporting.build_supporting(JOB, spec(podTemplate=TEMPLATE))
    (binding,) = [o for o in objs if o["kind"] == "RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer-sa", "namespace": "team-a"}]


def test_a_template_may_relax_pod_security_explicitly() -> None:
    template = {"spec": {"securityContext": {"runAsNonRoot": False, "runAsUser": 0}}}
    pod = builders.build_pod(JOB, spec(podTemplate=template), replica=0, gang=0)
    assert pod["spec"]["securityContext"]["runAsUser"] == 0
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "trainer: runAsUser 0" in violations(pod)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            {"spec": {"containers": [{"name": "trainer", "image": "other:2"}]}},
            "spec.podTemplate.spec.containers[trainer].image: set by the operator from spec.image",
        ),
        (
            {"spec": {"containers": [{"name": "trainer", "command": ["bash"]}]}},
            "spec.podTemplate.spec.containers[trainer].command: set by the operator",
        ),
        (
            {"spec": {"containers": [{"name": "trainer", "env": [{"name": "WORLD_SIZE", "value": "8"}]}]}},
            "spec.podTemplate.spec.containers[trainer].env[WORLD_SIZE]: set by the operator",
        ),
        ({"spec": {"restartPolicy": "Always"}}, "spec.podTemplate.spec.restartPolicy: set by the operator"),
        (
            {"spec": {"schedulerName": "other"}, "x": 1},
            "spec.podTemplate.spec.schedulerName: got 'other' but spec.scheduling.schedulerName gives 'volcano'",
        ),
        (
            {"spec": {"terminationGracePeriodSeconds": 30}},
            "spec.podTemplate.spec.terminationGracePeriodSeconds: got 30 but spec.checkpoint.terminationBudgetSeconds "
            "(plus 15 s) gives 135",
        ),
        ({"metadata": {"labels": {"zerotrain.dev/job": "x"}}}, "'zerotrain.dev/job' is the operator's label"),
        (
            {"spec": {"volumes": [{"name": "zerotrain-shm", "emptyDir": {}}]}},
            "spec.podTemplate.spec.volumes[zerotrain-shm]: the name is taken",
        ),
        (
            {"spec": {"volumes": [{"name": "node", "hostPath": {"path": "/"}}]}},
            "spec.podTemplate.spec.volumes[node].hostPath: this operator does not allow hostPath volumes",
        ),
    ],
)
def test_owned_fields_are_refused_naming_field_and_fix(template: dict[str, Any], message: str) -> None:
    template.pop("x", None)
    raw = {
        "image": "runtime:1",
        "entrypoint": "pkg.mod:build",
        "podTemplate": template,
        "scheduling": {"gang": "volcano"},
    }
    verdict = admit(raw, "llm")
    assert not verdict.admitted and verdict.reason == "InvalidPodTemplate"
    assert message in verdict.message, verdict.message


def test_host_path_volumes_only_when_the_operator_allows_them() -> None:
    raw = {
        "image": "runtime:1",
        "entrypoint": "pkg.mod:build",
        "volumes": [{"name": "scratch", "hostPath": {"path": "/mnt/nvme"}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }
    refused = admit(raw, "llm")
    assert refused.reason == "InvalidPodTemplate"
    assert "spec.volumes[scratch].hostPath: this operator does not allow hostPath volumes" in refused.message
    assert "operator.allowHostPath" in refused.message
    assert admit(raw, "llm", allow_host_path=True).admitted
