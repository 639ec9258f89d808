"""The test harness plays the kubelet: nothing runs pods here, so tests write pod status themselves,
through the status subresource, exactly as a kubelet would report it."""

from __future__ import annotations

from typing import Any

from zerotrain.operator.children import naming
from zerotrain.operator.client.kube import Kube, path_of


def _container_status(image: str, state: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": naming.CONTAINER_NAME,
        "image": image,
        "imageID": "",
        "ready": "running" in state,
        "restartCount": 0,
        "state": state,
    }


def set_pod_phase(
    kube: Kube,
    namespace: str,
    name: str,
    phase: str,
    exit_code: int | None = None,
    reason: str | None = None,
    message: str = "",
) -> None:
    """Running, Succeeded (exit 0) or Failed (exit_code, or a pod-level reason such as Evicted)."""
    pod = kube.request("GET", path_of("v1", "pods", namespace, name))
    image = pod["spec"]["containers"][0]["image"]
    if phase == "Running":
        state: dict[str, Any] = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    else:
        code = 0 if phase == "Succeeded" else (137 if exit_code is None else exit_code)
        state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "message": message}}
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if phase == "Running" else "False"},
        ],
        "containerStatuses": [_container_status(image, state)],
    }
    if reason:
        status["reason"] = reason
        status["message"] = f"The pod was {reason.lower()}"
    kube.request(
        "PATCH", path_of("v1", "pods", namespace, name, "status"), {"status": status}, "application/merge-patch+json"
    )
