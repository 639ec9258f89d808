"""Every API call the operator process makes, its own and kopf's, and the kinds it writes.

The Helm chart's ClusterRole grants exactly `API_CALLS` (the chart tests fail when the two differ), and the e2e tests
check that every request the emulator served is in the set.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerotrain.spec import GROUP, PLURAL


@dataclass(frozen=True)
class ApiCall:
    """One RBAC permission the operator uses."""

    group: str  # "" for the core group
    resource: str  # plural; subresources as "zerotrainingjobs/status"
    verb: str  # get | list | watch | create | patch | update | delete


def _calls(group: str, resource: str, *verbs: str) -> set[ApiCall]:
    return {ApiCall(group, resource, v) for v in verbs}


_RBAC = "rbac.authorization.k8s.io"
COSCHEDULING_GROUP = "scheduling.x-k8s.io"
VOLCANO_GROUP = "scheduling.volcano.sh"

API_CALLS: frozenset[ApiCall] = frozenset(
    # kopf: watches jobs (list+watch), removes the finalizer older releases left (patch).
    # The operator: fetches a job fresh before reconciling (get), writes status, deletes after the TTL.
    _calls(GROUP, PLURAL, "get", "list", "watch", "patch", "delete")
    | _calls(GROUP, f"{PLURAL}/status", "patch")
    # Never requested, but checked: OwnerReferencesPermissionEnforcement (OpenShift, hardened clusters) refuses a
    # child whose ownerReference sets blockOwnerDeletion unless its creator may update the owner's finalizers.
    | _calls(GROUP, f"{PLURAL}/finalizers", "update")
    # The operator watches the jobs' pods (client.reflector) to reconcile on each change; it creates and deletes them,
    # and patches an in-place restart's gang label and round annotation onto the pods it keeps. `get` is never
    # requested: the jobs' Role grants it to their pods (each reads its own), and RBAC lets a Role grant only what its
    # author holds.
    | _calls("", "pods", "get", "list", "watch", "create", "delete", "patch")
    # Services, ServiceAccounts, Roles and RoleBindings are watched (list+watch, client.reflector) into its cache;
    # they and the PodGroups are written by server-side apply: a patch, which also needs create where it creates the
    # object (the API server authorizes that create separately).
    | _calls("", "services", "list", "watch", "create", "patch")
    | _calls("", "serviceaccounts", "list", "watch", "create", "patch")
    | _calls(_RBAC, "roles", "list", "watch", "create", "patch")
    | _calls(_RBAC, "rolebindings", "list", "watch", "create", "patch")
    | _calls(COSCHEDULING_GROUP, "podgroups", "create", "patch")
    | _calls(VOLCANO_GROUP, "podgroups", "create", "patch")
    # One immutable ConfigMap per gang: created with the gang, the earlier gangs' listed and deleted (pods kept in
    # place keep the one they mount).
    | _calls("", "configmaps", "create", "delete")
    # A job labelled kueue.x-k8s.io/queue-name: its LocalQueue must exist before a gang is created (children.kueue).
    | _calls("kueue.x-k8s.io", "localqueues", "get")
    # A gang Kueue holds: its Workload (named as its pod group) says what it waits for.
    | _calls("kueue.x-k8s.io", "workloads", "get")
    # The operator's Events and kopf's (kopf.event / failed-handler posts); a repeat is a count on the first.
    | _calls("", "events", "create", "patch")
)

# Leader election, in the operator's own namespace only (a Role there, never cluster-wide): operator.client.leader.
LEADER_CALLS: frozenset[ApiCall] = frozenset(_calls("coordination.k8s.io", "leases", "get", "create", "patch"))

# (apiVersion, plural) of the children the operator watches into its cache besides pods (operator.client.cache).
CACHED_CHILDREN = (
    ("v1", "services"),
    ("v1", "serviceaccounts"),
    (f"{_RBAC}/v1", "roles"),
    (f"{_RBAC}/v1", "rolebindings"),
)

# (apiVersion, kind) -> plural of every kind the operator writes.
PLURALS = {
    ("v1", "Pod"): "pods",
    ("v1", "Service"): "services",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "Event"): "events",
    (f"{_RBAC}/v1", "Role"): "roles",
    (f"{_RBAC}/v1", "RoleBinding"): "rolebindings",
    (f"{COSCHEDULING_GROUP}/v1alpha1", "PodGroup"): "podgroups",
    (f"{VOLCANO_GROUP}/v1beta1", "PodGroup"): "podgroups",
}
