"""Every refused child write reaches the job: a ChildWriteFailed condition with a specific reason, the server's
message and the fix, one Warning Event however often the operator retries, and the condition clears once the
cause is gone. The emulator answers as a real server's RBAC, quota, admission or missing CRD would."""

from __future__ import annotations

from typing import Any

import pytest

from zerotrain.operator.kube import Kube, path_of
from zerotrain.spec import PLURAL

from .cluster import Cluster, until_async
from .conftest import Operator
from .emulator import Fault
from .test_operator_e2e import JOBS, call, condition, job_manifest, pods, wait_pods, wait_status

CASES = [
    pytest.param(
        Fault(
            "create",
            "pods",
            403,
            "Forbidden",
            'pods "x" is forbidden: User "system:serviceaccount:zt:op" '
            'cannot create resource "pods" in API group "" in the namespace "team-a"',
        ),
        "Forbidden",
        "grant the operator's ServiceAccount",
        id="forbidden",
    ),
    pytest.param(
        Fault(
            "create",
            "pods",
            403,
            "Forbidden",
            'pods "x" is forbidden: exceeded quota: gpus, requested: '
            "requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=4",
        ),
        "QuotaExceeded",
        "raise the namespace's ResourceQuota",
        id="quota",
    ),
    pytest.param(
        Fault("create", "pods", 422, "Invalid", 'Pod "x" is invalid: spec.containers[0].image: Required value'),
        "Invalid",
        "fix the field the server names",
        id="invalid",
    ),
    pytest.param(
        Fault("create", "services", 404, "NotFound", "the server could not find the requested resource"),
        "ResourceNotInstalled",
        "install its CRD",
        id="not-installed",
    ),
]


def warnings_about(kube: Kube, ns: str, job: str, reason: str) -> list[dict[str, Any]]:
    events = kube.request("GET", path_of("v1", "events", ns)).get("items") or []
    return [
        e
        for e in events
        if e.get("involvedObject", {}).get("name") == job and e.get("reason") == reason and e.get("type") == "Warning"
    ]


@pytest.mark.parametrize(("fault", "reason", "fix"), CASES)
async def test_a_refused_write_shows_in_status_once_and_clears(
    cluster: Cluster, operator: Operator, kube: Kube, fault: Fault, reason: str, fix: str
) -> None:
    if cluster.emulator is None:
        pytest.skip("makes the API server refuse writes: needs the emulator's fault injection")
    ns, name = cluster.namespace, f"refused-{reason.lower()}"
    cluster.emulator.faults.append(fault)
    await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), job_manifest(name, ns))
    job = await wait_status(
        kube, ns, name, lambda s: any(c["type"] == "ChildWriteFailed" for c in s.get("conditions", []))
    )
    cond = condition(job, "ChildWriteFailed")
    assert cond["status"] == "True" and cond["reason"] == reason, cond
    assert fault.message in cond["message"] and fix in cond["message"], cond["message"]
    # The operator keeps retrying with back-off (0.2 s, 0.4 s, ...), and says it once.
    await until_async(lambda: fault.hits >= 3, timeout=10)
    assert len(await call(warnings_about, kube, ns, name, reason)) == 1
    assert not await call(pods, kube, ns, name)
    cluster.emulator.faults.remove(fault)  # the admin fixes RBAC, the quota, the template, installs the CRD
    await wait_pods(kube, ns, name, 2)
    job = await wait_status(kube, ns, name, lambda s: condition({"status": s}, "ChildWriteFailed")["status"] == "False")
    assert condition(job, "ChildWriteFailed")["reason"] == "ChildrenWritten"
