"""The operator at scale: `--jobs` jobs (2 pods each) applied at once, then one 1,024-rank job (128 pods × 8 ranks),
against the KMock emulator run in its own process (in-process, the emulator and not the operator is the bottleneck;
see shared/notes/real-apiserver.md), with a thread playing kubelet (every new pod Running) once every pod exists.

Printed: how long until every pod exists (the operator's last pod create answered) and runs, and the operator
process's CPU per job until then; reconcile pass latency p50/p99 (wall time, which includes the emulator's answers,
and the pass thread's own CPU time, which does not); the API requests the operator sends per job per resync pass once
every job is steady (and how many are writes: the goal is none); operator memory per job; what the emulator served
per job, by client (kopf's own requests included). Beside them, on fresh emulator processes, a plain client (as many
threads as the operator has pod creates in flight, a pool twice that; no watch, cache or kopf): the same number of
pods alone, then exactly the writes the operator sent per job, each job's in order; then those writes again with as
many threads as the operator has reconcile workers, so as many jobs in flight as it has passes: each job's time from
its first child write to its first status patch answered is what a first pass does, the peer of the busy pass p99
(a saturated server makes every client's round trips slow). With ZEROTRAIN_E2E_KUBECONFIG
naming a real cluster, each phase runs there instead, in a namespace of its own, and what the server served comes
from its apiserver_request_total (every client's requests, by call).

    python bench/operator/bench_operator_scale.py --jobs 1000 --wide-replicas 128 --resync 5
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import copy
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/operator: the sibling modules

from bench_gang_pace import PlainPods, plain_client, plain_trial  # noqa: E402
from bench_server import Server, server  # noqa: E402
from e2e.kubelet import set_pod_phase  # noqa: E402
from e2e.test_operator_e2e import JOBS, job_manifest  # noqa: E402

from zerotrain.operator.app import operate  # noqa: E402
from zerotrain.operator.children import naming  # noqa: E402
from zerotrain.operator.client.kube import Kube, KubeError, path_of, resource_of  # noqa: E402
from zerotrain.operator.client.rate_limit import RequestBudget  # noqa: E402
from zerotrain.operator.controller.reconcile import Reconciler  # noqa: E402
from zerotrain.operator.metrics import OperatorMetrics  # noqa: E402
from zerotrain.operator.settings import OperatorSettings  # noqa: E402
from zerotrain.spec import PLURAL  # noqa: E402

CPU: list[float] = []
_timed = Reconciler._timed


def _cpu_timed(self: Reconciler, key: tuple[str, str]) -> Any:
    """A pass's CPU time on its own thread: the operator's work, whatever the API server's latency."""
    t0 = time.thread_time()
    try:
        return _timed(self, key)
    finally:
        CPU.append(time.thread_time() - t0)


Reconciler._timed = _cpu_timed  # type: ignore[method-assign]


class TimedMetrics(OperatorMetrics):
    """Operator metrics that also keep every reconcile pass's duration."""

    def __init__(self) -> None:
        super().__init__()
        self.passes: list[float] = []

    def observe_reconcile(self, result: str, seconds: float) -> None:
        super().observe_reconcile(result, seconds)
        self.passes.append(seconds)


class CountingKube(Kube):
    """The operator's client, counting requests by method and noting when each pod create was answered."""

    counts: collections.Counter[tuple[str, str]]
    pods_answered: list[float]

    def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        self.counts[method, resource_of(path)] += 1
        out = super().request(method, path, *args, **kwargs)
        if method == "POST" and path.endswith("/pods"):
            self.pods_answered.append(time.monotonic())
        return out


def kubelet(client: Kube, ns: str, stop: threading.Event, go: threading.Event) -> None:
    """Every Pending pod of any job becomes Running, once `go` is set (until then the pods' creation has the
    emulator to itself, as the plain client's has)."""
    go.wait()
    while not stop.wait(1.0):
        items = client.request("GET", path_of("v1", "pods", ns)).get("items") or []
        for pod in items:
            if (pod.get("status") or {}).get("phase", "Pending") == "Pending":
                with contextlib.suppress(KubeError):  # deleted meanwhile
                    set_pod_phase(client, ns, pod["metadata"]["name"], "Running")


def wait_running(client: Kube, ns: str, names: list[str], timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        items = client.request("GET", path_of(JOBS, PLURAL, ns)).get("items") or []
        phases = {j["metadata"]["name"]: (j.get("status") or {}).get("phase") for j in items}
        if all(phases.get(n) == "Running" for n in names):
            return time.monotonic() - start
        time.sleep(0.5)
    raise TimeoutError(f"jobs not Running after {timeout}s")


def rss_bytes() -> int:
    """This process's resident set (Linux /proc): the operator's cache and per-job state grow it."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 2 else (values[0] if values else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100, help="0: skip the many-jobs phase")
    parser.add_argument("--timeout", type=float, default=1500.0, help="seconds to wait for each batch to run")
    parser.add_argument("--wide-replicas", type=int, default=128, help="0: skip the wide job")
    parser.add_argument("--resync", type=float, default=5.0)
    parser.add_argument("--steady-passes", type=int, default=3)
    parser.add_argument(
        "--api-qps", type=float, default=OperatorSettings().api_qps, help="the operator's client-side limit (0: none)"
    )
    parser.add_argument(
        "--reconcile-workers",
        type=int,
        default=OperatorSettings().reconcile_workers,
        help="passes of different jobs at once (RECONCILE_WORKERS)",
    )
    args = parser.parse_args()
    with server() as where:
        report = run(where, args)
    if args.jobs and where.served:
        # The wide job's requests are included when it ran.
        report["served_per_job"] = {k: round(v / args.jobs, 2) for k, v in sorted(where.served.items())}
    print(json.dumps(report))


class Report(dict[str, Any]):
    """Figures printed as they are measured, so a slow later phase loses none of the earlier ones."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        print(f"{key}: {value}", flush=True)


def run(where: Server, args: argparse.Namespace) -> dict[str, Any]:
    cfg, ns = where.cfg, where.namespace
    settings = OperatorSettings(
        namespaces=[ns],
        resync_seconds=args.resync,
        restart_backoff_seconds=1,
        api_qps=args.api_qps,
        reconcile_workers=args.reconcile_workers,
    )
    budget = RequestBudget(settings.api_qps, settings.api_burst, settings.api_connections)
    op_kube = CountingKube(copy.copy(cfg), retries=5, retry_base_seconds=0.05, budget=budget)
    op_kube.counts, op_kube.pods_answered = collections.Counter(), []
    client = plain_client(cfg, settings.pod_create_concurrency, agent="bench")  # it submits jobs in parallel
    metrics, stop = TimedMetrics(), threading.Event()
    operator = threading.Thread(
        target=asyncio.run, args=(operate(op_kube, settings, stop_flag=stop, metrics=metrics, liveness=False),)
    )
    operator.start()
    time.sleep(2)
    go = threading.Event()
    kube_thread = threading.Thread(target=kubelet, args=(client, ns, stop, go), daemon=True)
    kube_thread.start()
    report: dict[str, Any] = Report()
    writes: JobWrites | None = None
    try:
        if args.jobs:
            many(client, ns, op_kube, metrics, args, report, go)
            writes = JobWrites.read(client, ns, op_kube.counts, args.jobs)
        go.set()
        if args.wide_replicas:
            wide(client, ns, metrics, args, report)
    finally:
        stop.set()
        operator.join(30)
        op_kube.close()
        client.close()
    if writes is not None:
        plain(writes, args, report)
    return report


def plain(writes: JobWrites, args: argparse.Namespace, report: Any) -> None:
    """On fresh servers, a plain client (no watch, no cache, no kopf): the many-jobs phase's pods alone, then every
    write the operator sent per job (the job's POST included), each job's writes in order, jobs in parallel."""
    threads = OperatorSettings().pod_create_concurrency
    with server() as where:
        took = plain_trial(where.cfg, where.namespace, writes.pods[0], 2 * args.jobs, threads, PlainPods.OWNED)
    report["plain_pods_exist_s"] = round(took, 2)
    with server() as where:
        pods_s, all_s, _ = same_writes(where, writes, args.jobs, threads)
    report["plain_same_writes_pods_exist_s"], report["plain_same_writes_s"] = round(pods_s, 2), round(all_s, 2)
    report["operator_over_plain_pods"] = round(took / report["all_pods_exist_s"], 2)
    report["operator_over_plain_same_writes"] = round(pods_s / report["all_pods_exist_s"], 2)
    with server() as where:
        _, _, first_passes = same_writes(where, writes, args.jobs, args.reconcile_workers)
    report["plain_first_pass_p50_s"] = round(pct(first_passes, 50), 4)
    report["plain_first_pass_p99_s"] = round(pct(first_passes, 99), 4)
    report["busy_p99_over_plain_first_pass_p99"] = round(report["busy_p99_s"] / report["plain_first_pass_p99_s"], 2)


@dataclass
class JobWrites:
    """What the operator wrote for one job (job-0000), to be written again by a plain client under other names."""

    job: dict[str, Any]
    children: list[dict[str, Any]]
    """ServiceAccount, Role, RoleBinding, Service, ConfigMap: created before the pods, as the operator does."""
    pods: list[dict[str, Any]]
    status_patches: int
    events: list[dict[str, Any]]

    @classmethod
    def read(cls, client: Kube, ns: str, counts: collections.Counter[tuple[str, str]], jobs: int) -> JobWrites:
        name, sel = "job-0000", {"labelSelector": f"{naming.LABEL_JOB}=job-0000"}
        job = client.request("GET", path_of(JOBS, PLURAL, ns, name))
        children = [
            {"apiVersion": v, "kind": kind, **o}
            for v, kind, plural in _CHILD_KINDS
            for o in client.request("GET", path_of(v, plural, ns), query=sel).get("items") or []
        ]
        events = client.request("GET", path_of("v1", "events", ns)).get("items") or []
        mine = [{"apiVersion": "v1", "kind": "Event", **e} for e in events if e["involvedObject"]["name"] == name]
        patches = round(counts["PATCH", f"{PLURAL}/status"] / jobs)
        pods = [{"apiVersion": "v1", "kind": "Pod", **p} for p in client.list_job_pods(ns, name).items]
        return cls(job, children, pods, patches, mine)

    def renamed(self, obj: dict[str, Any], name: str, ns: str, uid: str) -> dict[str, Any]:
        out = json.loads(json.dumps(obj).replace("job-0000", name))
        md = out["metadata"]
        out["metadata"] = {k: md[k] for k in ("name", "labels", "annotations") if k in md} | {"namespace": ns}
        if "ownerReferences" in md:
            out["metadata"]["ownerReferences"] = [{**r, "uid": uid} for r in md["ownerReferences"]]
        out.pop("status", None)
        return out


_CHILD_KINDS = [
    ("v1", "ServiceAccount", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "Role", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    ("v1", "Service", "services"),
    ("v1", "ConfigMap", "configmaps"),
]


def same_writes(where: Server, writes: JobWrites, jobs: int, threads: int) -> tuple[float, float, list[float]]:
    """Seconds until the last pod was answered, and until every write was; per job, the seconds from its first child
    write to its first status patch answered (what the operator's first pass of a job writes)."""
    ns = where.namespace
    client = plain_client(where.cfg, threads)
    answered: list[float] = []
    first_passes: list[float] = []

    def one(i: int) -> None:
        name = f"job-{i:04d}"
        job = client.request("POST", path_of(JOBS, PLURAL, ns), writes.renamed(writes.job, name, ns, ""))
        uid = job["metadata"]["uid"]
        start = time.monotonic()
        for obj in writes.children:
            client.create(writes.renamed(obj, name, ns, uid))
        for pod in writes.pods:
            client.create(writes.renamed(pod, name, ns, uid))
            answered.append(time.monotonic())
        status = {"status": writes.job.get("status") or {}}
        for n in range(writes.status_patches):
            client.request("PATCH", path_of(JOBS, PLURAL, ns, name, "status"), status, "application/merge-patch+json")
            if n == 0:
                first_passes.append(time.monotonic() - start)
        for ev in writes.events:
            body = writes.renamed(ev, name, ns, uid)
            body["metadata"] = {"generateName": f"{name}.", "namespace": ns}
            # A real server requires an Event's object in the Event's namespace (each phase has a namespace of its own).
            body["involvedObject"] = {**body.get("involvedObject", {}), "namespace": ns, "uid": uid}
            client.create(body)

    try:
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(jobs)))
        return max(answered) - t0, time.monotonic() - t0, first_passes
    finally:
        client.close()


def many(
    client: Kube,
    ns: str,
    op_kube: CountingKube,
    metrics: TimedMetrics,
    args: argparse.Namespace,
    report: Any,
    go: threading.Event,
) -> None:
    """`--jobs` jobs of 2 pods at once, then their steady state."""
    names = [f"job-{i:04d}" for i in range(args.jobs)]
    rss_before = rss_bytes()
    threads = OperatorSettings().pod_create_concurrency
    t0, cpu0 = time.monotonic(), time.process_time()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        bodies = [job_manifest(n, ns, replicas=2, nprocPerNode=1) for n in names]
        list(pool.map(lambda b: client.request("POST", path_of(JOBS, PLURAL, ns), b), bodies))
    report["create_requests_s"] = round(time.monotonic() - t0, 2)
    while len(op_kube.pods_answered) < 2 * args.jobs:  # the operator's own record: nothing polls the server
        if time.monotonic() - t0 > args.timeout:
            raise TimeoutError(f"{len(op_kube.pods_answered)} of {2 * args.jobs} pods after {args.timeout}s")
        time.sleep(0.05)
    report["all_pods_exist_s"] = round(op_kube.pods_answered[2 * args.jobs - 1] - t0, 2)
    # This process's CPU (the operator's threads, kopf's included, and the bench's job POSTs) until then.
    report["cpu_per_job_until_pods_ms"] = round((time.process_time() - cpu0) / args.jobs * 1000, 1)
    go.set()
    report["all_running_s"] = round(time.monotonic() - t0 + wait_running(client, ns, names, args.timeout), 2)
    report["busy_requests_per_job"] = {f"{m} {r}": round(v / args.jobs, 2) for (m, r), v in op_kube.counts.items()}
    busy, cpu = list(metrics.passes), list(CPU)
    report["busy_passes"] = len(busy)
    report["busy_p50_s"], report["busy_p99_s"] = round(pct(busy, 50), 4), round(pct(busy, 99), 4)
    report["busy_cpu_p50_s"], report["busy_cpu_p99_s"] = round(pct(cpu, 50), 4), round(pct(cpu, 99), 4)
    # Steady state: every job Running; count what the periodic passes send.
    time.sleep(args.resync)
    before, passes_before, cpu_before = collections.Counter(op_kube.counts), len(metrics.passes), len(CPU)
    time.sleep(args.resync * args.steady_passes)
    sent = op_kube.counts - before
    steady = metrics.passes[passes_before:]
    report["steady_passes"] = len(steady)
    report["steady_p50_s"], report["steady_p99_s"] = round(pct(steady, 50), 4), round(pct(steady, 99), 4)
    steady_cpu = CPU[cpu_before:]
    report["steady_cpu_p50_s"], report["steady_cpu_p99_s"] = (
        round(pct(steady_cpu, 50), 4),
        round(pct(steady_cpu, 99), 4),
    )
    per = max(1, len(steady))
    report["requests_per_job_pass"] = round(sum(sent.values()) / per, 2)
    report["writes_per_job_pass"] = round(sum(v for (m, _), v in sent.items() if m != "GET") / per, 3)
    # The operator shares this process with the bench's client and kubelet thread, which hold no per-job state.
    report["rss_per_job_kib"] = round((rss_bytes() - rss_before) / args.jobs / 1024, 1)


def wide(client: Kube, ns: str, metrics: TimedMetrics, args: argparse.Namespace, report: Any) -> None:
    """One wide job: 128 pods × 8 ranks = 1,024 ranks."""
    start_passes, start_cpu = len(metrics.passes), len(CPU)
    manifest = job_manifest("wide", ns, replicas=args.wide_replicas, nprocPerNode=8)
    client.request("POST", path_of(JOBS, PLURAL, ns), manifest)
    report["wide_ranks"] = args.wide_replicas * 8
    report["wide_running_s"] = round(wait_running(client, ns, ["wide"], args.timeout), 2)
    wide_passes = metrics.passes[start_passes:]
    report["wide_p50_s"], report["wide_p99_s"] = round(pct(wide_passes, 50), 4), round(pct(wide_passes, 99), 4)
    wide_cpu = CPU[start_cpu:]
    report["wide_cpu_p50_s"], report["wide_cpu_p99_s"] = round(pct(wide_cpu, 50), 4), round(pct(wide_cpu, 99), 4)


if __name__ == "__main__":
    main()
