"""KMock's KubernetesEmulator with the gaps kopf trips over closed (see shared/notes/kmock-emulator.md):
uids, resourceVersions (and 409 on a stale one), label selectors (and a metadata.name field selector) on list and
watch, generateName, 422 on a failed JSON-patch test, server-side apply (one field manager's view of it: see
`_apply`), plus owner-reference garbage collection and a record of the API calls served, and a request naming one
object served by looking it up (kmock compares it with every object it ever stored).

Relies on kmock 0.8 internals (`_handle`, `_serve_list`, `_serve_watch`, `_objects`, `_buses`,
`_KubernetesEmulator__get_obj`); kmock is
pinned to 0.8 in pyproject.toml for that reason.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import jsonpatch
import kmock
from kmock._internal import dsl
from kmock._internal.dicts import merge_patch_dict

from zerotrain.operator.client.api_calls import ApiCall
from zerotrain.spec import GROUP, KIND, PLURAL, VERSION

CR = f"{GROUP}/{VERSION}/{PLURAL}"
_VERBS = {
    kmock.action.LIST: "list",
    kmock.action.WATCH: "watch",
    kmock.action.FETCH: "get",
    kmock.action.CREATE: "create",
    kmock.action.DELETE: "delete",
}


@dataclass
class Fault:
    """An answer the emulator gives instead of serving a matching request, as a real server's admission,
    RBAC or quota would: e.g. Fault("create", "pods", 403, "Forbidden", "pods is forbidden: ...")."""

    verb: str
    plural: str
    status: int
    reason: str
    message: str
    hits: int = 0


@dataclass(frozen=True)
class Served:
    """One API request the emulator answered."""

    call: ApiCall
    user_agent: str
    method: str
    path: str
    query: str = ""


def labels_match(obj: dict[str, Any], selector: str | None) -> bool:
    """Equality-based label selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated."""
    if not selector:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        if "!=" in term:
            k, v = term.split("!=", 1)
            ok = labels.get(k.strip()) != v.strip()
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            ok = labels.get(k.strip()) == v.strip()
        elif term.startswith("!"):
            ok = term[1:] not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def _selected(obj: dict[str, Any], request: kmock.Request) -> bool:
    """The request's label selector, and its field selector's one field every server supports: metadata.name (a
    pod's launcher watches its own pod by it)."""
    if not labels_match(obj, request.params.get("labelSelector")):
        return False
    fields = request.params.get("fieldSelector") or ""
    for term in (t.strip() for t in fields.split(",") if t.strip()):
        key, _, value = term.replace("==", "=").partition("=")
        assert key == "metadata.name", f"the emulator filters by metadata.name alone, not {term!r}"
        if (obj.get("metadata") or {}).get("name") != value:
            return False
    return True


def _sees(view: dsl.View, request: kmock.Request) -> bool | None:
    """`request in view` for a chain of filters and priorities down to its root, or None for another view."""
    while True:
        if isinstance(view, dsl.Root):
            # The request being served was appended last: found at once, not after every request served so far.
            return any(r is request for r in reversed(view._requests))
        if type(view) is dsl.Filter:
            if not view.criteria(request):
                return False
        elif type(view) is not dsl.Priority:
            return None
        view = view._source


_view_contains = dsl.View.__contains__


def _contains(self: dsl.View, item: Any) -> bool:
    """kmock 0.8 asks whether each reaction's view holds the request by filtering every request served so far,
    O(requests) per request: 100 jobs took minutes, the emulator at 100% CPU in `Filter.__iter__`. A chain of
    filters holds a request exactly when each filter's criteria accept it, checked here once."""
    if isinstance(item, kmock.Request):
        seen = _sees(self, item)
        if seen is not None:
            return seen
    return bool(_view_contains(self, item))


dsl.View.__contains__ = _contains  # type: ignore[method-assign]


def _applied_onto(live: Any, before: Any, desired: Any) -> Any:
    """`live` with the fields `before` set and `desired` does not removed, then `desired` set over it."""
    if not (isinstance(live, dict) and isinstance(desired, dict)):
        return copy.deepcopy(desired)
    out = {k: v for k, v in live.items() if not (isinstance(before, dict) and k in before and k not in desired)}
    for k, v in desired.items():
        out[k] = _applied_onto(live.get(k), before.get(k) if isinstance(before, dict) else None, v)
    return out


def _merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that turns `old` into `new`."""
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(old.get(k), dict):
            if sub := _merge_patch(old[k], v):
                patch[k] = sub
        elif old.get(k) != v:
            patch[k] = v
    return patch


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ZeroEmulator(kmock.KubernetesEmulator):  # type: ignore[misc]
    """The emulator the operator's e2e tests run against."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.served: list[Served] = []
        self.faults: list[Fault] = []
        self._rv = itertools.count(1)
        # uid -> the store's key, so a child's owners are looked up, not found by scanning every object.
        self._uid_keys: dict[str, tuple[Any, str | None, str | None]] = {}
        # (resource, namespace, name, field manager) -> the configuration it last applied.
        self._applied: dict[tuple[Any, str | None, str | None, str], dict[str, Any]] = {}
        self.resources.load_bundled()
        self.resources[CR] = kmock.ResourceInfo(
            kind=KIND,
            namespaced=True,
            verbs={"list", "watch", "get", "patch", "create", "delete"},
            subresources={"status"},
        )

    def _KubernetesEmulator__get_obj(self, request: kmock.Request, strict: bool) -> Any:
        """kmock's lookup of the one object a GET, PATCH, PUT or DELETE names: it scanned the whole store (every
        object ever created, the deleted too), which made each such request cost the store's size; the store is
        keyed by (resource, namespace, name), and strict matching is exactly that key's equality."""
        if strict and request.resource is not None and request.name is not None:
            key = (request.resource, request.namespace, request.name)
            # kmock's ObjectsArray has no .get
            return self._objects[key] if key in self._objects else None  # noqa: SIM401
        return super()._KubernetesEmulator__get_obj(request, strict)

    def _next_rv(self) -> str:
        return str(next(self._rv))

    def _call(self, request: kmock.Request) -> ApiCall | None:
        res = request.resource
        if res is None or request.action is None or not res.plural:
            return None  # discovery (/api/v1, /apis/GROUP/VERSION) is not a resource call
        if request.action == kmock.action.UPDATE:
            verb = "update" if request.method == kmock.method.PUT else "patch"
        else:
            verb = _VERBS.get(request.action, str(request.action.value))
        plural = res.plural + (f"/{request.subresource}" if request.subresource else "")
        return ApiCall(res.group or "", plural, verb)

    def _record(self, request: kmock.Request) -> ApiCall | None:
        call = self._call(request)
        if call is not None:
            ua = request.headers.get("User-Agent", "")
            query = str(request.url.query_string)
            self.served.append(Served(call, ua, str(request.method.value), str(request.url.path), query))
        return call

    def _fault(self, call: ApiCall | None) -> None:
        for f in self.faults:
            if call is not None and (call.verb, call.resource) == (f.verb, f.plural):
                f.hits += 1
                raise kmock.KubernetesError(status=f.status, reason=f.reason, message=f.message)

    def _stamp(self, request: kmock.Request) -> None:
        data = request.data
        if request.action == kmock.action.CREATE and isinstance(data, dict):
            md = data.setdefault("metadata", {})
            if not md.get("name") and md.get("generateName"):
                md["name"] = md["generateName"] + uuid.uuid4().hex[:5]
            md.setdefault("uid", str(uuid.uuid4()))
            key = (request.resource, request.namespace or md.get("namespace"), md.get("name"))
            self._uid_keys[md["uid"]] = key
            md.setdefault("creationTimestamp", _now())
            md["resourceVersion"] = self._next_rv()
            if self._generational(request):
                md["generation"] = 1
        elif request.action == kmock.action.UPDATE and request.name is not None:
            if isinstance(data, dict):
                sent = (data.get("metadata") or {}).get("resourceVersion")
                stored = self._stored(request)
                if (
                    sent is not None
                    and stored is not None
                    and sent != stored.get("metadata", {}).get("resourceVersion")
                ):
                    raise kmock.KubernetesError(status=409, reason="Conflict", message="resourceVersion is stale")
                data.setdefault("metadata", {})["resourceVersion"] = self._next_rv()
                if self._generational(request) and stored is not None and "spec" in data:
                    spec = merge_patch_dict(stored.get("spec") or {}, data["spec"] or {})
                    if spec != (stored.get("spec") or {}):  # a real server counts each change of the spec
                        data["metadata"]["generation"] = int(stored["metadata"].get("generation") or 0) + 1
            elif isinstance(data, list):
                data.append({"op": "add", "path": "/metadata/resourceVersion", "value": self._next_rv()})

    def _apply(self, request: kmock.Request) -> None:
        """A server-side apply, turned into the create or merge patch that has its effect: the object is created
        if missing; otherwise the fields the manager applied last time and no longer applies go, and the applied
        ones are set. Lists are replaced whole, and managers are not compared (no conflicts): the operator is the
        only one applying. A real server keeps metadata.managedFields; this keeps the last configuration."""
        manager = request.params.get("fieldManager")
        if not manager:
            raise kmock.KubernetesError(status=422, reason="Invalid", message="fieldManager is required for apply")
        desired = request.data if isinstance(request.data, dict) else {}
        key = (request.resource, request.namespace, request.name)
        live = self._stored(request)
        before = self._applied.get((*key, manager)) if live is not None else None
        self._applied[(*key, manager)] = copy.deepcopy(desired)
        if live is None:
            # kmock's Request is frozen; its create path reads the action and the object from it.
            object.__setattr__(request, "action", kmock.action.CREATE)
            return
        object.__setattr__(request, "data", _merge_patch(live, _applied_onto(live, before or {}, desired)))

    @staticmethod
    def _generational(request: kmock.Request) -> bool:
        """A job (not its status): metadata.generation counts the changes of its spec, as a real server's does."""
        res = request.resource
        return res is not None and (res.group, res.plural) == (GROUP, PLURAL) and not request.subresource

    def _stored(self, request: kmock.Request) -> dict[str, Any] | None:
        key = (request.resource, request.namespace, request.name)
        if key in self._objects and not self._objects[key].deleted:
            return dict(self._objects[key].raw)
        return None

    async def _handle(self, request: kmock.Request) -> Any:
        self._fault(self._record(request))
        res = request.resource
        if res is not None and res.plural and res.version and res not in self.resources:
            # kmock stores objects of any resource; a real server serves only installed APIs (a CRD not applied).
            raise kmock.KubernetesError(status=404, reason="NotFound", message="404 page not found")
        owner_uid = None
        if request.resource is not None:
            if request.method == kmock.method.PATCH and "apply-patch" in request.headers.get("Content-Type", ""):
                self._apply(request)
            self._stamp(request)
            if request.action in (kmock.action.DELETE, kmock.action.UPDATE) and request.name is not None:
                owner_uid = ((self._stored(request) or {}).get("metadata") or {}).get("uid")
        try:
            response = await super()._handle(request)
        except jsonpatch.JsonPatchException as e:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(e)) from e
        # Collect dependents once the owner is really gone (a DELETE, or the last finalizer removed).
        if owner_uid and self._stored(request) is None:
            await self._collect_garbage({owner_uid})
        elif request.action == kmock.action.CREATE and isinstance(request.data, dict):
            # A child created after its owner was deleted (a reconcile racing the deletion) is collected too.
            owners = {r.get("uid") for r in request.data.get("metadata", {}).get("ownerReferences") or []}
            if owners and not any(self._live(uid) for uid in owners):
                await self._collect_garbage(owners)
        return response

    def _live(self, uid: str | None) -> bool:
        key = self._uid_keys.get(uid or "")
        obj = self._objects[key] if key is not None and key in self._objects else None
        if obj is not None and not obj.deleted and obj.get("metadata", {}).get("uid") == uid:
            return True
        # Not created through this emulator (put in its store directly): look for it.
        return any(o.get("metadata", {}).get("uid") == uid for o in self._objects.values() if not o.deleted)

    async def _collect_garbage(self, owner_uids: set[str]) -> None:
        """What the kube-controller-manager's garbage collector does for background deletion."""
        async with self._lock:
            doomed = [
                (key, obj)
                for key, obj in self._objects.items()
                if not obj.deleted
                and any(r.get("uid") in owner_uids for r in (obj.get("metadata", {}).get("ownerReferences") or []))
            ]
            for (resource, _, _), obj in doomed:
                raw = obj.raw
                obj.delete()
                await self._buses[resource].put({"type": "DELETED", "object": raw})

    async def _serve_list(self, request: kmock.Request) -> Any:
        result = await super()._serve_list(request)
        result["items"] = [o for o in result["items"] if _selected(o, request)]
        result["metadata"]["resourceVersion"] = self._next_rv()
        return result

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        async for ev in super()._serve_watch(request):
            if isinstance(ev, dict) and not _selected(ev.get("object") or {}, request):
                continue
            yield ev

    def watchers(self, group: str, version: str, plural: str) -> int:
        """How many watch streams are subscribed to a resource (kopf's readiness, gotcha G3)."""
        return int(self._buses[kmock.resource(group, version, plural)].consumer_count)
