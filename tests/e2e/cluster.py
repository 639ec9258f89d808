"""Where the e2e tests run: the KMock emulator (always) or a real cluster (ZEROTRAIN_E2E_KUBECONFIG).

Only the connection differs: both give a `kubernetes.client.Configuration`, a namespace to work in and a
way to know the operator's watches are live. Everything else (the operator, the test's client, the
"kubelet" helpers that write pod status) is identical.
"""

from __future__ import annotations

import asyncio
import collections
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import yaml
from budget import budget
from prometheus_client.parser import text_string_to_metric_families

from zerotrain.crd import build_crd
from zerotrain.operator.client.kube import Kube, KubeError
from zerotrain.spec import GROUP, PLURAL, VERSION

from .emulator import ZeroEmulator

KUBECONFIG_ENV = "ZEROTRAIN_E2E_KUBECONFIG"
TEST_AGENT = "zerotrain-e2e"
OPERATOR_AGENTS = ("zerotrain-operator", "kopf")


@dataclass
class Cluster:
    """A connection plus a namespace; `emulator` is set only for the in-memory cluster."""

    configuration: kubernetes.client.Configuration
    namespace: str
    emulator: ZeroEmulator | None = None
    kopf_runs: bool = True
    """Whether kopf gets to send a request in the test (the teardown then checks its calls were recorded); a
    replica deposed as it starts may stop before its first."""

    def client(self, agent: str = TEST_AGENT) -> Kube:
        kube = Kube(self.configuration, retries=3, retry_base_seconds=0.05)
        kube.set_user_agent(agent)
        return kube

    async def wait_watching(self, timeout: float = 10.0) -> None:
        """Until kopf watches jobs and pods: events sent earlier would be lost (emulator gotcha G3)."""
        if self.emulator is None:
            await asyncio.sleep(2.0)  # a real API server replays state on watch start; a margin suffices
            return
        emu = self.emulator
        await until(lambda: emu.watchers(GROUP, VERSION, PLURAL) and emu.watchers("", "v1", "pods"), timeout)


async def until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll `predicate` (sync, cheap or run in a thread by the caller) until truthy."""
    deadline = time.monotonic() + budget(timeout)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {getattr(predicate, '__name__', predicate)}")
        await asyncio.sleep(interval)


async def until_async(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Like `until`, but runs a blocking predicate (API calls) in a thread (emulator gotcha G4)."""
    deadline = time.monotonic() + budget(timeout)
    last: Any = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(predicate)
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s; last value: {last!r}")


def real_cluster_setup(path: str) -> Cluster:
    """Connect with the kubeconfig, install the CRD if it is missing and make a throw-away namespace."""
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=path, client_configuration=cfg)
    ns = f"zerotrain-e2e-{uuid.uuid4().hex[:6]}"
    cluster = Cluster(cfg, ns)
    kube = cluster.client()
    try:
        install_crd(kube)
        kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    finally:
        kube.close()
    return cluster


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def install_crd(kube: Kube, wait_s: float = 30.0) -> None:
    """Install the CRD unless it is there, and wait until the server serves it (Established). A kubeconfig that may
    not install CRDs and finds none stops the run with one line saying how to install it."""
    crd = build_crd()
    name = crd["metadata"]["name"]
    try:
        kube.request("POST", CRDS, crd)
    except KubeError as e:
        if e.status in (401, 403) and _crd(kube, name) is None:
            raise SystemExit(
                f"the CRD {name} is not installed and this kubeconfig may not install it ({e.status} {e.reason}): "
                "install it first, kubectl apply -f crds/"
            ) from None
        if e.status not in (401, 403, 409):
            raise
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        conditions = ((_crd(kube, name) or {}).get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return
        time.sleep(0.2)
    raise SystemExit(f"the CRD {name} was not Established within {wait_s:g} s")


def _crd(kube: Kube, name: str) -> dict[str, Any] | None:
    """The installed CRD, or None when the server has none by that name (or will not say)."""
    try:
        return kube.request("GET", f"{CRDS}/{name}")
    except KubeError as e:
        if e.status in (403, 404):
            return None
        raise


def real_cluster_teardown(cluster: Cluster) -> None:
    kube = cluster.client()
    try:
        kube.request("DELETE", f"/api/v1/namespaces/{cluster.namespace}")
    finally:
        kube.close()


def server_metrics(cluster: Cluster) -> str:
    """A real API server's /metrics text."""
    api = kubernetes.client.ApiClient(cluster.configuration)
    try:
        _, url, headers, _, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
        return str(api.call_api("GET", url, header_params=headers).read().decode())
    finally:
        api.close()


def job_reads_served(cluster: Cluster) -> float:
    """GET and LIST requests on ZeroTrainingJobs the real API server has served since it started, from its
    `apiserver_request_total` (its /metrics; watches are counted under verb WATCH)."""
    return job_reads_in(server_metrics(cluster))


def job_reads_in(metrics: str) -> float:
    """The GET and LIST requests on ZeroTrainingJobs that an API server's /metrics text counts."""
    wanted = re.compile(rf'^apiserver_request_total\{{(?=[^}}]*resource="{PLURAL}")(?=[^}}]*verb="(GET|LIST)")')
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if wanted.match(line))


def requests_served(cluster: Cluster) -> collections.Counter[str]:
    """Every request the real API server has served since it started, by "verb resource[/subresource]"."""
    return requests_in(server_metrics(cluster))


def requests_in(metrics: str) -> collections.Counter[str]:
    """apiserver_request_total of an API server's /metrics text, summed by verb and resource (and subresource)."""
    out: collections.Counter[str] = collections.Counter()
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            out[f"{labels.get('verb', '').lower()} {resource}"] += int(sample.value)
    return out


def manifest_yaml(body: dict[str, Any]) -> str:
    return yaml.safe_dump(body, sort_keys=False)


def project_token(cluster: Cluster, kube: Kube, service_account: str, pod: dict[str, Any] | None, where: Path) -> None:
    """What a kubelet does for a pod: mint its service account's token with the TokenRequest API (bound to the pod)
    and project it, with the CA, into `where`. The emulator checks no token: it gets none."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "namespace").write_text(cluster.namespace)
    if cluster.emulator is not None:
        return
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if pod is not None:
        md = pod["metadata"]
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": md["name"], "uid": md["uid"]}
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    path = f"/api/v1/namespaces/{cluster.namespace}/serviceaccounts/{service_account}/token"
    (where / "token").write_text(kube.request("POST", path, body)["status"]["token"])
    if cluster.configuration.ssl_ca_cert:
        (where / "ca.crt").write_bytes(Path(cluster.configuration.ssl_ca_cert).read_bytes())
