"""`zerotrain run JOB.yaml`: train what a ZeroTrainingJob describes, locally, as N processes on gloo.

The ranks start through the same launcher the pods use (torch's elastic launcher, static rendezvous on
127.0.0.1), as CPU processes (CUDA hidden) on gloo. A progress bar follows rank 0's progress file; at the end
a table shows each rank's memory by category (measured next to the ZeRO formula) and the bytes it communicated
by op. The exit status is the ranks'.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from zerotrain.commands.run_report import render_outcome, render_summary, throughput
from zerotrain.errors import UserError
from zerotrain.manifest import load_job
from zerotrain.spec import ZeroTrainingJob


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="train a ZeroTrainingJob manifest locally", description=__doc__)
    p.add_argument("manifest", help="path of the ZeroTrainingJob YAML")
    p.add_argument("--nproc", type=int, default=None, help="ranks to start (default spec.replicas × nprocPerNode)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default spec.training.steps)")
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save sharded checkpoints here every spec.checkpoint.intervalSteps and resume from the newest good "
        "one on the next run (default: no checkpoints)",
    )
    p.add_argument("--summary-file", default=None, help="also write rank 0's JSON summary (losses, reports) here")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="first port to try for the ranks' /metrics on 127.0.0.1 (default spec.metrics.port); a taken port is "
        "skipped and the next free one used",
    )
    p.add_argument("--no-metrics", action="store_true", help="serve no /metrics (as spec.metrics.enabled: false)")
    p.add_argument(
        "--log-dir",
        default=None,
        help="keep each rank's stdout, stderr and traceback under this directory (default: a new directory in the "
        "system's temporary directory, printed at the start)",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="print every rank's full traceback (also ZEROTRAIN_DEBUG=1); without it an error the runtime "
        "understands is one line, and tracebacks go to each rank's log directory",
    )
    p.add_argument(
        "--prometheus-config",
        default=None,
        metavar="FILE",
        help="write a Prometheus configuration that scrapes this run's ranks to FILE (`prometheus --config.file`)",
    )
    p.set_defaults(func=run)


def free_ports(first: int, count: int, host: str = "127.0.0.1", last: int = 65535) -> list[int]:
    """`count` ports from `first` up that nobody listens on right now (a taken one is skipped)."""
    found: list[int] = []
    port = first
    while len(found) < count and port <= last:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
                found.append(port)
            except OSError:
                pass
        port += 1
    if len(found) < count:
        raise UserError(
            f"--metrics-port: got {first}; found only {len(found)} free port(s) of {count} from there up to {last}; "
            "pick a lower port or pass --no-metrics"
        )
    return found


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


def metrics_ports(job: ZeroTrainingJob, nproc: int, args: argparse.Namespace, console: Console) -> list[int]:
    """Free ports for the ranks' /metrics (none when disabled), said on the console; FILE written if asked."""
    if args.no_metrics or not job.spec.metrics.enabled:
        return []
    first = args.metrics_port if args.metrics_port is not None else job.spec.metrics.port
    if not 1024 <= first <= 65535:
        raise UserError(f"--metrics-port: got {first}; must be between 1024 and 65535; pass a free unprivileged port")
    ports = free_ports(first, nproc)
    if ports[-1] != first + nproc - 1:
        taken = sorted(set(range(first, ports[-1] + 1)) - set(ports))
        console.print(f"metrics: port(s) {', '.join(map(str, taken))} taken, skipped", highlight=False)
    targets = [f"127.0.0.1:{p}" for p in ports]
    console.print(
        "metrics: " + ", ".join(f"rank {r} http://{t}/metrics" for r, t in enumerate(targets)),
        soft_wrap=True,
        highlight=False,
    )
    if args.prometheus_config:
        name = str(job.metadata.get("name") or "zerotrain")
        Path(args.prometheus_config).write_text(yaml.safe_dump(scrape_config(name, targets), sort_keys=False))
        console.print(Text(f"metrics: Prometheus configuration written to {args.prometheus_config}"))
    return ports


def effective_job(path: str, nproc: int | None, steps: int | None) -> tuple[ZeroTrainingJob, int]:
    """The manifest with command-line overrides applied, and the number of ranks to start."""
    job = load_job(path)
    if nproc is not None and nproc < 1:
        raise UserError(f"--nproc: got {nproc}; must be at least 1; pass the number of ranks to start")
    if steps is not None:
        if steps < 1:
            raise UserError(f"--steps: got {steps}; must be at least 1; pass the number of optimizer steps")
        training = job.spec.training.model_copy(update={"steps": steps})
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"training": training})})
    return job, nproc if nproc is not None else job.spec.world_size


class ProgressTail(threading.Thread):
    """Follows rank 0's JSON-lines progress file into a rich progress bar."""

    def __init__(self, path: Path, progress: Progress, task: TaskID) -> None:
        super().__init__(daemon=True)
        self.path, self.progress, self.task = path, progress, task
        self.stop = threading.Event()
        self._offset = 0
        self._partial = ""

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open() as f:
            f.seek(self._offset)
            chunk = f.read()
            self._offset = f.tell()
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()
        for line in filter(None, lines):
            rec = json.loads(line)
            if "checkpoint" in rec:
                # A path must stay on one line to be copied.
                self.progress.console.print(
                    Text(f"checkpoint committed at step {rec['checkpoint_step']}: {rec['checkpoint']}"), soft_wrap=True
                )
                continue
            if "resumed" in rec:
                self.progress.console.print(
                    Text(f"resumed from {rec['resumed']} at step {rec['resumed_step']}"), soft_wrap=True
                )
                continue
            self.progress.update(
                self.task,
                completed=rec["step"],
                total=rec["steps"],
                loss=f"{rec['loss']:.4f}",
                tps=throughput(rec),
            )

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.poll()
        self.poll()


def run(args: argparse.Namespace) -> int:
    job, nproc = effective_job(args.manifest, args.nproc, args.steps)
    # Imported here so `zerotrain --help` and the other subcommands don't pay for torch.
    from zerotrain.runtime.failures import DEBUG_ENV
    from zerotrain.runtime.launch import PROGRESS_ENV, SUMMARY_ENV, preflight, scoped_environ
    from zerotrain.runtime.metrics import METRICS_ADDR_ENV, METRICS_PORTS_ENV
    from zerotrain.runtime.resume import CHECKPOINT_DIR_ENV

    preflight(job.spec)
    console = Console()
    with tempfile.TemporaryDirectory(prefix="zerotrain-run-") as tmp:
        config = Path(tmp, "job.json")
        config.write_text(job.model_dump_json(by_alias=True, exclude_none=True))
        progress_file, summary_file = Path(tmp, "progress.jsonl"), Path(tmp, "summary.json")
        name = job.metadata.get("name", Path(args.manifest).stem)
        console.print(
            Text.assemble(
                (str(name), "bold"),
                f": stage {job.spec.zero.stage.value}, {nproc} rank(s) on gloo, {job.spec.training.steps} steps, "
                f"entry point {job.spec.entrypoint}",
            )
        )
        log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix=f"zerotrain-{name}-logs-"))
        console.print(Text(f"logs: {log_dir.resolve()}"), soft_wrap=True)
        # Local runs are CPU ranks on gloo even on a GPU machine: N ranks could not share one GPU under NCCL.
        local_env = {e.name: e.value for e in job.spec.env}  # spec.env, as the pods get it
        local_env |= {PROGRESS_ENV: str(progress_file), SUMMARY_ENV: str(summary_file), "CUDA_VISIBLE_DEVICES": ""}
        local_env[DEBUG_ENV] = "1" if args.debug or os.environ.get(DEBUG_ENV) == "1" else "0"
        if args.checkpoint_dir:
            local_env[CHECKPOINT_DIR_ENV] = str(Path(args.checkpoint_dir).resolve())
        if ports := metrics_ports(job, nproc, args, console):
            local_env |= {METRICS_PORTS_ENV: ",".join(map(str, ports)), METRICS_ADDR_ENV: "127.0.0.1"}
        with scoped_environ(local_env):
            outcome = _train_with_progress(job, config, nproc, progress_file, console, log_dir)
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
    if summary is not None and args.summary_file:
        Path(args.summary_file).write_text(json.dumps(summary, indent=2) + "\n")
    if summary is not None:
        render_summary(summary, console)
    render_outcome(outcome, console)
    return outcome.exit_code


def _train_with_progress(
    job: ZeroTrainingJob, config: Path, nproc: int, progress_file: Path, console: Console, log_dir: Path
) -> Any:
    from zerotrain.runtime.launch import launch, local_plan
    from zerotrain.runtime.task import is_script

    run_id = str(job.metadata.get("name", "local"))
    if is_script(job.spec.entrypoint):  # a script reports nothing to follow
        return launch(job.spec, config, local_plan(nproc), run_id=run_id, quiet=True, log_dir=log_dir)
    columns = (
        TextColumn("[bold]training"),
        BarColumn(),
        TextColumn("step {task.completed}/{task.total}", markup=False),
        TextColumn("loss {task.fields[loss]}", markup=False),
        TextColumn("{task.fields[tps]}", markup=False),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("train", total=job.spec.training.steps, loss="-", tps="-")
        tail = ProgressTail(progress_file, progress, task)
        tail.start()
        try:
            return launch(job.spec, config, local_plan(nproc), run_id=run_id, quiet=True, log_dir=log_dir)
        finally:
            tail.stop.set()
            tail.join()
