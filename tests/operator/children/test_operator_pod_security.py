"""Training pods pass the Pod Security Standard `restricted`, in every shape the builders make."""

from __future__ import annotations

from typing import Any

import pytest
from pod_security import violations

from zerotrain.manifest import parse_spec
from zerotrain.operator.children import builders
from zerotrain.operator.children.job_ref import JobRef

JOB = JobRef("llm", "team-a", "uid-1")


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"replicas": 4, "nprocPerNode": 8, "resources": {"gpu": 8}},
        {"checkpoint": {"claimName": "ckpt"}, "scheduling": {"gang": "volcano"}},
        {
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        },
    ],
    ids=["default", "gpus", "claim-volcano", "user-pvc"],
)
def test_training_pods_pass_restricted(extra: dict[str, Any]) -> None:
    spec = parse_spec({"image": "img:1", "entrypoint": "pkg.mod:build", **extra})
    for pod in builders.build_pods(JOB, spec, gang=0):
        assert violations(pod) == [], violations(pod)


def test_the_checker_catches_what_restricted_forbids() -> None:
    spec = parse_spec(
        {
            "image": "img:1",
            "entrypoint": "pkg.mod:build",
            "volumes": [{"name": "h", "hostPath": {"path": "/x"}}],
            "volumeMounts": [{"name": "h", "mountPath": "/x"}],
        }
    )
    pod = builders.build_pod(JOB, spec, replica=0, gang=0)
    pod["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    found = violations(pod)
    assert "hostPath volume h" in found
    assert "trainer: allowPrivilegeEscalation must be false" in found and "trainer: adds capability IPC_LOCK" in found
