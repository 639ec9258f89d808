"""What the operator asks of the Kubernetes API server: the verbs on its resources, server-side apply and Events.

With `transport` (the connection, retries and watches) the only modules that talk to the API server. Plain dicts
in and out, so the operator's objects are exactly what the builders produced. Children are written by server-side
apply with the operator's field manager, so a field a newer build no longer sets goes from the live object; pods
are created (their spec is immutable), as is the gang's ConfigMap.

What it may call is catalogued in operator.client.api_calls, which the chart's RBAC is checked against.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import urllib3

from zerotrain.operator.client import selectors
from zerotrain.operator.client.api_calls import PLURALS
from zerotrain.operator.client.field_owners import upgrade_ops
from zerotrain.operator.client.transport import KubeError as KubeError
from zerotrain.operator.client.transport import RequestObserver as RequestObserver
from zerotrain.operator.client.transport import Transport
from zerotrain.operator.client.transport import path_of as path_of
from zerotrain.operator.client.transport import resource_of as resource_of
from zerotrain.operator.objects import Obj
from zerotrain.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)


_MERGE = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"
_APPLY = "application/apply-patch+yaml"  # JSON is YAML
FIELD_MANAGER = "zerotrain-operator"
"""The field manager of the operator's server-side applies (metadata.managedFields)."""
APPLIED_ANNOTATION = "zerotrain.dev/applied"
"""A digest of the configuration last applied to a child: the cache's copy shows whether this build is in place."""


@dataclass(frozen=True)
class Listing:
    """A LIST's objects and the resourceVersion the server listed them at (None where it gave none)."""

    items: list[Obj]
    resource_version: str | None


def is_subset(desired: Any, actual: Any) -> bool:
    """Whether every field of `desired` has the same value in `actual` (server defaults may add more)."""
    if isinstance(desired, dict):
        return isinstance(actual, dict) and all(is_subset(v, actual.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(actual, list) and len(desired) == len(actual) and all(map(is_subset, desired, actual))
    return bool(desired == actual)


def applied(obj: Obj) -> Obj:
    """`obj` with the digest of its configuration (taken without the digest itself) in an annotation."""
    md = copy.deepcopy(obj["metadata"])
    notes = md.setdefault("annotations", {})
    notes.pop(APPLIED_ANNOTATION, None)
    if not notes:
        del md["annotations"]
    bare = {**obj, "metadata": md}
    digest = hashlib.sha256(json.dumps(bare, sort_keys=True).encode()).hexdigest()[:16]
    md.setdefault("annotations", {})[APPLIED_ANNOTATION] = digest
    return bare


def _applied_hash(obj: Obj) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(APPLIED_ANNOTATION)


class Kube(Transport):
    """The API client the operator uses: `Transport`'s requests and watches, and the verbs on its resources."""

    def unbudgeted(self) -> Kube:
        """A client of its own on the same connection settings, outside this one's request budget."""
        sibling = Kube(copy.copy(self.config), self.source, self.retries, self.retry_base_seconds)
        sibling.set_user_agent(self.user_agent)
        return sibling

    # -- jobs ------------------------------------------------------------------------------------------------

    def list_jobs(self, namespace: str | None) -> Listing:
        """Every job in `namespace` (all namespaces: None)."""
        return self._list(path_of(f"{GROUP}/{VERSION}", PLURAL, namespace))

    def list_owned(self, kind: tuple[str, str], namespace: str | None) -> Listing:
        """Every object of (apiVersion, plural) `kind` the operator made in `namespace` (all: None)."""
        return self._list(path_of(kind[0], kind[1], namespace), {"labelSelector": selectors.CHILD_SELECTOR})

    def get_job(self, namespace: str, name: str) -> Obj | None:
        return self._get_or_none(path_of(f"{GROUP}/{VERSION}", PLURAL, namespace, name))

    def patch_job_status(self, namespace: str, name: str, ops: list[Obj]) -> Obj:
        """Apply a JSON patch (RFC 6902) to the job's status subresource; the job as the server stored it."""
        path = path_of(f"{GROUP}/{VERSION}", PLURAL, namespace, name, "status")
        return self.request("PATCH", path, ops, _JSON_PATCH)

    def delete_job(self, namespace: str, name: str) -> None:
        self._delete(path_of(f"{GROUP}/{VERSION}", PLURAL, namespace, name), "Background")

    # -- children --------------------------------------------------------------------------------------------

    def list_job_pods(self, namespace: str, job: str) -> Listing:
        listing = self._list(path_of("v1", "pods", namespace), {"labelSelector": f"{selectors.LABEL_JOB}={job}"})
        # Belt and braces: a server that ignores the selector must not hand us another job's pods.
        mine = [p for p in listing.items if (p.get("metadata", {}).get("labels") or {}).get(selectors.LABEL_JOB) == job]
        return Listing(mine, listing.resource_version)

    def create(self, obj: Obj) -> Obj:
        md = obj["metadata"]
        return self.request("POST", path_of(obj["apiVersion"], self._plural(obj), md.get("namespace")), obj)

    def delete_pod(self, namespace: str, name: str) -> Obj:
        """The server's answer: the pod, terminating, or a Status once it is gone ({} if it was already)."""
        return self._delete(path_of("v1", "pods", namespace, name))

    def patch_pod(self, namespace: str, name: str, patch: Obj) -> Obj:
        """Merge-patch a pod's metadata (an in-place restart's gang label and round annotation); the stored pod."""
        return self.request("PATCH", path_of("v1", "pods", namespace, name), patch, "application/merge-patch+json")

    def delete_config_map(self, namespace: str, name: str) -> None:
        self._delete(path_of("v1", "configmaps", namespace, name))

    def ensure(self, obj: Obj) -> bool:
        """Create `obj` unless it exists (never patched: for immutable objects); True if created."""
        try:
            self.create(obj)
            return True
        except KubeError as e:
            if e.status == 409:
                return False
            raise

    def apply(self, obj: Obj, known: Obj | None = None) -> Obj | None:
        """Server-side apply `obj` as the operator's field manager, forcing ownership of what it sets: the server
        creates the object or makes the fields the operator owns exactly `obj`'s, removing those an earlier build
        set and this one does not. The server's answer, or None when `known` (the caller's cached copy) shows this
        very configuration applied and still in place, so a steady pass sends nothing. Fields an older build wrote
        by create or update first move to the operator's apply (`field_owners`), so the apply can remove them too:
        before it, where `known` shows their `Update` entry; after it, where there is no copy (a kind the operator
        does not cache, such as a PodGroup) and the answer shows one, and then the apply is sent again."""
        body = applied(obj)
        if known is not None and _applied_hash(known) == _applied_hash(body) and is_subset(body, known):
            return None
        md = obj["metadata"]
        path = path_of(obj["apiVersion"], self._plural(obj), md["namespace"], md["name"])
        if known is not None:
            self._move_fields(path, known, obj)
        answer = self._send_apply(path, body)
        if known is None and self._move_fields(path, answer, obj):
            answer = self._send_apply(path, body)
        return answer

    def _send_apply(self, path: str, body: Obj) -> Obj:
        return self.request(
            "PATCH", path, json.dumps(body), _APPLY, query={"fieldManager": FIELD_MANAGER, "force": "true"}
        )

    def _move_fields(self, path: str, live: Obj, obj: Obj) -> bool:
        """Send `live`'s field migration, if it needs one; whether one was made."""
        upgrade = upgrade_ops(live, FIELD_MANAGER)
        if upgrade is None:
            return False
        try:
            self.request("PATCH", path, upgrade, _JSON_PATCH)
        except KubeError as e:
            if e.status not in (409, 422):  # changed since it was read: the apply goes on; the fields stay
                raise
            log.info("%s %s changed before its fields moved to the apply: %s", obj["kind"], obj["metadata"]["name"], e)
            return False
        return True

    def create_event(self, event: Obj) -> Obj | None:
        """Post an Event (builders.build_event); the Event as stored, or None: events are best-effort, as in kubelet,
        and never fail the caller."""
        try:
            return self.create(event)
        except (KubeError, urllib3.exceptions.HTTPError) as e:
            log.warning("could not post event %s: %s", event.get("reason"), e)
            return None

    def patch_event(self, namespace: str, name: str, patch: Obj) -> bool:
        """Count a repeat on an existing Event; False when it is gone (expired) or the patch failed."""
        try:
            self.request("PATCH", path_of("v1", "events", namespace, name), patch, _MERGE)
            return True
        except (KubeError, urllib3.exceptions.HTTPError) as e:
            if not (isinstance(e, KubeError) and e.status == 404):
                log.warning("could not count a repeat on event %s: %s", name, e)
            return False

    # -- helpers ---------------------------------------------------------------------------------------------

    def _list(self, path: str, query: dict[str, str] | None = None) -> Listing:
        data = self.request("GET", path, query=query)
        return Listing(data.get("items") or [], (data.get("metadata") or {}).get("resourceVersion"))

    def _get_or_none(self, path: str) -> Obj | None:
        try:
            return self.request("GET", path)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    def _delete(self, path: str, propagation: str | None = None) -> Obj:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation} if propagation else None
        try:
            return self.request("DELETE", path, body)
        except KubeError as e:
            if e.status != 404:  # already gone is what we wanted
                raise
            return {}

    @staticmethod
    def plural_of(obj: Obj) -> str:
        return Kube._plural(obj)

    @staticmethod
    def _plural(obj: Obj) -> str:
        key = (obj["apiVersion"], obj["kind"])
        if key not in PLURALS:
            raise ValueError(f"kube.py does not know the resource of {key}; add it to api_calls.PLURALS and API_CALLS")
        return PLURALS[key]
