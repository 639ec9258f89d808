"""Where `zerotrain top` reads a job's series: a local run's rank endpoints (found through the record `zerotrain run`
leaves in its log directory), or the Prometheus that the chart's monitors feed. Both give the same `Sample`s, and
a source that cannot answer raises `UserError` with one line saying why."""

from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from zerotrain.errors import UserError

RUN_RECORD = "metrics.json"
"""The file in a local run's log directory that says which job it runs, its process and where its ranks serve."""
TIMEOUT_S = 2.0
# The series the view reads (rank series by their exposition names; the operator's per-job goodput).
WANTED = (
    "zerotrain_memory_bytes",
    "zerotrain_memory_predicted_bytes",
    "zerotrain_step_phase_seconds_total",
    "zerotrain_tokens_per_second",
    "zerotrain_straggler",
    "zerotrain_straggler_ratio",
    "zerotrain_goodput_seconds",
    "zerotrain_step",
    "zerotrain_training_steps",
    "zerotrain_operator_job_goodput_seconds",
)


@dataclass(frozen=True)
class Sample:
    """One series' value now."""

    name: str
    labels: dict[str, str]
    value: float


def log_root() -> Path:
    """Where `zerotrain run` keeps each run's log directory (`run.default_log_dir`)."""
    return Path(tempfile.gettempdir(), f"zerotrain-logs-{os.getuid()}")


@dataclass(frozen=True)
class LocalRun:
    """A local run of the job, as its record says."""

    job: str
    pid: int
    targets: list[str]
    """host:port of each rank's /metrics, by rank."""
    log_dir: Path


def write_run_record(log_dir: Path, job: str, targets: list[str]) -> None:
    """What `zerotrain run` leaves for `zerotrain top` once every rank serves: the job, the run's process, the
    directory it was started from and the ranks' endpoints."""
    record = {"job": job, "pid": os.getpid(), "cwd": os.getcwd(), "targets": targets}
    (log_dir / RUN_RECORD).write_text(json.dumps(record) + "\n")


def alive(pid: int) -> bool:
    """Whether process `pid` exists (one this user cannot signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_local_run(job: str, where: Path | None = None) -> LocalRun:
    """The newest running local run of `job`: in log directory `where`; else among the runs under the log root, the
    newest started from this working directory. UserError when there is none, when it serves no metrics, or when
    the job's runs were all started from elsewhere (naming them: another shell's, or another user's, run is never
    watched without --log-dir)."""
    root = where or log_root()
    dirs = [root] if (root / RUN_RECORD).is_file() else sorted(root.glob(f"{job}-*"), key=lambda d: d.stat().st_mtime)
    running: list[tuple[Path, dict[str, Any]]] = []
    for d in reversed(dirs):
        record = d / RUN_RECORD
        if record.is_file():
            got = json.loads(record.read_text())
            if got.get("job") == job and alive(int(got["pid"])):
                running.append((d, got))
    here = os.getcwd()
    for d, got in running:
        if where is not None or got.get("cwd") == here:
            return LocalRun(job, int(got["pid"]), [str(t) for t in got["targets"]], d)
    if running:
        found = "; ".join(f"{d} (started from {got.get('cwd')}, pid {got.get('pid')})" for d, got in running)
        raise UserError(
            f"job {job!r} has no local run started from this directory ({here}), only: {found}; watch one with "
            "`zerotrain top JOB --log-dir DIR`"
        )
    if not dirs:
        raise UserError(
            f"no local run of job {job!r} under {root}: start one with `zerotrain run` (the job's metadata.name), "
            "or give --prometheus URL for a job on a cluster"
        )
    raise UserError(
        f"job {job!r} has no local run serving metrics (newest logs: {dirs[-1]}): it ended, or it runs with metrics "
        "off (spec.metrics.enabled: false or --no-metrics); run it with metrics on to watch it"
    )


def scrape_local(run: LocalRun) -> list[Sample]:
    """Every rank's wanted series, read from its /metrics; a rank that does not answer gives none."""
    samples: list[Sample] = []
    for target in run.targets:
        try:
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=TIMEOUT_S) as r:
                text = r.read().decode()
        except (OSError, urllib.error.URLError):
            continue
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in WANTED:
                    samples.append(Sample(s.name, dict(s.labels), float(s.value)))
    return samples


def query_prometheus(url: str, namespace: str, job: str) -> list[Sample]:
    """The job's wanted series from Prometheus' instant-query API, in one request."""
    names = "|".join(WANTED)
    selector = f'{{__name__=~"{names}", namespace="{namespace}", zerotrain_job="{job}"}}'
    query = urllib.parse.urlencode({"query": selector})
    address = f"{url.rstrip('/')}/api/v1/query?{query}"
    try:
        with urllib.request.urlopen(address, timeout=TIMEOUT_S) as r:
            answer = json.loads(r.read().decode())
    except (OSError, urllib.error.URLError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(
            f"--prometheus: {url} does not answer ({reason}); give the URL of a running Prometheus"
        ) from None
    if answer.get("status") != "success":
        raise UserError(f"--prometheus: {url} refused the query: {answer.get('error', answer)}")
    samples = []
    for series in answer["data"]["result"]:
        labels = dict(series["metric"])
        name = labels.pop("__name__")
        samples.append(Sample(name, labels, float(series["value"][1])))
    return samples
