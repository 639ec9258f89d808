"""`zerotrain run`'s metrics: the ports the ranks serve /metrics on, where each landed, and a Prometheus
configuration that scrapes them (`--prometheus-config`)."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.text import Text

from zerotrain.commands import runtime_calls as rt
from zerotrain.errors import UserError
from zerotrain.monitoring.top_sources import write_run_record
from zerotrain.spec import ZeroTrainingJob


def scrape_config(job: str, targets: list[str], interval_s: float = 5.0) -> dict[str, Any]:
    """A Prometheus configuration scraping `targets`, labelled as the chart's PodMonitor labels pods.

    honor_labels keeps the ranks' own `zerotrain_job` (the same value) instead of renaming it `exported_...`.
    """
    return {
        "global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
        "scrape_configs": [
            {
                "job_name": "zerotrain",
                "honor_labels": True,
                "static_configs": [{"targets": targets, "labels": {"zerotrain_job": job}}],
            }
        ],
    }


def first_metrics_port(job: ZeroTrainingJob, args: argparse.Namespace) -> int | None:
    """The first port the ranks try for /metrics (None when metrics are off); UserError when out of range."""
    if not job.spec.metrics.enabled:
        return None
    first = int(args.metrics_port if args.metrics_port is not None else job.spec.metrics.port)
    if first != 0 and not 1024 <= first <= 65535:
        raise UserError(
            f"--metrics-port: got {first}; must be 0 (any free ports) or between 1024 and 65535; pass a free "
            "unprivileged port"
        )
    return first


def metrics_env(first: int, report_dir: Path) -> dict[str, str]:
    """What the ranks need to serve /metrics on 127.0.0.1 from `first` up and say which port each holds."""
    from zerotrain.pod_contract import METRICS_ADDR_ENV, METRICS_REPORT_ENV, METRICS_SEARCH_ENV

    report_dir.mkdir()
    return {METRICS_SEARCH_ENV: str(first), METRICS_ADDR_ENV: "127.0.0.1", METRICS_REPORT_ENV: str(report_dir)}


class PortWatch(threading.Thread):
    """Says where the ranks serve /metrics once each has bound its port (and writes --prometheus-config then)."""

    def __init__(
        self, report_dir: Path, nproc: int, job: str, config: str | None, console: Console, log_dir: Path
    ) -> None:
        super().__init__(daemon=True)
        self.report_dir, self.nproc, self.job, self.config, self.console = report_dir, nproc, job, config, console
        self.log_dir = log_dir
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            served = rt.read_ports(self.report_dir)
            if len(served) == self.nproc:
                self.announce(served)
                return

    def announce(self, served: list[Any]) -> None:
        say = self.console.print
        say(Text("metrics: " + ", ".join(f"rank {s.rank} http://{s.target}/metrics" for s in served)), soft_wrap=True)
        write_run_record(self.log_dir, self.job, [s.target for s in served])  # for `zerotrain top`
        moved = [s for s in served if s.wanted not in (0, s.port)]
        if moved:
            say(Text("metrics: " + ", ".join(f"port {s.wanted} taken, rank {s.rank} on {s.port}" for s in moved)))
        if self.config:
            text = yaml.safe_dump(scrape_config(self.job, [s.target for s in served]), sort_keys=False)
            Path(self.config).write_text(text)
            say(Text(f"metrics: Prometheus configuration written to {self.config}"), soft_wrap=True)
