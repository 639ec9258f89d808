"""The test harness plays the kubelet: nothing runs pods here, so tests write pod status themselves,
through the status subresource, exactly as a kubelet would report it."""

from __future__ import annotations

from datetime import datetime, timezone
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
    at: datetime | None = None,
) -> None:
    """Running, Succeeded (exit 0) or Failed (exit_code, or a pod-level reason such as Evicted); `at`: when the
    container started or ended (its startedAt or finishedAt, in whole seconds as a kubelet writes them)."""
    pod = kube.request("GET", path_of("v1", "pods", namespace, name))
    image = pod["spec"]["containers"][0]["image"]
    when = (at or datetime(2026, 1, 1, tzinfo=timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if phase == "Running":
        state: dict[str, Any] = {"running": {"startedAt": when}}
    else:
        code = 0 if phase == "Succeeded" else (137 if exit_code is None else exit_code)
        ended = "Completed" if code == 0 else "Error"  # the container's reason; `reason` is the pod's
        state = {"terminated": {"exitCode": code, "reason": ended, "message": message}}
        if at is not None:
            state["terminated"]["finishedAt"] = when
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
