"""Where an operator bench runs: a fresh KMock emulator in a process of its own, or, with ZEROTRAIN_E2E_KUBECONFIG
naming a real cluster, a throw-away namespace there (the CRD installed if missing, or one line saying to install
it). `python bench/operator/bench_server.py` is the emulator process itself: it prints its URL, serves until its stdin
closes, then prints what it served."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import kubernetes  # noqa: E402
from e2e.cluster import KUBECONFIG_ENV, real_cluster_setup, real_cluster_teardown, requests_served  # noqa: E402


@dataclass
class Server:
    """The server a bench phase runs against, and the namespace it may use."""

    cfg: kubernetes.client.Configuration
    namespace: str
    served: collections.Counter[str] = field(default_factory=collections.Counter)
    """What the server answered during the phase, filled in as it ends: by client and call from the emulator's
    record; by call alone from a real server's apiserver_request_total (every client's, its controllers' too)."""


@contextlib.contextmanager
def server(namespace: str = "default") -> Iterator[Server]:
    """A fresh emulator (its jobs in `namespace`), or a throw-away namespace on the real cluster."""
    if path := os.environ.get(KUBECONFIG_ENV):
        cluster = real_cluster_setup(path)
        where = Server(cluster.configuration, cluster.namespace)
        before = requests_served(cluster)
        try:
            yield where
        finally:
            where.served.update(requests_served(cluster) - before)
            real_cluster_teardown(cluster)
        return
    proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    cfg = kubernetes.client.Configuration()
    cfg.host = proc.stdout.readline().decode().strip()
    where = Server(cfg, namespace)
    try:
        yield where
    finally:
        proc.stdin.close()
        out = proc.stdout.read()  # its record, printed as it ends: read, so a full pipe never holds it
        proc.wait(timeout=30)
        if out.strip():
            where.served.update(json.loads(out))


def serve_emulator() -> None:
    """The emulator process: the e2e tests' emulator on a free 127.0.0.1 port, printed as its URL, until stdin
    closes; then what it served, by client (kopf's requests bypass the operator's counted client) and call."""
    import kmock
    from e2e.emulator import ZeroEmulator

    async def run() -> None:
        async with ZeroEmulator() as emu, kmock.Server(emu):
            print(str(emu.url).rstrip("/"), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
            served = collections.Counter(
                f"{s.user_agent.split('/')[0]} {s.call.verb} {s.call.resource}" for s in emu.served
            )
            print(json.dumps(served), flush=True)

    asyncio.run(run())


if __name__ == "__main__":
    serve_emulator()
