"""The connection to the Kubernetes API server: requests with retries, and watches.

Plain dicts in and out through the official client's REST layer (no generated models). Conflicts (409),
throttling (429) and server errors (5xx) are retried with exponential back-off that honours Retry-After; every
request is told to the observer (the operator's metrics) and, with a budget, waits its turn (`rate_limit`). What is
sent, the verbs, apply and Events, is `kube.Kube`'s: this module knows paths, not resources.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol, TypeVar
from urllib.parse import urlencode

import kopf
import kubernetes
import urllib3

from zerotrain import __version__
from zerotrain.operator.client import connection, selectors
from zerotrain.operator.client.connection import ConnectionSource
from zerotrain.operator.client.rate_limit import RequestBudget
from zerotrain.operator.objects import Obj

log = logging.getLogger(__name__)

_RETRYABLE = {409, 429, 500, 502, 503, 504}
T = TypeVar("T", bound="Transport")


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


def _decoded(raw: bytes) -> Obj:
    """An answer's body as a dict: a JSON list as its items, text that is not JSON (a proxy's "404 page not
    found") as the message."""
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {"message": raw.decode(errors="replace")[:500]}
    return data if isinstance(data, dict) else {"items": data}


class Transport:
    """A thread-safe connection to one API server (one per operator run; close it, or keep-alive sockets linger)."""

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
        self.set_user_agent(f"{selectors.MANAGER}/{__version__}")

    @property
    def user_agent(self) -> str:
        """Who the API server's audit log (and the e2e tests' request record) says is calling; a write without a
        field manager is recorded in managedFields under its first part."""
        return str(self._api.user_agent)

    def set_user_agent(self, agent: str) -> None:
        """Who the API server's audit log (and the e2e tests' request record) says is calling."""
        self._api.user_agent = agent

    @classmethod
    def connect(cls: type[T], kubeconfig: str | None = None, **kwargs: Any) -> T:
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
