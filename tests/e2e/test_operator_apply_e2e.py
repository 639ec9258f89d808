"""Children are written by server-side apply with the operator's field manager: a field that an earlier build of the
operator set and this one does not goes from the live object at the next apply (a merge patch left it there)."""

from __future__ import annotations

import copy
import os
import time
from typing import Any

import pytest
from budget import budget

from zerotrain.operator.children import builders, naming, supporting
from zerotrain.operator.client.kube import FIELD_MANAGER, Kube, path_of
from zerotrain.spec import PLURAL

from .cluster import KUBECONFIG_ENV, Cluster, until_async
from .conftest import Operator
from .test_operator_e2e import JOBS, call, get_job, start_job

OLD = "zerotrain.dev/older-build"


def service(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return kube.request("GET", path_of("v1", "services", ns, name))


NO_MANAGED_FIELDS = "the emulator keeps no managedFields: there is no Update entry to move (a real server has one)"


def with_older_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` (a Service) as an older build wrote it: with a label and a sessionAffinity this build does not set."""
    older = copy.deepcopy(obj)
    older["metadata"]["labels"][OLD] = "yes"
    older["spec"]["sessionAffinity"] = "ClientIP"
    return older


def unowned_service(ns: str, name: str) -> dict[str, Any]:
    """The Service the builders make for job `name`, with no owner (one that does not exist would have the garbage
    collector delete it)."""
    svc = supporting.build_service(builders.JobRef(name, ns, "uid-none"))
    del svc["metadata"]["ownerReferences"]
    return svc


async def post_as_older_build(kube: Kube, obj: dict[str, Any]) -> None:
    """POST `obj` with the older build's fields, as an operator from before server-side apply did: under its user
    agent, so the server records them in an `Update` entry of the operator's manager."""
    agent = kube.user_agent
    kube.set_user_agent(f"{naming.MANAGER}/0.1.0")
    try:
        await call(kube.create, with_older_fields(obj))
    finally:
        kube.set_user_agent(agent)


def field_entries(obj: dict[str, Any]) -> list[tuple[str | None, str | None]]:
    """(manager, operation) of each managedFields entry."""
    return [(m.get("manager"), m.get("operation")) for m in obj["metadata"].get("managedFields") or []]


async def edit_spec_until_older_fields_go(kube: Kube, ns: str, name: str) -> None:
    """Edit the job's spec (the operator applies its children again) until the older build's label and
    sessionAffinity leave its Service. The test plays the older build while this one runs, so the pass an edit
    starts may come before the operator's watch has brought it the older build's write: its cache then shows its
    own configuration in place and it sends nothing (as it must on a steady pass). A real upgrade has no such race:
    the new build's first pass starts from a LIST. So the edit is made again until a pass has seen the write."""

    def older_fields_gone() -> bool:
        now = service(kube, ns, name)
        return OLD not in now["metadata"].get("labels", {}) and now["spec"].get("sessionAffinity") != "ClientIP"

    deadline = time.monotonic() + budget(30)
    edit = 0
    while True:
        edit += 1
        patch = {"spec": {"env": [{"name": "EDITED", "value": str(edit)}]}}
        await call(kube.request, "PATCH", path_of(JOBS, PLURAL, ns, name), patch, "application/merge-patch+json")
        try:
            await until_async(older_fields_gone, timeout=3.0)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


async def test_a_field_an_older_build_applied_goes_at_the_next_apply(
    cluster: Cluster, operator: Operator, kube: Kube
) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "applied", replicas=1)
    job = await call(get_job, kube, ns, "applied")
    assert job is not None
    older = with_older_fields(supporting.build_service(builders.JobRef.from_body(job)))
    await call(kube.apply, older)  # what an older operator build applied, as the same field manager
    live = await call(service, kube, ns, "applied")
    assert live["metadata"]["labels"][OLD] == "yes" and live["spec"]["sessionAffinity"] == "ClientIP"
    managers = {m.get("manager") for m in live["metadata"].get("managedFields") or []}
    assert cluster.emulator is not None or FIELD_MANAGER in managers, managers

    await edit_spec_until_older_fields_go(kube, ns, "applied")  # this build applies again
    now = await call(service, kube, ns, "applied")
    assert now["spec"]["clusterIP"] == "None" and now["metadata"]["labels"]["zerotrain.dev/job"] == "applied"


async def test_a_field_an_older_build_created_by_post_goes_once_the_apply_owns_it(
    cluster: Cluster, operator: Operator, kube: Kube
) -> None:
    """Before server-side apply the operator created its children by POST: their fields belong to an `Update` entry
    of managedFields, which a forced apply leaves alone. The operator moves them under its apply first, so a field
    the builders no longer set goes here too."""
    if cluster.emulator is not None:
        pytest.skip(NO_MANAGED_FIELDS)
    ns = cluster.namespace
    await post_as_older_build(kube, unowned_service(ns, "posted"))
    await start_job(kube, ns, "posted", replicas=1)
    await edit_spec_until_older_fields_go(kube, ns, "posted")  # the apply runs, the cache has it
    now = await call(service, kube, ns, "posted")
    entries = field_entries(now)
    assert (FIELD_MANAGER, "Update") not in entries and (FIELD_MANAGER, "Apply") in entries, entries
    assert now["metadata"]["ownerReferences"][0]["name"] == "posted"


@pytest.mark.skipif(not os.environ.get(KUBECONFIG_ENV), reason=NO_MANAGED_FIELDS)
async def test_with_no_cached_copy_an_older_builds_fields_move_after_the_apply(cluster: Cluster, kube: Kube) -> None:
    """A kind the operator does not cache (a PodGroup) has no copy to show an older build's `Update` entry before the
    apply: the apply's answer shows it, the fields move, and the apply goes again. (The client alone: on the emulator
    the cluster fixture also checks the operator's own requests, and no operator runs here.)"""
    current = unowned_service(cluster.namespace, "uncached")
    await post_as_older_build(kube, current)
    answer = await call(kube.apply, current)  # no copy: what the operator's client does for a PodGroup
    assert answer is not None
    assert OLD not in answer["metadata"]["labels"] and answer["spec"]["sessionAffinity"] == "None"
    entries = field_entries(answer)
    assert (FIELD_MANAGER, "Update") not in entries and (FIELD_MANAGER, "Apply") in entries, entries
