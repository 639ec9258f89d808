"""`zerotrain run JOB.yaml`: train what a ZeroTrainingJob describes, locally, as N processes on gloo.

The ranks start through the same launcher the pods use (torch's elastic launcher, static rendezvous on
127.0.0.1), as CPU processes (CUDA hidden) on gloo. A progress bar follows rank 0's progress file; at the end
a table shows each rank's memory by category (measured next to the ZeRO formula) and the bytes it communicated
by op.

Exit status: 0 when every step ran; 130 when Ctrl-C stopped the run (every rank finished its step and saved; a
second Ctrl-C stops them at once), 143 when SIGTERM did, so `zerotrain run job.yaml && next` never continues after
unfinished work (a pod's launcher exits 0 there instead: the operator reads its termination message); a failed
rank's own status otherwise (2: a configuration error).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from zerotrain.commands import runtime_calls as rt
from zerotrain.commands.run_metrics import PortWatch, first_metrics_port, metrics_env
from zerotrain.commands.run_report import local_outcome, render_outcome, render_summary, throughput
from zerotrain.errors import EXIT_BAD_INPUT, UserError
from zerotrain.goodput import progress
from zerotrain.local_paths import load_job
from zerotrain.monitoring import top_sources
from zerotrain.plan.stage_choice import StageChoice, local_rank_memory, pod_memory_share, resolve_stage
from zerotrain.pod_contract import INVALID_CONFIG_OUTCOME
from zerotrain.spec import LrDecay, ZeroTrainingJob

KEEP_LOG_DIRS = 20
KEEP_ENDED_S = 3600
"""A run's logs are kept at least this long after it ended, however many newer runs there are."""
RUN_FILE = "run.json"
"""A run's record in its log directory: which job, which process, started from where, and when it ended."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="train a ZeroTrainingJob manifest locally", description=__doc__)
    p.add_argument("manifest", help="path of the ZeroTrainingJob YAML")
    p.add_argument("--nproc", type=int, default=None, help="ranks to start (default spec.replicas × nprocPerNode)")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps (default: spec.training.steps); a learning-rate schedule without decaySteps decays "
        "over these steps instead, which the run says in a line",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save sharded checkpoints here every spec.checkpoint.intervalSteps and resume from the newest good "
        "one on the next run (default: no checkpoints)",
    )
    p.add_argument(
        "--summary-file",
        default=None,
        help="also write the run's JSON summary here on every exit: how it ended (outcome, message, exitCode) "
        "and, when it finished, rank 0's losses and per-rank reports",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="first port for the ranks' /metrics on 127.0.0.1 (default spec.metrics.port): rank r tries port + r, "
        "and a taken one is skipped; 0: any free ports",
    )
    p.add_argument("--no-metrics", action="store_true", help="serve no /metrics (as spec.metrics.enabled: false)")
    p.add_argument(
        "--log-dir",
        default=None,
        help="keep each rank's stdout, stderr and traceback under this directory (default: a new directory under "
        f"$TMPDIR/zerotrain-logs-UID/, printed at the start; the newest {KEEP_LOG_DIRS} there are kept, and any run "
        "until an hour after it ended)",
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
        help="write a Prometheus configuration that scrapes this run's ranks to FILE, relative to the working "
        "directory, once every rank serves (`prometheus --config.file FILE`)",
    )
    p.set_defaults(func=run)


def local_stage(job: ZeroTrainingJob, nproc: int) -> tuple[ZeroTrainingJob, StageChoice | None]:
    """The job with `stage: auto` chosen against this machine's ranks (`autostage.local_rank_memory`); a share
    the rank process fills by itself is refused first, as admission refuses it (nothing is left to choose with)."""
    from zerotrain.plan.host import below_baseline

    if (refusal := below_baseline(job.spec)) is not None:
        raise UserError(refusal)
    try:
        spec, choice = resolve_stage(job.spec, device_memory=local_rank_memory(job.spec, nproc))
    except ValueError as e:
        raise UserError(str(e)) from None
    return job.model_copy(update={"spec": spec}), choice


def admit_locally(manifest: str, job: ZeroTrainingJob, nproc: int) -> None:
    """The operator's admission, as `zerotrain validate` makes it, of the job this run starts (its stage chosen
    here, at --nproc ranks when they make whole pods): what validate refuses, run refuses before any rank starts."""
    from zerotrain.commands.validate import admitted

    raw = job.model_dump(mode="json", by_alias=True, exclude_none=True)["spec"]
    if nproc != job.spec.world_size and nproc % job.spec.nproc_per_node == 0 and job.spec.elastic is None:
        raw["replicas"] = nproc // job.spec.nproc_per_node
    admitted(manifest, raw, str(job.metadata.get("name") or ""))


def steps_note(manifest_steps: int, job: ZeroTrainingJob) -> str | None:
    """What --steps does to a learning-rate schedule that decays over the run (no decaySteps): it decays over the
    new number of steps, so the run is not the first steps of the manifest's run."""
    schedule, steps = job.spec.training.lr_schedule, job.spec.training.steps
    if schedule is None or schedule.decay_steps is not None or schedule.decay is LrDecay.CONSTANT:
        return None
    if steps == manifest_steps:
        return None
    first = schedule.warmup_steps + 1
    return (
        f"--steps {steps}: the learning rate decays ({schedule.decay.value}) over steps {first}-{steps}, not the "
        f"manifest's {first}-{manifest_steps}; set spec.training.lrSchedule.decaySteps to keep the manifest's schedule"
    )


def effective_job(
    path: str, nproc: int | None, steps: int | None, no_metrics: bool = False, checkpoint_dir: str | None = None
) -> tuple[ZeroTrainingJob, int]:
    """The manifest with command-line overrides applied, and the number of ranks to start. The checkpoint root is
    --checkpoint-dir's, or none (spec.checkpoint.path names a directory inside the pods)."""
    job = load_job(path)
    root = str(Path(checkpoint_dir).resolve()) if checkpoint_dir else None
    checkpoint = job.spec.checkpoint.model_copy(update={"path": root})
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"checkpoint": checkpoint})})
    if no_metrics:  # the ranks read the spec: off here is off there
        metrics = job.spec.metrics.model_copy(update={"enabled": False})
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"metrics": metrics})})
    if nproc is not None and nproc < 1:
        raise UserError(f"--nproc: got {nproc}; must be at least 1; pass the number of ranks to start")
    if steps is not None:
        if steps < 1:
            raise UserError(f"--steps: got {steps}; must be at least 1; pass the number of optimizer steps")
        schedule = job.spec.training.lr_schedule
        if schedule is not None and schedule.warmup_steps > steps:
            raise UserError(
                f"--steps: got {steps}, fewer than spec.training.lrSchedule.warmupSteps ({schedule.warmup_steps}): "
                f"the run would end still warming up; pass at least --steps {schedule.warmup_steps}"
            )
        training = job.spec.training.model_copy(update={"steps": steps})
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"training": training})})
    return job, nproc if nproc is not None else job.spec.world_size


class ProgressTail(threading.Thread):
    """Follows rank 0's JSON-lines progress file into a rich progress bar, or where the output is not a terminal (a
    log file, a pipe, CI) into one plain line per logged step (every spec.training.logEvery steps, the first and
    the last), as it happens; keeps how the run stopped, if it did."""

    def __init__(self, path: Path, progress: Progress, task: TaskID) -> None:
        super().__init__(daemon=True)
        self.path, self.progress, self.task = path, progress, task
        self.stop = threading.Event()
        self.stopped: dict[str, Any] | None = None
        self.straggling = False
        self.resumed = 0
        """The step the run resumed after (0: from the start)."""
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
            self.show(json.loads(line))

    def show(self, rec: dict[str, Any]) -> None:
        say = self.progress.console.print
        if "checkpoint" in rec:  # a path must stay on one line to be copied
            say(Text(f"checkpoint committed at step {rec['checkpoint_step']}: {rec['checkpoint']}"), soft_wrap=True)
        elif "note" in rec:
            say(Text(rec["note"]), soft_wrap=True)
        elif "resumed" in rec:
            say(Text(f"resumed from {rec['resumed']} at step {rec['resumed_step']}"), soft_wrap=True)
            self.progress.update(self.task, completed=rec["resumed_step"])
            self.resumed = int(rec["resumed_step"])
        elif "eval_loss" in rec:
            say(Text(f"evaluation after step {rec['eval_step']}: loss {rec['eval_loss']:.4f} ({rec['eval_s']:.1f} s)"))
        elif "stragglers" in rec:
            for message in rec["stragglers"]:
                say(Text(f"straggler after step {rec['stragglers_step']}: {message}"), soft_wrap=True)
            if not rec["stragglers"] and self.straggling:
                say(Text(f"after step {rec['stragglers_step']} every rank keeps pace again"), soft_wrap=True)
            self.straggling = bool(rec["stragglers"])
        elif "stopped" in rec:
            self.stopped = rec
            self.progress.update(self.task, completed=rec["stopped"])
        else:
            loss, lr = f"{rec['loss']:.4f}", f"{rec['lr']:.3g}" if "lr" in rec else "-"
            tps = throughput(rec)
            # The time left at this run's training rate (evaluation left out), as status.progress has it.
            ran = rec["step"] - self.resumed
            eta = progress(ran, rec["steps"] - self.resumed, float(rec.get("elapsed_s") or 0.0)).eta or "-"
            self.progress.update(
                self.task, completed=rec["step"], total=rec["steps"], loss=loss, lr=lr, tps=tps, eta=eta
            )
            if not self.progress.console.is_terminal:  # the bar draws only on a terminal: a log gets lines
                elapsed = f", {rec['elapsed_s']:.1f} s" if "elapsed_s" in rec else ""
                said = f"step {rec['step']}/{rec['steps']}: loss {loss}, lr {lr}, {tps}{elapsed}, eta {eta}"
                say(Text(said), soft_wrap=True)

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.poll()
        self.poll()


def default_log_dir(name: str, root: Path | None = None, keep: int = KEEP_LOG_DIRS) -> Path:
    """A new directory for this run's logs under one parent per user, with a record of the run (`RUN_FILE`: the
    job, this process, the directory it was started from); of the runs beyond the newest `keep`, those that ended
    more than an hour ago are removed, never one still running or just ended (someone may be reading it)."""
    root = root or Path(tempfile.gettempdir(), f"zerotrain-logs-{os.getuid()}")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-", dir=root))
    record = {"job": name, "pid": os.getpid(), "cwd": os.getcwd(), "started": time.time()}
    (path / RUN_FILE).write_text(json.dumps(record) + "\n")
    runs = sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    for old in runs[: max(0, len(runs) - keep)]:
        if old != path and ended_long_ago(old):
            shutil.rmtree(old, ignore_errors=True)
    return path


def ended_long_ago(run: Path, now: float | None = None) -> bool:
    """Whether a run's directory may go: its run ended (or its process is gone) more than KEEP_ENDED_S ago."""
    now = time.time() if now is None else now
    record = run / RUN_FILE
    got: dict[str, Any] = {}
    if record.is_file():
        with contextlib.suppress(ValueError, OSError):
            got = json.loads(record.read_text())
    ended = got.get("ended")
    if ended is None and got.get("pid") is not None and top_sources.alive(int(got["pid"])):
        return False  # still running
    last = float(ended) if ended is not None else run.stat().st_mtime
    return now - last > KEEP_ENDED_S


def mark_ended(log_dir: Path) -> None:
    """Record in the run's directory that it ended, and when (pruning keeps it an hour from now)."""
    record = log_dir / RUN_FILE
    if record.is_file():
        with contextlib.suppress(ValueError, OSError):
            record.write_text(json.dumps({**json.loads(record.read_text()), "ended": time.time()}) + "\n")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UserError as e:  # refused before any rank started: the summary file says so too
        write_summary(args.summary_file, None, INVALID_CONFIG_OUTCOME, str(e), EXIT_BAD_INPUT)
        raise


def _run(args: argparse.Namespace) -> int:
    job, nproc = effective_job(args.manifest, args.nproc, args.steps, args.no_metrics, args.checkpoint_dir)
    if rt.forks(job.spec):  # the ranks' fork server imports torch and the entry point while this process checks
        rt.start_rank_server(rt.rank_preload(job.spec))
    note = steps_note(load_job(args.manifest).spec.training.steps, job) if args.steps is not None else None
    job, choice = local_stage(job, nproc)
    admit_locally(args.manifest, job, nproc)
    # Imported here so `zerotrain --help` and the other subcommands don't pay for torch.
    from zerotrain.pod_contract import DEBUG_ENV, ENTRYPOINT_PATH_ENV, PROGRESS_ENV, RANK_MEMORY_LIMIT_ENV, SUMMARY_ENV

    first_port = first_metrics_port(job, args)
    console = Console()
    # Entry points are found in the working directory and beside the manifest (`runtime.task.add_entrypoint_dirs`).
    beside = {ENTRYPOINT_PATH_ENV: str(Path(args.manifest).resolve().parent)}
    with rt.scoped_environ(beside):
        checked = rt.preflight(job.spec, nproc)
    for line in checked.splitlines()[1:]:  # warnings: what the run will do that the reader may not expect
        console.print(Text(line), soft_wrap=True)
    with tempfile.TemporaryDirectory(prefix="zerotrain-run-") as tmp:
        config = Path(tmp, "job.json")
        config.write_text(job.model_dump_json(by_alias=True, exclude_none=True))
        progress_file, summary_file = Path(tmp, "progress.jsonl"), Path(tmp, "summary.json")
        name = str(job.metadata.get("name", Path(args.manifest).stem))
        console.print(
            Text.assemble(
                (name, "bold"),
                f": stage {job.spec.zero.stage.value}, {nproc} rank(s) on gloo, {job.spec.training.steps} steps, "
                f"entry point {job.spec.entrypoint}",
            )
        )
        log_dir = Path(args.log_dir) if args.log_dir else default_log_dir(name)
        if choice is not None:
            console.print(Text(f"stage auto chose {choice.message}"), soft_wrap=True)
        if note is not None:
            console.print(Text(note), soft_wrap=True)
        console.print(Text(f"logs: {log_dir.resolve()}"), soft_wrap=True)
        # Local runs are CPU ranks on gloo even on a GPU machine: N ranks could not share one GPU under NCCL.
        local_env = {e.name: e.value for e in job.spec.env}  # spec.env, as the pods get it
        local_env |= {PROGRESS_ENV: str(progress_file), SUMMARY_ENV: str(summary_file), "CUDA_VISIBLE_DEVICES": ""}
        local_env |= beside
        if (share := pod_memory_share(job.spec)) is not None:  # limited as a container's memory would be
            local_env[RANK_MEMORY_LIMIT_ENV] = str(share)
        local_env[DEBUG_ENV] = "1" if args.debug or os.environ.get(DEBUG_ENV) == "1" else "0"
        watch = None
        if first_port is not None and not rt.is_script(job.spec.entrypoint):
            local_env |= metrics_env(first_port, Path(tmp, "metrics"))
            watch = PortWatch(Path(tmp, "metrics"), nproc, name, args.prometheus_config, console, log_dir)
        try:
            with rt.scoped_environ(local_env):
                outcome, stopped = _train_with_progress(job, config, nproc, progress_file, console, log_dir, watch)
        finally:
            mark_ended(log_dir)
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
    if summary is not None:
        render_summary(summary, console)
    outcome = local_outcome(outcome, stopped, job.spec.training.steps)
    write_summary(args.summary_file, summary, outcome.reason.value, outcome.summary(), int(outcome.exit_code))
    render_outcome(outcome, console)
    return int(outcome.exit_code)


def write_summary(path: str | None, summary: dict[str, Any] | None, outcome: str, message: str, code: int) -> None:
    """--summary-file, on every exit: rank 0's summary when it wrote one (the run finished), and always how the
    run ended (`outcome`: succeeded, rank-failed, preempted, interrupted or invalid-config; its message; the exit
    status), so a script reading it never finds a stale file or none."""
    if path is None:
        return
    ended = {"outcome": outcome, "message": message, "exitCode": code}
    Path(path).write_text(json.dumps({**(summary or {}), **ended}, indent=2) + "\n")


def _train_with_progress(
    job: ZeroTrainingJob,
    config: Path,
    nproc: int,
    progress_file: Path,
    console: Console,
    log_dir: Path,
    watch: PortWatch | None,
) -> tuple[Any, dict[str, Any] | None]:
    """Launch the ranks and follow them: (the launcher's outcome, rank 0's record of an early stop)."""
    run_id = str(job.metadata.get("name", "local"))

    def say(line: str) -> None:
        console.print(Text(line, style="yellow"))

    def start() -> Any:
        return rt.launch(
            job.spec, config, rt.local_plan(nproc), run_id=run_id, quiet=True, log_dir=log_dir, on_interrupt=say
        )

    if rt.is_script(job.spec.entrypoint):  # a script reports nothing to follow
        return start(), None
    columns = (
        TextColumn("[bold]training"),
        BarColumn(),
        TextColumn("step {task.completed}/{task.total}", markup=False),
        TextColumn("loss {task.fields[loss]}", markup=False),
        TextColumn("lr {task.fields[lr]}", markup=False),
        TextColumn("{task.fields[tps]}", markup=False),
        TimeElapsedColumn(),
        TextColumn("eta {task.fields[eta]}", markup=False),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("train", total=job.spec.training.steps, loss="-", lr="-", tps="-", eta="-")
        tail = ProgressTail(progress_file, progress, task)
        followers: list[ProgressTail | PortWatch] = [tail, *([watch] if watch else [])]
        for follower in followers:
            follower.start()
        try:
            outcome = start()
        finally:
            for follower in followers:
                follower.stop.set()
                follower.join()
        return outcome, tail.stopped  # read after the tail's last poll
