"""The operator at scale: 100 concurrent jobs (2 pods each), then one 1,024-rank job (128 pods × 8 ranks), against
the KMock emulator run in its own process (in-process, the emulator and not the operator is the bottleneck; see
shared/notes/real-apiserver.md), with a thread playing kubelet (every new pod Running).

Printed: reconcile pass latency p50/p99 (wall time, which includes the emulator's answers, and the operator thread's
own CPU time per pass, which does not), the API requests the operator sends per job per resync pass once every job
is steady (and how many of them are writes: the goal is none), and how long until every pod exists and runs.

    python bench/bench_operator_scale.py --jobs 100 --wide-replicas 128 --resync 5
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from e2e.kubelet import set_pod_phase  # noqa: E402
from e2e.test_operator_e2e import JOBS, job_manifest  # noqa: E402

from zerotrain.operator.app import operate  # noqa: E402
from zerotrain.operator.kube import Kube, KubeError, path_of  # noqa: E402
from zerotrain.operator.metrics import OperatorMetrics  # noqa: E402
from zerotrain.operator.rate_limit import RequestBudget  # noqa: E402
from zerotrain.operator.reconcile import Reconciler  # noqa: E402
from zerotrain.operator.settings import OperatorSettings  # noqa: E402
from zerotrain.spec import PLURAL  # noqa: E402

NS = "default"


def serve_emulator() -> None:
    """Child process: the e2e tests' emulator on a free 127.0.0.1 port, printed as its URL, until stdin closes."""
    import kmock
    from e2e.emulator import ZeroEmulator

    async def run() -> None:
        async with ZeroEmulator() as emu, kmock.Server(emu):
            print(str(emu.url).rstrip("/"), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(run())


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
    """The operator's client, counting requests by method."""

    counts: collections.Counter[str]

    def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        self.counts[method] += 1
        return super().request(method, path, *args, **kwargs)


def kubelet(client: Kube, stop: threading.Event) -> None:
    """Every Pending pod of any job becomes Running."""
    while not stop.wait(1.0):
        items = client.request("GET", path_of("v1", "pods", NS)).get("items") or []
        for pod in items:
            if (pod.get("status") or {}).get("phase", "Pending") == "Pending":
                with contextlib.suppress(KubeError):  # deleted meanwhile
                    set_pod_phase(client, NS, pod["metadata"]["name"], "Running")


def wait_running(client: Kube, names: list[str], timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        items = client.request("GET", path_of(JOBS, PLURAL, NS)).get("items") or []
        phases = {j["metadata"]["name"]: (j.get("status") or {}).get("phase") for j in items}
        if all(phases.get(n) == "Running" for n in names):
            return time.monotonic() - start
        time.sleep(0.5)
    raise TimeoutError(f"jobs not Running after {timeout}s")


def rss_bytes() -> int:
    """This process's resident set (Linux /proc): the operator's cache and per-job state grow it."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 2 else (values[0] if values else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100, help="0: skip the many-jobs phase")
    parser.add_argument("--timeout", type=float, default=1500.0, help="seconds to wait for each batch to run")
    parser.add_argument("--wide-replicas", type=int, default=128, help="0: skip the wide job")
    parser.add_argument("--resync", type=float, default=5.0)
    parser.add_argument("--steady-passes", type=int, default=3)
    parser.add_argument("--serve-emulator", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_emulator:
        serve_emulator()
        return
    emu = subprocess.Popen(
        [sys.executable, __file__, "--serve-emulator"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert emu.stdout is not None
        url = emu.stdout.readline().decode().strip()
        report = run(url, args)
    finally:
        if emu.stdin:
            emu.stdin.close()
        emu.wait(timeout=30)
    print(json.dumps(report))


class Report(dict[str, Any]):
    """Figures printed as they are measured, so a slow later phase loses none of the earlier ones."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        print(f"{key}: {value}", flush=True)


def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    import kubernetes

    cfg = kubernetes.client.Configuration()
    cfg.host = url
    settings = OperatorSettings(namespaces=[NS], resync_seconds=args.resync, restart_backoff_seconds=1)
    budget = RequestBudget(settings.api_qps, settings.api_burst, settings.api_connections)
    op_kube = CountingKube(copy.copy(cfg), retries=5, retry_base_seconds=0.05, budget=budget)
    op_kube.counts = collections.Counter()
    client = Kube(cfg, retries=5, retry_base_seconds=0.05)
    client.set_user_agent("bench")
    metrics, stop = TimedMetrics(), threading.Event()
    operator = threading.Thread(
        target=asyncio.run, args=(operate(op_kube, settings, stop_flag=stop, metrics=metrics, liveness=False),)
    )
    operator.start()
    time.sleep(2)
    kube_thread = threading.Thread(target=kubelet, args=(client, stop), daemon=True)
    kube_thread.start()
    report: dict[str, Any] = Report()
    try:
        if args.jobs:
            many(client, op_kube, metrics, args, report)
        if args.wide_replicas:
            wide(client, metrics, args, report)
    finally:
        stop.set()
        operator.join(30)
        op_kube.close()
        client.close()
    return report


def many(client: Kube, op_kube: CountingKube, metrics: TimedMetrics, args: argparse.Namespace, report: Any) -> None:
    """`--jobs` jobs of 2 pods at once, then their steady state."""
    names = [f"job-{i:04d}" for i in range(args.jobs)]
    rss_before = rss_bytes()
    t0 = time.monotonic()
    for n in names:
        client.request("POST", path_of(JOBS, PLURAL, NS), job_manifest(n, NS, replicas=2, nprocPerNode=1))
    report["create_requests_s"] = round(time.monotonic() - t0, 2)
    report["all_running_s"] = round(report["create_requests_s"] + wait_running(client, names, args.timeout), 2)
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
    report["writes_per_job_pass"] = round(sum(v for m, v in sent.items() if m != "GET") / per, 3)
    # The operator shares this process with the bench's client and kubelet thread, which hold no per-job state.
    report["rss_per_job_kib"] = round((rss_bytes() - rss_before) / args.jobs / 1024, 1)


def wide(client: Kube, metrics: TimedMetrics, args: argparse.Namespace, report: Any) -> None:
    """One wide job: 128 pods × 8 ranks = 1,024 ranks."""
    start_passes, start_cpu = len(metrics.passes), len(CPU)
    manifest = job_manifest("wide", NS, replicas=args.wide_replicas, nprocPerNode=8)
    client.request("POST", path_of(JOBS, PLURAL, NS), manifest)
    report["wide_ranks"] = args.wide_replicas * 8
    report["wide_running_s"] = round(wait_running(client, ["wide"], args.timeout), 2)
    wide_passes = metrics.passes[start_passes:]
    report["wide_p50_s"], report["wide_p99_s"] = round(pct(wide_passes, 50), 4), round(pct(wide_passes, 99), 4)
    wide_cpu = CPU[start_cpu:]
    report["wide_cpu_p50_s"], report["wide_cpu_p99_s"] = round(pct(wide_cpu, 50), 4), round(pct(wide_cpu, 99), 4)


if __name__ == "__main__":
    main()
