"""Every refused child write reaches the job: a ChildWriteFailed condition with a specific reason, the server's
message and the fix, one Warning Event however often the operator retries, and the condition clears once the
cause is gone. A real server (ZEROTRAIN_E2E_KUBECONFIG) refuses for real where a test can make it: a ResourceQuota
that admits no pod, a PodGroup CRD that is not installed; the emulator also plays RBAC and admission refusals."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import kmock
import pytest

from zerotrain.operator.client.kube import Kube, KubeError, path_of
from zerotrain.spec import PLURAL

from .cluster import Cluster, until_async
from .conftest import Operator
from .emulator import Fault
from .test_operator_e2e import JOBS, NO_NODE, call, condition, job_manifest, pods, wait_pods, wait_status

QUOTA = "zerotrain-e2e-no-pods"
PODGROUPS = "scheduling.x-k8s.io/v1alpha1/podgroups"
PODGROUP_CRD = "podgroups.scheduling.x-k8s.io"


@dataclass
class Refusal:
    """A refusal in force: what the server's message says, and how often it was made (the emulator counts; a real
    server does not say, so None)."""

    says: str
    hits: Fault | None = None


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
    pytest.param(None, "ResourceNotInstalled", "install its CRD", id="not-installed"),
]
# Refusals a real server cannot be made to give from a test.
REAL_SKIPS = {
    "Forbidden": "the in-thread operator runs with the kubeconfig's credentials, whose grants a test cannot take away",
    "Invalid": "no pod is known that the API server refuses and the CRD's schema and the operator's admission pass",
}


def warnings_about(kube: Kube, ns: str, job: str, reason: str) -> list[dict[str, Any]]:
    events = kube.request("GET", path_of("v1", "events", ns)).get("items") or []
    return [
        e
        for e in events
        if e.get("involvedObject", {}).get("name") == job and e.get("reason") == reason and e.get("type") == "Warning"
    ]


def no_pods_quota(kube: Kube, ns: str) -> None:
    """A ResourceQuota admitting no pod, once the quota controller has counted it (before, admission would refuse
    with "status unknown for quota", another message)."""
    body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": QUOTA}, "spec": {"hard": {"pods": "0"}}}
    kube.request("POST", path_of("v1", "resourcequotas", ns), body)
    for _ in range(300):
        if (kube.request("GET", path_of("v1", "resourcequotas", ns, QUOTA)).get("status") or {}).get("hard"):
            return
        time.sleep(0.1)
    raise AssertionError(f"ResourceQuota {QUOTA} was not counted within 30 s (is kube-controller-manager running?)")


def podgroup_crd() -> dict[str, Any]:
    """scheduler-plugins' PodGroup API, as far as the operator uses it."""
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": PODGROUP_CRD},
        "spec": {
            "group": "scheduling.x-k8s.io",
            "scope": "Namespaced",
            "names": {"plural": "podgroups", "singular": "podgroup", "kind": "PodGroup"},
            "versions": [{"name": "v1alpha1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }


def install_podgroups(cluster: Cluster, kube: Kube) -> None:
    if cluster.emulator is not None:
        verbs = {"list", "watch", "get", "patch", "create", "delete"}
        cluster.emulator.resources[PODGROUPS] = kmock.ResourceInfo(kind="PodGroup", namespaced=True, verbs=verbs)
        return
    kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", podgroup_crd())


def podgroups_installed(cluster: Cluster, kube: Kube) -> bool:
    if cluster.emulator is not None:
        return PODGROUPS in cluster.emulator.resources
    try:
        kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PODGROUP_CRD}")
        return True
    except KubeError as e:
        if e.status == 404:
            return False
        raise


@contextlib.asynccontextmanager
async def refused(cluster: Cluster, kube: Kube, fault: Fault | None, reason: str) -> AsyncIterator[Refusal]:
    """Make the server refuse the job's children until the block's end asks to lift it (`lift`)."""
    ns = cluster.namespace
    if reason == "ResourceNotInstalled":
        if await call(podgroups_installed, cluster, kube):
            pytest.skip(f"the cluster has {PODGROUP_CRD} installed: it cannot refuse PodGroups as not installed")
        yield Refusal("404")
        return
    if cluster.emulator is not None:
        assert fault is not None
        cluster.emulator.faults.append(fault)
        yield Refusal(fault.message, fault)
        return
    if reason in REAL_SKIPS:
        pytest.skip(REAL_SKIPS[reason])
    await call(no_pods_quota, kube, ns)
    yield Refusal(f"exceeded quota: {QUOTA}")


async def lift(cluster: Cluster, kube: Kube, refusal: Refusal, reason: str) -> None:
    """What the admin does: fixes RBAC, the quota or the template, or installs the CRD."""
    if reason == "ResourceNotInstalled":
        await call(install_podgroups, cluster, kube)
    elif cluster.emulator is not None:
        assert refusal.hits is not None
        cluster.emulator.faults.remove(refusal.hits)
    else:
        await call(kube.request, "DELETE", path_of("v1", "resourcequotas", cluster.namespace, QUOTA))


def manifest(name: str, ns: str, reason: str) -> dict[str, Any]:
    if reason == "ResourceNotInstalled":  # the PodGroup comes first: no pod is created while it is refused
        return job_manifest(name, ns, scheduling={**NO_NODE, "gang": "coscheduling"})
    return job_manifest(name, ns)


@pytest.mark.parametrize(("fault", "reason", "fix"), CASES)
async def test_a_refused_write_shows_in_status_once_and_clears(
    cluster: Cluster, operator: Operator, kube: Kube, fault: Fault | None, reason: str, fix: str
) -> None:
    ns, name = cluster.namespace, f"refused-{reason.lower()}"
    async with refused(cluster, kube, fault, reason) as refusal:
        await call(kube.request, "POST", path_of(JOBS, PLURAL, ns), manifest(name, ns, reason))
        job = await wait_status(
            kube, ns, name, lambda s: any(c["type"] == "ChildWriteFailed" for c in s.get("conditions", [])), 30
        )
        cond = condition(job, "ChildWriteFailed")
        assert cond["status"] == "True" and cond["reason"] == reason, cond
        assert refusal.says in cond["message"] and fix in cond["message"], cond["message"]
        # The operator keeps retrying with back-off (0.2 s, 0.4 s, ... at most 1 s here), and says it once.
        if refusal.hits is not None:
            await until_async(lambda: refusal.hits is not None and refusal.hits.hits >= 3, timeout=10)
        else:
            await asyncio.sleep(3)
        assert len(await call(warnings_about, kube, ns, name, reason)) == 1
        assert not await call(pods, kube, ns, name)
        await lift(cluster, kube, refusal, reason)
    try:
        await wait_pods(kube, ns, name, 2)
        job = await wait_status(
            kube, ns, name, lambda s: condition({"status": s}, "ChildWriteFailed")["status"] == "False", 30
        )
        assert condition(job, "ChildWriteFailed")["reason"] == "ChildrenWritten"
    finally:
        if reason == "ResourceNotInstalled" and cluster.emulator is None:
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PODGROUP_CRD}"
            await call(kube.request, "DELETE", path)
