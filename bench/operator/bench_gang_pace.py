"""Gangs at the API server's pace: the operator creating one job's gang of N one-rank pods, against a plain client
creating the same N pods with as many threads as the operator has pod creates in flight (and a pool twice that).
The same pods: the operator's spec, labels, annotations and an owner reference, to a job object the plain trial
makes and nothing reconciles (`--plain-pods bare` drops the metadata, as the figures before December 2026 did).

Each trial runs on a fresh KMock emulator in its own process (its store keeps every deleted object, so a reused one
slows down trial by trial), the two systems alternated and reversed every other repetition. The operator's time
runs from the job's POST until its last pod's create was answered (its own client records it, so nothing polls the
server meanwhile); the plain client's from its first create to its last answer. Printed: pods/s of each, median and
range, and their ratio (issue goal: at least 0.8). With ZEROTRAIN_E2E_KUBECONFIG naming a real cluster, both run
there instead, in a namespace of their own.

    python bench/operator/bench_gang_pace.py --pods 256 --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import copy
import enum
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/operator: the sibling modules

import kubernetes  # noqa: E402
from bench_server import server  # noqa: E402
from e2e.cluster import KUBECONFIG_ENV  # noqa: E402
from e2e.test_operator_e2e import JOBS, job_manifest  # noqa: E402

from zerotrain.operator.app import operate  # noqa: E402
from zerotrain.operator.client.kube import Kube, KubeError, path_of  # noqa: E402
from zerotrain.operator.client.rate_limit import RequestBudget  # noqa: E402
from zerotrain.operator.metrics import OperatorMetrics  # noqa: E402
from zerotrain.operator.settings import OperatorSettings  # noqa: E402
from zerotrain.spec import PLURAL  # noqa: E402


class TimedKube(Kube):
    """The operator's client, noting when each pod create was answered."""

    answered: list[float]

    def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        out = super().request(method, path, *args, **kwargs)
        if method == "POST" and path.endswith("/pods"):
            self.answered.append(time.monotonic())
        return out


def plain_client(cfg: kubernetes.client.Configuration, threads: int, agent: str = "bench-plain") -> Kube:
    """A client with no watch, cache or budget, for `threads` threads: a pool of twice that."""
    plain_cfg = copy.copy(cfg)
    plain_cfg.connection_pool_maxsize = 2 * threads
    plain = Kube(plain_cfg, retries=5, retry_base_seconds=0.05)
    plain.set_user_agent(agent)
    return plain


def operator_trial(cfg: kubernetes.client.Configuration, ns: str, n: int, name: str) -> tuple[float, dict[str, Any]]:
    """Seconds from the job's POST to the operator's last answered pod create, and one pod it made."""
    settings = OperatorSettings(namespaces=[ns], resync_seconds=30)
    budget = RequestBudget(settings.api_qps, settings.api_burst, settings.api_connections)
    op = TimedKube(copy.copy(cfg), retries=5, retry_base_seconds=0.05, budget=budget)
    op.answered = []
    client = Kube(copy.copy(cfg), retries=5, retry_base_seconds=0.05)
    stop = threading.Event()
    thread = threading.Thread(
        target=asyncio.run, args=(operate(op, settings, stop_flag=stop, metrics=OperatorMetrics(), liveness=False),)
    )
    thread.start()
    try:
        time.sleep(2)  # kopf's watches subscribed
        t0 = time.monotonic()
        client.request("POST", path_of(JOBS, PLURAL, ns), job_manifest(name, ns, replicas=n, nprocPerNode=1))
        while len(op.answered) < n:
            if time.monotonic() - t0 > 600:
                raise TimeoutError(f"{len(op.answered)} of {n} pods after 600 s")
            time.sleep(0.2)
        took = op.answered[n - 1] - t0
        pods = client.list_job_pods(ns, name).items
        client.request("DELETE", path_of(JOBS, PLURAL, ns, name))
        return took, pods[0]
    finally:
        stop.set()
        thread.join(30)
        op.close()
        client.close()


class PlainPods(enum.Enum):
    """What the plain client's pods carry besides the operator's pod spec."""

    OWNED = "owned"
    """The operator's metadata too: its labels, annotations and an owner reference to a job object (made for the
    trial, never reconciled). A real server does more for such a pod: OwnerReferencesPermissionEnforcement
    authorizes the reference, and the garbage collector tracks the pod; so the same pods, like for like."""
    BARE = "bare"
    """Only a name and one label: the cheapest pod the server takes (the comparison of the earlier figures)."""


def plain_bodies(template: dict[str, Any], ns: str, n: int, owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """`n` pods like `template` (a pod the operator made), named plain-<i>; with the operator's metadata and an owner
    reference to `owner` when given (PlainPods.OWNED), else with a name and one label."""
    bodies = []
    for i in range(n):
        pod = copy.deepcopy(template)
        meta = template["metadata"]
        pod["metadata"] = {"name": f"plain-{i}", "namespace": ns, "labels": {"bench": "plain"}}
        if owner is not None:
            pod["metadata"]["labels"] |= meta.get("labels") or {}
            pod["metadata"]["annotations"] = dict(meta.get("annotations") or {})
            reference = {**meta["ownerReferences"][0], "uid": owner["metadata"]["uid"]}
            pod["metadata"]["ownerReferences"] = [reference]
        pod.pop("status", None)
        bodies.append(pod)
    return bodies


def plain_trial(
    cfg: kubernetes.client.Configuration, ns: str, template: dict[str, Any], n: int, threads: int, pods: PlainPods
) -> float:
    """Seconds a plain client (`threads` threads, a pool of twice that) takes to create `n` pods like `template`."""
    plain = plain_client(cfg, threads)
    owner = None
    if pods is PlainPods.OWNED:
        name = template["metadata"]["ownerReferences"][0]["name"]
        owner = plain.request("POST", path_of(JOBS, PLURAL, ns), job_manifest(name, ns, replicas=n, nprocPerNode=1))
    bodies = plain_bodies(template, ns, n, owner)
    # The pods name the job's ServiceAccount, gone with the job by now: a real server's ServiceAccount admission
    # refuses a pod whose account is missing, so the plain client makes it first, as the operator did.
    account = template.get("spec", {}).get("serviceAccountName")
    sa_path = path_of("v1", "serviceaccounts", ns)
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}}
    try:
        if account:
            with contextlib.suppress(KubeError):  # 409: it is there already
                plain.request("POST", sa_path, sa)
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda b: plain.request("POST", path_of("v1", "pods", ns), b), bodies))
        took = time.monotonic() - t0
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda b: plain.request("DELETE", path_of("v1", "pods", ns, b["metadata"]["name"])), bodies))
        if account:
            plain.request("DELETE", path_of("v1", "serviceaccounts", ns, account))
        if owner is not None:
            plain.request("DELETE", path_of(JOBS, PLURAL, ns, owner["metadata"]["name"]))
        return took
    finally:
        plain.close()


def spread(rates: list[float]) -> str:
    return f"{statistics.median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--namespace", default="default")
    parser.add_argument(
        "--plain-pods",
        type=PlainPods,
        choices=list(PlainPods),
        default=PlainPods.OWNED,
        help="owned: the operator's very pods, owner reference included (default); bare: a name and one label",
    )
    args = parser.parse_args()
    threads = OperatorSettings().pod_create_concurrency
    ours: list[float] = []
    plain: list[float] = []
    template: dict[str, Any] | None = None
    for rep in range(args.reps):
        order = ("ours", "plain") if rep % 2 == 0 or template is None else ("plain", "ours")
        for which in order:
            with server(args.namespace) as where:
                cfg, ns = where.cfg, where.namespace
                if which == "ours":
                    took, template = operator_trial(cfg, ns, args.pods, f"pace-{rep}")
                    ours.append(args.pods / took)
                else:
                    assert template is not None
                    plain.append(args.pods / plain_trial(cfg, ns, template, args.pods, threads, args.plain_pods))
            print(f"rep {rep} {which}: {(ours if which == 'ours' else plain)[-1]:.0f} pods/s", flush=True)
    report = {
        "pods": args.pods,
        "concurrency": threads,
        "plain_pods": args.plain_pods.value,
        "operator_pods_per_s": spread(ours),
        "plain_client_pods_per_s": spread(plain),
        "operator_over_plain": round(statistics.median(ours) / statistics.median(plain), 2),
        "server": "real" if os.environ.get(KUBECONFIG_ENV) else "emulator",
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
