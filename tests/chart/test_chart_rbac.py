"""Least privilege: the chart grants exactly the API calls the operator makes (operator.client.api_calls.API_CALLS)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from chart_util import NAMESPACE, Obj, by_kind, one, render

from zerotrain.operator.children import builders, supporting
from zerotrain.operator.client.api_calls import API_CALLS, LEADER_CALLS, PLURALS, ApiCall
from zerotrain.spec import KIND, PLURAL, ZeroTrainingJobSpec

PODGROUP_GROUPS = {"coscheduling": "scheduling.x-k8s.io", "volcano": "scheduling.volcano.sh"}
# Resources a namespaced Role cannot grant; namespaced mode would need a ClusterRole for any of them.
CLUSTER_SCOPED = {"namespaces", "nodes", "customresourcedefinitions", "clusterkopfpeerings", "persistentvolumes"}


def granted(role: Obj) -> set[ApiCall]:
    """Every (group, resource, verb) a Role or ClusterRole allows; wildcards and name restrictions are refused."""
    calls: set[ApiCall] = set()
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule, rule
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        calls |= {ApiCall(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return calls


def _describe(calls: set[ApiCall]) -> list[str]:
    return sorted(f"{c.verb} {c.group or 'core'}/{c.resource}" for c in calls)


def _assert_exact(role: Obj, expected: set[ApiCall]) -> None:
    grants = granted(role)
    missing, extra = expected - grants, grants - expected
    assert not missing, f"{role['kind']} lacks calls the operator makes: {_describe(missing)}"
    assert not extra, f"{role['kind']} grants more than the operator uses: {_describe(extra)}"


def test_api_calls_are_declared() -> None:
    assert API_CALLS, "zerotrain.operator.client.api_calls.API_CALLS is empty"
    assert all(isinstance(c, ApiCall) for c in API_CALLS)


def test_cluster_role_grants_exactly_the_api_calls() -> None:
    objects = render()
    _assert_exact(one(objects, "ClusterRole"), set(API_CALLS))
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": one(objects, "ClusterRole")["metadata"]["name"],
    }
    sa = one(objects, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_namespaced_roles_grant_exactly_the_api_calls() -> None:
    assert not {c.resource for c in API_CALLS} & CLUSTER_SCOPED, "namespaced mode needs a ClusterRole for these"
    objects = render({"operator": {"scope": "namespaced", "watchNamespaces": ["team-a", "team-b"]}})
    roles = [r for r in by_kind(objects, "Role") if not r["metadata"]["name"].endswith("-leader-election")]
    assert len(roles) == 2
    for role in roles:
        _assert_exact(role, set(API_CALLS))


@pytest.mark.parametrize("disabled", sorted(PODGROUP_GROUPS))
def test_gang_scheduling_grants_can_be_dropped(disabled: str) -> None:
    values: dict[str, Any] = {"rbac": {"gangScheduling": {disabled: False}}}
    expected = {c for c in API_CALLS if not (c.resource == "podgroups" and c.group == PODGROUP_GROUPS[disabled])}
    assert expected != set(API_CALLS), f"API_CALLS has no {PODGROUP_GROUPS[disabled]} podgroups to drop"
    _assert_exact(one(render(values), "ClusterRole"), expected)


def test_kueue_grants_can_be_dropped() -> None:
    """rbac.kueue (values.yaml says how a job joins a queue): without it, no grant on kueue.x-k8s.io."""
    kueue_calls = {c for c in API_CALLS if c.group == "kueue.x-k8s.io"}
    assert {c.resource for c in kueue_calls} == {"localqueues", "workloads"}, kueue_calls
    _assert_exact(one(render({"rbac": {"kueue": False}}), "ClusterRole"), set(API_CALLS) - kueue_calls)


def test_rbac_create_false_renders_no_rbac() -> None:
    kinds = {o["kind"] for o in render({"rbac": {"create": False}})}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def _every_child() -> list[Obj]:
    """What the builders make for jobs of every gang mode, with and without a checkpoint claim, and an Event."""
    job = builders.JobRef("llm", "team-a", "uid-1")
    out: list[Obj] = []
    for gang in ("none", "coscheduling", "volcano"):
        for claim in (None, "ckpt"):
            spec = ZeroTrainingJobSpec.model_validate(
                {
                    "image": "img:1",
                    "entrypoint": "pkg.mod:fn",
                    "replicas": 2,
                    "scheduling": {"gang": gang},
                    "checkpoint": {"claimName": claim} if claim else {},
                }
            )
            out += supporting.build_supporting(job, spec) + builders.build_gang(job, spec, gang=0)
    out.append(builders.build_event(job, "Normal", "Test", "m", datetime.now(timezone.utc)))
    return out


def _group(api_version: str) -> str:
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


@pytest.mark.parametrize(
    "values",
    [{}, {"operator": {"scope": "namespaced", "watchNamespaces": ["team-a"]}}],
    ids=["cluster", "namespaced"],
)
def test_every_child_the_builders_make_is_allowed_by_the_rendered_chart(values: Obj) -> None:
    objects = render(values)
    roles = by_kind(objects, "ClusterRole") or by_kind(objects, "Role")
    grants = set().union(*(granted(r) for r in roles))
    owners = {KIND: PLURAL}
    for obj in _every_child():
        plural = PLURALS[(obj["apiVersion"], obj["kind"])]
        assert ApiCall(_group(obj["apiVersion"]), plural, "create") in grants, f"no create on {plural}"
        for ref in obj["metadata"].get("ownerReferences", []):
            if ref.get("blockOwnerDeletion"):
                need = ApiCall(_group(ref["apiVersion"]), f"{owners[ref['kind']]}/finalizers", "update")
                assert need in grants, (
                    f"{obj['kind']} {obj['metadata']['name']} sets blockOwnerDeletion: with "
                    f"OwnerReferencesPermissionEnforcement its create needs {need}"
                )


@pytest.mark.parametrize("scope", [{}, {"operator": {"scope": "namespaced", "watchNamespaces": ["team-a"]}}])
def test_leader_election_is_granted_only_its_lease_in_the_release_namespace(scope: Obj) -> None:
    objects = render(scope)
    (role,) = [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == NAMESPACE
    _assert_exact(role, set(LEADER_CALLS))
    (binding,) = [b for b in by_kind(objects, "RoleBinding") if b["metadata"]["name"].endswith("-leader-election")]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] and binding["metadata"]["namespace"] == NAMESPACE
    assert not any(c.resource == "leases" for c in API_CALLS), "leases must not be granted cluster-wide"
    off = render({**scope, "leaderElection": {"enabled": False}})
    assert not [r for r in by_kind(off, "Role") if r["metadata"]["name"].endswith("-leader-election")]
