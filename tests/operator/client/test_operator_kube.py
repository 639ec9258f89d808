"""kube.py against a scripted HTTP server: retries on conflict/throttling/5xx, apply semantics; API_CALLS."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes
import pytest

from zerotrain.manifest import parse_spec
from zerotrain.operator.children import builders, supporting
from zerotrain.operator.children.job_ref import JobRef
from zerotrain.operator.client.api_calls import API_CALLS, PLURALS, ApiCall
from zerotrain.operator.client.cached_client import CachedClient
from zerotrain.operator.client.kube import APPLIED_ANNOTATION, Kube, KubeError, applied, is_subset, resource_of


class Script:
    """Answers each request with the next (status, body, headers) and records (method, path, body)."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, Any], dict[str, str]]] = []
        self.seen: list[tuple[str, str, Any]] = []


@pytest.fixture
def server() -> Iterator[tuple[Script, Kube]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(size)) if size else None
            script.seen.append((self.command, self.path, body))
            status, payload, headers = script.answers.pop(0) if script.answers else (200, {}, {})
            data = json.dumps(payload).encode()
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _answer

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    cfg = kubernetes.client.Configuration()
    cfg.host = f"http://127.0.0.1:{httpd.server_address[1]}"
    kube = Kube(cfg, retries=3, retry_base_seconds=0.01)
    yield script, kube
    kube.close()
    httpd.shutdown()
    httpd.server_close()


def test_throttling_and_conflicts_are_retried(server: tuple[Script, Kube]) -> None:
    script, kube = server
    script.answers = [(429, {"message": "slow down"}, {"Retry-After": "0"}), (409, {}, {}), (200, {"ok": 1}, {})]
    assert kube.request("PATCH", "/api/v1/namespaces/n/pods/p", {"a": 1}) == {"ok": 1}
    assert len(script.seen) == 3


def test_retries_are_bounded(server: tuple[Script, Kube]) -> None:
    script, kube = server
    script.answers = [(503, {"message": "down"}, {})] * 4
    with pytest.raises(KubeError) as e:
        kube.request("GET", "/api/v1/namespaces/n/pods")
    assert e.value.status == 503 and len(script.seen) == 4


def test_create_conflict_is_an_answer_not_retried(server: tuple[Script, Kube]) -> None:
    script, kube = server
    script.answers = [(409, {"message": "exists"}, {})]
    with pytest.raises(KubeError) as e:
        kube.request("POST", "/api/v1/namespaces/n/pods", {})
    assert e.value.status == 409 and len(script.seen) == 1


def test_apply_is_a_server_side_apply_with_the_operators_field_manager(server: tuple[Script, Kube]) -> None:
    script, kube = server
    svc = supporting.build_service(JobRef("j", "n", "u"))
    stored = {**applied(svc), "spec": {**svc["spec"], "sessionAffinity": "None"}}  # with the server's defaults
    script.answers = [(201, stored, {})]
    assert kube.apply(svc) == stored
    method, path, body = script.seen[-1]
    assert method == "PATCH" and path == "/api/v1/namespaces/n/services/j?fieldManager=zerotrain-operator&force=true"
    assert body == applied(svc) and body["metadata"]["annotations"][APPLIED_ANNOTATION]
    assert svc["metadata"].get("annotations") is None  # the builder's object is left as it was


def test_apply_from_a_cached_copy_sends_nothing_only_while_this_build_is_in_place(server: tuple[Script, Kube]) -> None:
    script, kube = server
    svc = supporting.build_service(JobRef("j", "n", "u"))
    cached = {**applied(svc), "spec": {**svc["spec"], "sessionAffinity": "None"}}
    assert kube.apply(svc, known=cached) is None and script.seen == []  # server defaults are no drift
    drifted = {**cached, "metadata": {**cached["metadata"], "labels": {}}}  # someone else's edit
    script.answers = [(200, cached, {})]
    assert kube.apply(svc, known=drifted) == cached and len(script.seen) == 1
    older_build = {**svc, "spec": {**svc["spec"], "sessionAffinity": "ClientIP"}}
    # The cached copy holds every field of this build, but was applied from another: a field that build set and
    # this one does not must go, which only an apply does.
    assert is_subset(svc, applied(older_build))
    script.answers = [(200, cached, {})]
    assert kube.apply(svc, known=applied(older_build)) == cached and len(script.seen) == 2


def test_every_kind_the_builders_make_is_declared() -> None:
    spec = parse_spec({"image": "i", "entrypoint": "m:f", "scheduling": {"gang": "volcano"}})
    cos = parse_spec({"image": "i", "entrypoint": "m:f", "scheduling": {"gang": "coscheduling"}})
    job = JobRef("j", "n", "u")
    objs = [
        *supporting.build_supporting(job, spec),
        *supporting.build_supporting(job, cos),
        builders.build_pod(job, spec, 0, 0),
    ]
    for obj in objs:
        plural = PLURALS[(obj["apiVersion"], obj["kind"])]
        group = obj["apiVersion"].rpartition("/")[0]
        verbs = {"create"} if obj["kind"] == "Pod" else {"create", "patch"}  # server-side apply creates too
        assert {ApiCall(group, plural, v) for v in verbs} <= API_CALLS, obj["kind"]


@pytest.mark.parametrize(
    ("desired", "actual", "expected"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, True),
        ({"a": [{"x": 1}]}, {"a": [{"x": 1, "y": 2}]}, True),
        ({"a": [1, 2]}, {"a": [1]}, False),
        ({"a": {"b": 1}}, {"a": None}, False),
    ],
)
def test_is_subset(desired: Any, actual: Any, expected: bool) -> None:
    assert is_subset(desired, actual) is expected


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/namespaces/a/pods", "pods"),
        ("/api/v1/namespaces/a/pods/p-0?x=1", "pods"),
        ("/api/v1/pods", "pods"),
        ("/apis/zerotrain.dev/v1alpha1/namespaces/a/zerotrainingjobs/j/status", "zerotrainingjobs/status"),
        ("/apis/zerotrain.dev/v1alpha1/zerotrainingjobs", "zerotrainingjobs"),
        ("/api/v1/namespaces/a", "namespaces"),
        ("/apis/kueue.x-k8s.io/v1beta1", ""),
    ],
)
def test_resource_of_names_what_rbac_and_the_servers_metrics_name(path: str, resource: str) -> None:
    assert resource_of(path) == resource


def test_every_request_is_told_to_the_observer(server: tuple[Script, Kube]) -> None:
    script, kube = server
    seen: list[tuple[str, str, int]] = []

    class Observer:
        def api_request(self, verb: str, resource: str, code: int, throttled_seconds: float) -> None:
            seen.append((verb, resource, code))

    kube.observer = Observer()
    # A GET's 429 with Retry-After too: urllib3 no longer retries it where nobody sees it.
    script.answers = [(503, {"message": "busy"}, {}), (429, {}, {"Retry-After": "0"}), (200, {}, {})]
    kube.request("GET", "/api/v1/namespaces/a/pods")
    assert seen == [("GET", "pods", 503), ("GET", "pods", 429), ("GET", "pods", 200)]


def test_a_create_retried_into_409_was_done_by_the_attempt_that_failed(server: tuple[Script, Kube]) -> None:
    script, kube = server
    client = CachedClient(kube, None)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "j-worker-0", "namespace": "a"}}
    script.answers = [(503, {"message": "timed out"}, {}), (409, {"message": "already exists"}, {})]
    client.create_pod(pod)  # the first attempt's outcome was unknown: the pod it made is ours
    assert [m for m, _, _ in script.seen] == ["POST", "POST"]
    script.answers = [(409, {"message": "already exists"}, {})]
    with pytest.raises(KubeError) as e:  # at the first attempt the pod was someone's before us
        client.create_pod(pod)
    assert e.value.status == 409 and not e.value.retried
