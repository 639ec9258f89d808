"""Children are written by server-side apply with the operator's field manager: a field that an earlier build of the
operator set and this one does not goes from the live object at the next apply (a merge patch left it there)."""

from __future__ import annotations

from typing import Any

from zerotrain.operator.children import builders
from zerotrain.operator.client.kube import FIELD_MANAGER, Kube, path_of
from zerotrain.spec import PLURAL

from .cluster import Cluster, until_async
from .conftest import Operator
from .test_operator_e2e import JOBS, call, get_job, start_job

OLD = "zerotrain.dev/older-build"


def service(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return kube.request("GET", path_of("v1", "services", ns, name))


async def test_a_field_an_older_build_applied_goes_at_the_next_apply(
    cluster: Cluster, operator: Operator, kube: Kube
) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "applied", replicas=1)
    job = await call(get_job, kube, ns, "applied")
    assert job is not None
    older = builders.build_service(builders.JobRef.from_body(job))
    older["metadata"]["labels"][OLD] = "yes"
    older["spec"]["sessionAffinity"] = "ClientIP"
    await call(kube.apply, older)  # what an older operator build applied, as the same field manager
    live = await call(service, kube, ns, "applied")
    assert live["metadata"]["labels"][OLD] == "yes" and live["spec"]["sessionAffinity"] == "ClientIP"
    managers = {m.get("manager") for m in live["metadata"].get("managedFields") or []}
    assert cluster.emulator is not None or FIELD_MANAGER in managers, managers

    patch = {"spec": {"env": [{"name": "EDITED", "value": "1"}]}}  # a spec edit: this build applies again
    await call(kube.request, "PATCH", path_of(JOBS, PLURAL, ns, "applied"), patch, "application/merge-patch+json")

    def older_fields_gone() -> bool:
        now = service(kube, ns, "applied")
        return OLD not in now["metadata"].get("labels", {}) and now["spec"].get("sessionAffinity") != "ClientIP"

    await until_async(older_fields_gone)
    now = await call(service, kube, ns, "applied")
    assert now["spec"]["clusterIP"] == "None" and now["metadata"]["labels"]["zerotrain.dev/job"] == "applied"
