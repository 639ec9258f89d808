"""`zerotrain top JOB`: a live view of a job without Grafana (`monitoring.top_view`), from a local run's rank
endpoints or, with --prometheus, from the Prometheus that the chart's monitors feed."""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.live import Live

from zerotrain.errors import UserError
from zerotrain.monitoring import top_sources, top_view
from zerotrain.monitoring.top_sources import Sample

DESCRIPTION = """\
`zerotrain top JOB`: watch a job live, without Grafana. Per rank: model-state memory held against the plan, the
step split since the last refresh (data wait, compute, collective wait, the rest), tokens/s and a straggler mark;
the job's step and goodput (where its time went).

JOB is the job's metadata.name. Without --prometheus, top reads the newest running local `zerotrain run` of that
job (its ranks' /metrics on 127.0.0.1). With --prometheus URL it reads a cluster job's series from that
Prometheus (the chart's PodMonitor and the operator's ServiceMonitor feed it).

q or Ctrl-C quits. Exit status 2 when the job has no run to watch, the run serves no metrics, or Prometheus does
not answer."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("top", help="a live view of a job's ranks and goodput", description=DESCRIPTION)
    p.add_argument("job", help="the job's metadata.name")
    p.add_argument("--prometheus", metavar="URL", help="read a cluster job from this Prometheus")
    p.add_argument("--namespace", "-n", default="default", help="the job's namespace (with --prometheus)")
    p.add_argument("--log-dir", help="a local run's --log-dir, when it was given one (default: every run's)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    p.set_defaults(func=run)


def _source(args: argparse.Namespace) -> tuple[str, Callable[[], list[Sample]], list[Sample]]:
    """(what the header says, a function reading the series, the series it read first), or UserError when there
    is nothing to read."""
    if args.prometheus:
        url, ns, job = args.prometheus, args.namespace, args.job
        first = top_sources.query_prometheus(url, ns, job)
        if not any("rank" in s.labels or s.name.startswith("zerotrain_operator_") for s in first):
            raise UserError(
                f"no series of job {job!r} in namespace {ns!r} at {url}: check the name and --namespace, and that "
                "the chart's monitors are on (podMonitor.enabled, serviceMonitor.enabled)"
            )
        return f"{ns} via {url}", lambda: top_sources.query_prometheus(url, ns, job), first
    local = top_sources.find_local_run(args.job, Path(args.log_dir) if args.log_dir else None)
    if not (first := top_sources.scrape_local(local)):
        raise UserError(f"job {args.job!r}: none of its ranks answers at {', '.join(local.targets)}")
    return f"local, pid {local.pid}", lambda: top_sources.scrape_local(local), first


def run(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise UserError(f"--interval: got {args.interval}; give a number of seconds above 0, e.g. 1")
    where, read, now = _source(args)
    console = Console()
    quit_keys = threading.Event()
    before: list[Sample] | None = None
    note = ""
    with _keys(quit_keys), Live(console=console, auto_refresh=False, transient=False) as live:
        try:
            while not quit_keys.is_set():
                now = now if before is None else read()  # the first refresh shows what _source already read
                if not now:
                    note = "the run no longer answers: it ended"
                    if before is not None:
                        live.update(top_view.render(top_view.build(args.job, where, before), note), refresh=True)
                    break
                live.update(top_view.render(top_view.build(args.job, where, now, before)), refresh=True)
                before = now
                quit_keys.wait(args.interval)
        except KeyboardInterrupt:
            pass
    if note:
        console.print(note)
    return 0


@contextlib.contextmanager
def _keys(pressed: threading.Event) -> Iterator[None]:
    """Sets `pressed` when q is typed on the terminal (keys are read one at a time, not echoed, while top runs)."""
    if not sys.stdin.isatty():
        yield
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready and os.read(fd, 1) in (b"q", b"Q"):
                pressed.set()
                return

    tty.setcbreak(fd)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield
    finally:
        stop.set()
        reader.join(timeout=1)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
