"""A job's ServiceAccount, Role and Service are applied at once (on the pod-create workers), not one round trip after
another, its RoleBinding once the Role exists, and the refusal reported is the first in the builders' order whatever
order the answers came in. A gang's ConfigMap goes with the first wave, its pods with the RoleBinding."""

from __future__ import annotations

import threading
from typing import Any

import kubernetes
import pytest

from zerotrain.job_status import Phase, ZeroTrainingJobStatus
from zerotrain.manifest import parse_spec
from zerotrain.operator.children import builders
from zerotrain.operator.children import supporting as supporting_objects
from zerotrain.operator.client.kube import Kube, KubeError
from zerotrain.operator.controller.api_failure import ChildWriteError
from zerotrain.operator.controller.reconcile import Reconciler
from zerotrain.operator.controller.status import Decision
from zerotrain.operator.settings import OperatorSettings

JOB = builders.JobRef("llm", "team-a", "uid-1")


def supporting() -> list[dict[str, Any]]:
    return supporting_objects.build_supporting(JOB, parse_spec({"image": "img:1", "entrypoint": "pkg.mod:build"}))


def reconciler() -> Reconciler:
    cfg = kubernetes.client.Configuration()
    cfg.host = "http://127.0.0.1:1"  # never called: the client's apply is a stand-in
    return Reconciler(kube=Kube(cfg), settings=OperatorSettings())


def apply_supporting(r: Reconciler, objs: list[dict[str, Any]]) -> None:
    """The supporting children's two waves, as a pass sends them."""
    for wave in r.writer._supporting_writes(objs):
        r.writer._on_pool(JOB, wave)


def test_the_supporting_objects_are_in_flight_at_once_and_the_rolebinding_after_its_role() -> None:
    objs = supporting()
    first = [o for o in objs if o["kind"] != "RoleBinding"]
    assert {o["kind"] for o in first} >= {"ServiceAccount", "Role", "Service"} and len(first) < len(objs)
    arrived = threading.Barrier(len(first), timeout=5)  # one after another, the first would wait here alone
    answered: list[str] = []
    r = reconciler()

    def apply(obj: dict[str, Any]) -> None:
        if obj["kind"] == "RoleBinding":
            # A real server refuses a binding to a Role it does not have (without `bind`, it checks the Role).
            assert "Role" in answered, "the RoleBinding was applied before its Role existed"
        else:
            arrived.wait()
        answered.append(obj["kind"])

    r.client.apply = apply  # type: ignore[method-assign]
    try:
        apply_supporting(r, objs)
    finally:
        r.close()
    assert sorted(answered) == sorted(o["kind"] for o in objs)


def test_the_first_refusal_in_order_is_reported_after_every_write_of_its_wave_was_tried() -> None:
    objs = supporting()
    first, last = objs[0], objs[-1]
    last_refused = threading.Event()
    tried: list[str] = []
    r = reconciler()

    def apply(obj: dict[str, Any]) -> None:
        tried.append(obj["kind"])
        if obj is last:
            last_refused.set()
            raise KubeError(403, "Forbidden", "services is forbidden")
        if obj is first:
            last_refused.wait(5)  # answered after the later refusal
            raise KubeError(403, "Forbidden", "serviceaccounts is forbidden")

    r.client.apply = apply  # type: ignore[method-assign]
    try:
        with pytest.raises(ChildWriteError) as e:
            apply_supporting(r, objs)
    finally:
        r.close()
    assert (e.value.kind, e.value.name) == (first["kind"], first["metadata"]["name"])
    # Every write of the first wave was tried; the RoleBinding is not, its Role perhaps not there.
    assert sorted(tried) == sorted(o["kind"] for o in objs if o["kind"] != "RoleBinding")


def test_a_gang_starts_in_two_waves_its_config_with_the_account_and_its_pods_with_the_binding() -> None:
    """Each wave of a new job's first pass is a round trip: the ConfigMap needs nothing, so it goes with the
    ServiceAccount, Role and Service; the pods need the account and the ConfigMap, not the RoleBinding."""
    spec = parse_spec({"image": "img:1", "entrypoint": "pkg.mod:build", "replicas": 3})
    r = reconciler()
    waves: list[list[str]] = []
    sent: list[str] = []
    mu = threading.Lock()

    def record(obj: dict[str, Any]) -> None:
        with mu:
            sent.append(obj["kind"])

    def on_pool(job: builders.JobRef, writes: list[Any]) -> None:
        waves.append(sorted(w.obj["kind"] for w in writes))
        for w in writes:
            w.send(w.obj)

    r.client.apply = record  # type: ignore[method-assign]
    r.client.create_pod = record  # type: ignore[method-assign]
    r.client.pods = lambda ns, name: []  # type: ignore[method-assign]
    r.kube.ensure = record  # type: ignore[method-assign]
    r.writer._on_pool = on_pool  # type: ignore[method-assign]
    try:
        status = ZeroTrainingJobStatus(phase=Phase.PENDING)
        acted = r.writer.act(JOB, spec, spec, Decision(status, create_gang=True), supporting=True)
    finally:
        r.close()
    assert acted.gang_created == (3, 3)
    kinds = sorted(o["kind"] for o in supporting() if o["kind"] != "RoleBinding")
    assert waves[:2] == [sorted([*kinds, "ConfigMap"]), ["Pod", "Pod", "Pod", "RoleBinding"]]
    assert sorted(sent) == sorted([*kinds, "ConfigMap", "RoleBinding", "Pod", "Pod", "Pod"])
