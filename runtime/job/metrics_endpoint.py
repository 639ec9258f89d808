"""Where a rank serves /metrics: a pod's declared port, or a local run's port found by binding it.

In a pod the operator declares containerPort spec.metrics.port + local rank, so that port and no other is served,
on every interface; a taken one is a configuration error naming spec.metrics.port.

`zerotrain run` must never collide with another run or a test beside it, so no port is chosen ahead of its use:
each rank binds its own on 127.0.0.1, the bind itself being the test. Rank r tries first + r, then first + r + N,
first + r + 2N, ... (N ranks), so the ranks of one run never try the same port and a free range stays the same
run after run (a Prometheus configured once keeps scraping). First port 0 takes any port the system hands out.
Each rank then writes the port it holds to the run's report directory, and the launcher says where they are.
The server sets SO_REUSEADDR (http.server does), so a port a scrape left in TIME_WAIT is free to it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from zerotrain.pod_contract import METRICS_ADDR_ENV, METRICS_REPORT_ENV, METRICS_SEARCH_ENV, metrics_port

LOCAL_SETTING = "--metrics-port"
LAST_PORT = 65535


@dataclass(frozen=True)
class Endpoint:
    """The ports one rank may serve on, and the setting a user changes to move them."""

    addr: str
    """Interface to listen on."""
    first: int
    """The port tried first; 0 lets the system choose."""
    stride: int
    """0: `first` only (a pod's declared port); else the step to the next port to try."""
    setting: str
    """The user's setting that chose the ports (spec.metrics.port, or `zerotrain run --metrics-port`)."""
    report_dir: Path | None = None
    """Where the rank writes the port it got (`zerotrain run` reads it)."""

    def candidates(self) -> Iterator[int]:
        """Ports to try, in order."""
        if self.first == 0 or self.stride == 0:
            yield self.first
            return
        yield from range(self.first, LAST_PORT + 1, self.stride)

    def searches(self) -> bool:
        """A taken port moves on to the next instead of failing."""
        return self.stride > 0 and self.first > 0


def metrics_endpoint(base_port: int, local_rank: int, nproc: int, env: Mapping[str, str] | None = None) -> Endpoint:
    """This local rank's Endpoint: spec.metrics.port + local rank in a pod; a search from the launcher's first port
    (ZEROTRAIN_METRICS_SEARCH) on 127.0.0.1 under `zerotrain run`."""
    e = os.environ if env is None else env
    search = e.get(METRICS_SEARCH_ENV)
    report = e.get(METRICS_REPORT_ENV)
    report_dir = Path(report) if report else None
    if search is None or search == "":
        addr = e.get(METRICS_ADDR_ENV) or "0.0.0.0"
        return Endpoint(addr, metrics_port(base_port, local_rank), 0, "spec.metrics.port", report_dir)
    first = int(search)
    addr = e.get(METRICS_ADDR_ENV) or "127.0.0.1"
    return Endpoint(addr, first + local_rank if first else 0, max(1, nproc), LOCAL_SETTING, report_dir)


def report_port(endpoint: Endpoint, rank: int, port: int) -> None:
    """Write `port` for the launcher, atomically (it reads the file the moment it appears)."""
    if endpoint.report_dir is None:
        return
    record = {"rank": rank, "addr": endpoint.addr, "port": port, "wanted": endpoint.first}
    tmp = endpoint.report_dir / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(endpoint.report_dir / f"rank-{rank}.json")


@dataclass(frozen=True)
class Served:
    """Where one rank of a local run serves /metrics."""

    rank: int
    """The rank."""
    addr: str
    """Its interface."""
    port: int
    """The port it holds."""
    wanted: int
    """The port it tried first (0: any)."""

    @property
    def target(self) -> str:
        return f"{self.addr}:{self.port}"


def read_ports(report_dir: Path) -> list[Served]:
    """What the ranks reported so far, by rank."""
    served = []
    for path in report_dir.glob("rank-*.json"):
        record = json.loads(path.read_text())
        served.append(Served(int(record["rank"]), str(record["addr"]), int(record["port"]), int(record["wanted"])))
    return sorted(served, key=lambda s: s.rank)
