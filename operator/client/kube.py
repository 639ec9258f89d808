"""The only module that talks to the Kubernetes API server.

Plain dicts in and out through the official client's REST layer (no generated models, so the operator's
objects are exactly what the builders produced). Children are written by server-side apply with the operator's
field manager, so a field a newer build no longer sets goes from the live object; pods are created (their spec is
immutable), as is the gang's ConfigMap. Conflicts (409), throttling (429) and server errors (5xx) are retried
with exponential back-off that honours Retry-After.

What it may call is catalogued in operator.client.api_calls, which the chart's RBAC is checked against.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import kopf
import kubernetes
import urllib3

from zerotrain import __version__
from zerotrain.operator.children import naming
from zerotrain.operator.client import connection
from zerotrain.operator.client.api_calls import PLURALS
from zerotrain.operator.client.connection import ConnectionSource
from zerotrain.operator.client.field_owners import upgrade_ops
from zerotrain.operator.client.rate_limit import RequestBudget
from zerotrain.operator.objects import Obj
from zerotrain.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)


_RETRYABLE = {409, 429, 500, 502, 503, 504}
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


class KubeError(Exception):
    """An API answer that is not 2xx (after retries)."""

    def __init__(self, status: int, reason: str, message: str, method: str = "", retried: bool = False) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.method = method
        """The HTTP method refused (an apply is a GET, then a POST or a PATCH)."""
        self.retried = retried
        """The answer came to a retry: an earlier attempt may have done the work (a create that timed out)."""


def path_of(api_version: str, plural: str, namespace: str | None, name: str | None = None, sub: str = "") -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
    return path + (f"/{sub}" if sub else "")


def resource_of(path: str) -> str:
    """The resource a request path names, as RBAC and the API server's metrics spell it: `pods`, `pods/status`."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    if not rest:
        return ""
    return rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")


class RequestObserver(Protocol):
    """Told of every request the client sends (metrics.OperatorMetrics)."""

    def api_request(self, verb: str, resource: str, code: int, throttled_seconds: float) -> None: ...


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


def _decoded(raw: bytes) -> Obj:
    """An answer's body as a dict: a JSON list as its items, text that is not JSON (a proxy's "404 page not
    found") as the message."""
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {"message": raw.decode(errors="replace")[:500]}
    return data if isinstance(data, dict) else {"items": data}


class Kube:
    """A thread-safe API client (one per operator run; close it, or keep-alive sockets linger)."""

    def __init__(
        self,
        config: kubernetes.client.Configuration,
        source: ConnectionSource = ConnectionSource.EXPLICIT,
        retries: int = 5,
        retry_base_seconds: float = 0.2,
        budget: RequestBudget | None = None,
    ) -> None:
        self.config = config
        self.source = source
        self.retries = retries
        self.retry_base_seconds = retry_base_seconds
        self.budget = budget
        self.observer: RequestObserver | None = None
        """Told of each request sent (the operator's metrics); None: nobody."""
        if budget is not None:  # one pooled connection per request in flight: none opened only to be discarded
            config.connection_pool_maxsize = budget.max_in_flight
        # urllib3 would retry a GET's 429 with Retry-After itself, unseen by the metrics and the back-off here:
        # it still reconnects a dropped connection (a GET's, or any request's that was not sent), never on a status.
        config.retries = urllib3.util.Retry(
            total=3, redirect=0, status=0, respect_retry_after_header=False, raise_on_status=False
        )
        self._api = kubernetes.client.ApiClient(config)
        self._mu = threading.Lock()
        self._watches: set[urllib3.BaseHTTPResponse] = set()
        self.set_user_agent(f"{naming.MANAGER}/{__version__}")

    def unbudgeted(self) -> Kube:
        """A client of its own on the same connection settings, outside this one's request budget."""
        sibling = Kube(copy.copy(self.config), self.source, self.retries, self.retry_base_seconds)
        sibling.set_user_agent(self.user_agent)
        return sibling

    @property
    def user_agent(self) -> str:
        """Who the API server's audit log (and the e2e tests' request record) says is calling; a write without a
        field manager is recorded in managedFields under its first part."""
        return str(self._api.user_agent)

    def set_user_agent(self, agent: str) -> None:
        """Who the API server's audit log (and the e2e tests' request record) says is calling."""
        self._api.user_agent = agent

    @classmethod
    def connect(cls, kubeconfig: str | None = None, **kwargs: Any) -> Kube:
        """In-cluster service account when running in a pod, else the kubeconfig (explicit path or default).

        A UserError (one line, naming every place tried) when none loads."""
        config = kubernetes.client.Configuration()
        return cls(config, connection.load(config, kubeconfig), **kwargs)

    def close(self) -> None:
        self._api.close()

    def connection_info(self, **kwargs: Any) -> kopf.ConnectionInfo:
        """The same connection for kopf's own API calls."""
        if self.source == ConnectionSource.IN_CLUSTER:
            info = kopf.login_with_service_account(**kwargs)
            if info is not None:
                return info
        c = self.config
        auth = (c.api_key or {}).get("authorization") or (c.api_key or {}).get("BearerToken")
        scheme, token = (auth.split(" ", 1) if " " in auth else ("Bearer", auth)) if auth else (None, None)
        return kopf.ConnectionInfo(
            server=c.host,
            ca_path=c.ssl_ca_cert,
            insecure=not c.verify_ssl,
            scheme=scheme,
            token=token,
            username=c.username or None,
            password=c.password or None,
            certificate_path=c.cert_file,
            private_key_path=c.key_file,
        )

    # -- transport -----------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        retry: bool = True,
    ) -> Obj:
        """One call with retries (none with `retry=False`, e.g. a write guarded by a resourceVersion, which a retry
        would only repeat into the same conflict); returns the decoded JSON body or raises KubeError."""
        url_path = path + (f"?{urlencode(query)}" if query else "")
        delay = self.retry_base_seconds
        retries = self.retries if retry else 0
        for attempt in range(retries + 1):
            try:
                status, reason, data, retry_after = self._once(method, url_path, body, content_type)
            except urllib3.exceptions.HTTPError as e:
                status, reason, data, retry_after = 503, "Unavailable", {"message": str(e)}, None
            if 200 <= status < 300:
                return data
            # A create that meets an existing object is an answer, not a transient conflict.
            retryable = status in _RETRYABLE and not (method == "POST" and status == 409)
            if not retryable or attempt == retries:
                raise KubeError(status, reason, str(data.get("message", data)), method, retried=attempt > 0)
            wait = retry_after if retry_after is not None else delay
            log.warning("%s %s: %s %s; retry %d in %.2fs", method, path, status, reason, attempt + 1, wait)
            time.sleep(wait)
            delay *= 2
        raise AssertionError("unreachable")

    def _once(self, method: str, path: str, body: Any, content_type: str) -> tuple[int, str, Obj, float | None]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, body, _ = self._api.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        waited = 0.0
        try:
            with self.budget.request() if self.budget is not None else contextlib.nullcontext() as waited_for:
                waited = waited_for or 0.0
                resp = self._api.call_api(method, url, header_params=headers, body=body, _request_timeout=30)
                raw = resp.read()
        except urllib3.exceptions.HTTPError:
            if self.observer is not None:
                self.observer.api_request(method, resource_of(path), 0, waited)
            raise
        if self.observer is not None:
            self.observer.api_request(method, resource_of(path), resp.status, waited)
        after = resp.headers.get("Retry-After") if resp.headers else None
        retry_after = float(after) if after and after.replace(".", "", 1).isdigit() else None
        return resp.status, resp.reason or "", _decoded(raw), retry_after

    def watch(self, path: str, query: dict[str, str], timeout_seconds: int) -> Iterator[tuple[str, Obj]]:
        """The (type, object) events of one watch request, decoded, until the server ends the stream (after
        `timeout_seconds`, or sooner) or `stop_watches` cuts it; KubeError when the server refuses the watch."""
        q = {**query, "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
        _, url, headers, _, _ = self._api.param_serialize(
            "GET", f"{path}?{urlencode(q)}", header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
        )
        # No read timeout shorter than the server's: a quiet watch is not a dead one.
        resp = self._api.call_api("GET", url, header_params=headers, _request_timeout=(10, timeout_seconds + 30))
        if self.observer is not None:
            self.observer.api_request("WATCH", resource_of(path), resp.status, 0.0)
        stream: urllib3.BaseHTTPResponse = resp.response
        if resp.status != 200:
            data = _decoded(resp.read())
            raise KubeError(resp.status, resp.reason or "", str(data.get("message", data)), "GET")
        with self._mu:
            self._watches.add(stream)
        try:
            pending = b""
            for chunk in stream.stream(amt=None, decode_content=False):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        yield event.get("type", ""), event.get("object") or {}
        finally:
            with self._mu:
                self._watches.discard(stream)
            stream.release_conn()

    def stop_watches(self) -> None:
        """End every watch in progress (from another thread): its iterator stops or raises."""
        with self._mu:
            streams = list(self._watches)
        for stream in streams:
            with contextlib.suppress(Exception):
                stream.shutdown()

    # -- jobs ------------------------------------------------------------------------------------------------

    def list_jobs(self, namespace: str | None) -> Listing:
        """Every job in `namespace` (all namespaces: None)."""
        return self._list(path_of(f"{GROUP}/{VERSION}", PLURAL, namespace))

    def list_operator_pods(self, namespace: str | None) -> Listing:
        """Every pod of any job in `namespace` (all namespaces: None), by the selector the pod watch uses."""
        return self.list_owned(("v1", "pods"), namespace)

    def list_owned(self, kind: tuple[str, str], namespace: str | None) -> Listing:
        """Every object of (apiVersion, plural) `kind` the operator made in `namespace` (all: None)."""
        return self._list(path_of(kind[0], kind[1], namespace), {"labelSelector": naming.CHILD_SELECTOR})

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
        listing = self._list(path_of("v1", "pods", namespace), {"labelSelector": f"{naming.LABEL_JOB}={job}"})
        # Belt and braces: a server that ignores the selector must not hand us another job's pods.
        mine = [p for p in listing.items if (p.get("metadata", {}).get("labels") or {}).get(naming.LABEL_JOB) == job]
        return Listing(mine, listing.resource_version)

    def create(self, obj: Obj) -> Obj:
        md = obj["metadata"]
        return self.request("POST", path_of(obj["apiVersion"], self._plural(obj), md.get("namespace")), obj)

    def delete_pod(self, namespace: str, name: str) -> Obj:
        """The server's answer: the pod, terminating, or a Status once it is gone ({} if it was already)."""
        return self._delete(path_of("v1", "pods", namespace, name))

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
