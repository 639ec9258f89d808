"""Starting a job's ranks through torch's own elastic launcher (what `torchrun` runs), in a pod or locally.

Pod environment (set by the operator; read by `python -m zerotrain.runtime --config JOB.yaml`):

- `MASTER_ADDR`: host of node 0, whose launcher serves the rendezvous store (default 127.0.0.1 for one node).
- `MASTER_PORT`: port of that store (default 29500).
- `NNODES`: pods (nodes) in the gang (default WORLD_SIZE / NPROC_PER_NODE, else spec.replicas).
- `NODE_RANK`: this pod's index, 0 … NNODES-1 (default 0).
- `NPROC_PER_NODE`: ranks this pod starts (default spec.nprocPerNode).
- `WORLD_SIZE`: the **total number of ranks** = NNODES × NPROC_PER_NODE, torchrun's meaning (default that product).

WORLD_SIZE counts ranks, not nodes, because that is what every rank sees in torch.distributed; the launcher
checks WORLD_SIZE = NNODES × NPROC_PER_NODE and that both agree with spec.replicas and spec.nprocPerNode,
and refuses a mismatch with exit status 2 (a permanent failure: restarting the gang cannot fix it).

Ranks start with static rendezvous and `max_restarts=0`: the operator restarts the whole gang, the launcher never
restarts a rank on its own. Global rank = NODE_RANK × NPROC_PER_NODE + local rank.

Exit status of the launcher:
- 0: every rank finished; or SIGTERM arrived while no rank had failed (preemption, eviction, the operator
  deleting the pod): it is forwarded to every rank, which finish their step and commit a checkpoint
  (`preemption`), and the launcher exits once all have stopped (torch's shutdown sends SIGTERM, waits
  spec.checkpoint.terminationBudgetSeconds + 5 s, or TORCH_ELASTIC_SHUTDOWN_TIMEOUT when set, then SIGKILLs the
  rest). Ranks that all exit with EXIT_PREEMPTED (SIGTERM sent to them directly) count the same. A preempted pod
  thus exits 0 with a termination message starting with `preempted`, which is how the operator tells it from a
  finished one. A rank that failed before the signal makes it a failure (next line).
- the failing rank's status: a rank failed (the earliest failure wins; a rank killed by signal S counts
  as 128+S). 2 is a configuration error in every rank, also checked here before any rank starts.
- 128+S: another signal S (SIGINT, SIGHUP, SIGQUIT) stopped the launcher; SIGINT is forwarded to the ranks, which
  stop as on SIGTERM (`preemption`).

`zerotrain run` reports its own status for the same outcomes: 130 or 143 for a run stopped by SIGINT or SIGTERM
(work left undone is never a local success), and a second Ctrl-C kills the ranks at once (`CtrlC`).

Termination message: the launcher writes one line, `<outcome>: <detail> (exit status <code>)` with <outcome> one
of `Outcome`'s values (succeeded, preempted, rank-failed, interrupted, invalid-config), to
$ZEROTRAIN_TERMINATION_LOG, else to /dev/termination-log (Kubernetes' terminationMessagePath) when that exists.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import Any

from zerotrain.gpu_env import gpu_env_missing
from zerotrain.pod_contract import (
    INVALID_CONFIG_OUTCOME,
    LAUNCHER_PID_ENV,
    MASTER_PORT,
    RANK_PARENT_PID_ENV,
    TERMINATION_LOG,
    TERMINATION_LOG_ENV,
)
from zerotrain.runtime.checkpoints import base
from zerotrain.runtime.job import rank_fork
from zerotrain.runtime.job.entry_check import check_entrypoint
from zerotrain.runtime.job.failures import consequence, exit_code, failure_time, how, last_line, log_files, root_cause
from zerotrain.runtime.job.preemption import EXIT_PREEMPTED
from zerotrain.runtime.job.task import ConfigError, is_script
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.weights_layout import layout

# Beyond the ranks' own SIGTERM budget: their watchdog ends them first, then the launcher has time to exit.
SHUTDOWN_MARGIN_S = 5


@dataclass(frozen=True)
class LaunchPlan:
    """Where this launcher's ranks sit in the job."""

    master_addr: str
    """Host of node 0's rendezvous store."""
    master_port: int
    """Port of the rendezvous store."""
    nnodes: int
    """Pods (nodes) in the gang."""
    node_rank: int
    """This node's index."""
    nproc_per_node: int
    """Ranks this launcher starts."""

    @property
    def world_size(self) -> int:
        """Total ranks."""
        return self.nnodes * self.nproc_per_node


def _int_env(env: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment {name}: got {raw!r}; not a whole number; set it to an integer") from None
    if value < minimum:
        raise ConfigError(f"environment {name}: got {value}; must be at least {minimum}")
    return value


def plan_from_env(env: Mapping[str, str], spec: ZeroTrainingJobSpec) -> LaunchPlan:
    """The pod's LaunchPlan; ConfigError when the environment contradicts itself or the manifest."""
    nproc = _int_env(env, "NPROC_PER_NODE", 1) or spec.nproc_per_node
    world = _int_env(env, "WORLD_SIZE", 1)
    nnodes = _int_env(env, "NNODES", 1)
    if nnodes is None:
        if world is not None and world % nproc != 0:
            raise ConfigError(
                f"environment WORLD_SIZE: got {world}, not a multiple of NPROC_PER_NODE={nproc}; WORLD_SIZE is the "
                "total number of ranks (NNODES × NPROC_PER_NODE), set it accordingly"
            )
        nnodes = world // nproc if world is not None else spec.replicas
    if world is not None and world != nnodes * nproc:
        raise ConfigError(
            f"environment WORLD_SIZE: got {world}, but NNODES × NPROC_PER_NODE = {nnodes} × {nproc} = "
            f"{nnodes * nproc}; "
            "WORLD_SIZE is the total number of ranks; set it to NNODES × NPROC_PER_NODE"
        )
    e = spec.elastic
    elastic_size = e is not None and nproc == spec.nproc_per_node and e.min_replicas <= nnodes <= e.max_replicas
    if (nnodes, nproc) != (spec.replicas, spec.nproc_per_node) and not elastic_size:
        raise ConfigError(
            f"environment: NNODES={nnodes}, NPROC_PER_NODE={nproc}, but the manifest has spec.replicas="
            f"{spec.replicas}, spec.nprocPerNode={spec.nproc_per_node}; the pod and its config disagree, "
            "recreate the pods from the current manifest"
        )
    node_rank = _int_env(env, "NODE_RANK", 0) or 0
    if node_rank >= nnodes:
        raise ConfigError(f"environment NODE_RANK: got {node_rank}; must be below NNODES={nnodes}")
    addr = env.get("MASTER_ADDR") or ("127.0.0.1" if nnodes == 1 else "")
    if not addr:
        raise ConfigError(f"environment MASTER_ADDR: not set, but the job has {nnodes} nodes; set it to node 0's host")
    port = _int_env(env, "MASTER_PORT", 1) or MASTER_PORT
    return LaunchPlan(addr, port, nnodes, node_rank, nproc)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the store binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def local_plan(nproc: int) -> LaunchPlan:
    """One node of `nproc` ranks on the loopback interface."""
    return LaunchPlan("127.0.0.1", free_port(), 1, 0, nproc)


def preflight(spec: ZeroTrainingJobSpec, world_size: int | None = None) -> str:
    """Configuration errors every rank would hit, reported once before any rank starts: the entry point (imported,
    its arguments bound, its model built on the meta device and checked against the spec: `entry_check`), and the
    pretrained weights' files (their names and shapes are matched in the ranks, before the model is allocated), and
    the base a LoRA job's newest checkpoint was trained on against the one it would read now.
    Returns the entry check's line (and a warning line, if any); `world_size`: a local run's --nproc."""
    if is_script(spec.entrypoint) and not Path(spec.entrypoint).is_file():
        raise ConfigError(f"spec.entrypoint: script {spec.entrypoint!r} does not exist; fix the path")
    checked = check_entrypoint(spec, world_size=world_size)
    pretrained = spec.model.pretrained.path if spec.model.pretrained is not None else None
    if pretrained is not None:
        layout(pretrained)
    problem = base.check_resume(spec.checkpoint.path, pretrained)  # a LoRA job's checkpoint, from another base
    if problem is not None:
        raise ConfigError(problem)
    return checked


def rank_command(spec: ZeroTrainingJobSpec, config_path: Path) -> list[str]:
    """argv of every rank (without the interpreter): the training loop, or the user's script."""
    if is_script(spec.entrypoint):
        return ["-u", spec.entrypoint, *spec.args]
    # -P: the working directory may hold a folder shadowing a stdlib module (this repository's operator/).
    return ["-P", "-u", "-m", "zerotrain.runtime.job.rank", "--config", str(config_path)]


def available_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """CPUs this container may use: its cgroup (v2) CPU limit if any, else the CPUs it may be scheduled on."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()
    except (OSError, ValueError):
        return cpus
    if quota == "max":
        return cpus
    return max(1, min(cpus, -(-int(quota) // int(period))))


def rank_environment(plan: LaunchPlan, gpus: bool = False) -> dict[str, str]:
    """Variables the ranks inherit beyond torch's (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*...); with `gpus` (the job
    asks for GPUs) also the GPU defaults of `zerotrain.gpu_env` this process's environment lacks (in an operator's
    pod it has them already, and whatever the job set wins)."""
    env: dict[str, str] = gpu_env_missing(os.environ) if gpus else {}
    env[LAUNCHER_PID_ENV] = str(os.getpid())  # `preemption.die_with_launcher`
    if "OMP_NUM_THREADS" not in os.environ:
        # Ranks share the pod's CPUs; torch would otherwise start one thread per node core in every rank.
        env["OMP_NUM_THREADS"] = str(max(1, available_cpus() // plan.nproc_per_node))
    if plan.master_addr in ("127.0.0.1", "localhost") and "GLOO_SOCKET_IFNAME" not in os.environ:
        loopback = next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)
        if loopback:
            env["GLOO_SOCKET_IFNAME"] = loopback
    return env


class Outcome(str, Enum):
    """How a launch ended; the first word of the pod's termination message."""

    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"
    RANK_FAILED = "rank-failed"
    INTERRUPTED = "interrupted"
    INVALID_CONFIG = INVALID_CONFIG_OUTCOME
    STOPPED = "stopped"
    """The operator stopped the ranks for an in-place restart of the gang (`pod_rounds`)."""


@dataclass(frozen=True)
class LaunchOutcome:
    """How the ranks ended."""

    exit_code: int
    """The launcher's exit status (see the module docstring)."""
    reason: Outcome
    """How it ended."""
    message: str
    """One line for a person: the root cause."""
    details: tuple[str, ...] = ()
    """What each other failed rank did, a line each."""
    logs: tuple[str, ...] = ()
    """The root-cause rank's captured output and traceback, when the launcher captured them."""
    to_launcher: bool = False
    """A signal to the launcher itself ended the launch (not one its ranks got from a peer)."""

    def summary(self) -> str:
        """The root cause, then the consequences, on one line (a pod's termination message)."""
        return "; ".join((self.message, *self.details))


def outcome_of_failures(failures: Mapping[int, Any], logs: Mapping[int, Path] | None = None) -> LaunchOutcome:
    """One account of failed ranks: the root cause first (`failures.root_cause`), then what each other rank did.
    `logs`: each rank's log folder, where the launcher captured its output (a rank killed or aborted records no
    error file, and its stderr is what tells NCCL's watchdog abort from a crash)."""
    logs = logs or {}
    if all(f.exitcode == EXIT_PREEMPTED for f in failures.values()):
        first = min(failures.items(), key=lambda kv: (failure_time(kv[1]), kv[0]))[1]
        return LaunchOutcome(0, Outcome.PREEMPTED, last_line(first) or "SIGTERM: every rank stopped")
    rank = root_cause(failures, logs)
    failure = failures[rank]
    line = last_line(failure)
    message = f"rank {rank} failed first: it {how(failure)}" + (f": {line}" if line else "")
    details = tuple(consequence(r, failures[r], logs.get(r)) for r in sorted(failures) if r != rank)
    files = tuple(str(p) for p in log_files(failure, logs.get(rank)))
    return LaunchOutcome(exit_code(failure), Outcome.RANK_FAILED, message, details, files)


def rank_log_folders(log_dir: Path | None, failures: Mapping[int, Any]) -> dict[int, Path]:
    """Each failed rank's folder under the launcher's log directory (`<run>_<id>/attempt_<n>/<local rank>/`, the
    newest attempt), found by its local rank: a rank that recorded no error file says nowhere where it logged."""
    if log_dir is None:
        return {}
    attempts = sorted(log_dir.glob("*/attempt_*"), key=lambda p: p.stat().st_mtime)
    if not attempts:
        return {}
    return {r: attempts[-1] / str(f.local_rank) for r, f in failures.items()}


def launch(
    spec: ZeroTrainingJobSpec,
    config_path: Path,
    plan: LaunchPlan,
    run_id: str = "zerotrain",
    quiet: bool = False,
    log_dir: Path | None = None,
    capture_stdout: bool = True,
    on_interrupt: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    rendezvous_timeout: int | None = None,
) -> LaunchOutcome:
    """Start the plan's local ranks through torch.distributed's elastic launcher and wait for them.

    `quiet` silences torch's own log lines (the caller reports the outcome itself). With `log_dir`, each rank's
    stdout and stderr also go to files under it (`<log_dir>/<run>/attempt_0/<local rank>/`), still shown here
    with a `[rankN]:` prefix. `stop`: once set, every rank is killed at once and the launch ends STOPPED (the
    operator restarts the gang in place: nothing of this round may meet the next). `rendezvous_timeout`: how long
    the launcher waits for its peers, scheduling.startupTimeoutSeconds unless given.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # torch gives each of its modules' loggers a level of its own: the package's alone would not hold.
    for name in [*logging.root.manager.loggerDict, "torch.distributed.elastic"]:
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL if quiet else logging.ERROR)
    captured = Std.ALL if capture_stdout else Std.ERR
    config = LaunchConfig(
        min_nodes=plan.nnodes,
        max_nodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node,
        run_id=run_id,
        rdzv_backend="static",
        rdzv_endpoint=f"{plan.master_addr}:{plan.master_port}",
        rdzv_configs={"rank": plan.node_rank, "timeout": rendezvous_timeout or spec.scheduling.startup_timeout_seconds},
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir), redirects=captured, tee=captured) if log_dir else None,
        log_line_prefix_template="[rank${rank}]: " if log_dir else None,
        shutdown_timeout=int(
            os.environ.get(
                "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", spec.checkpoint.termination_budget_seconds + SHUTDOWN_MARGIN_S
            )
        ),
    )
    forked = rank_fork.forks(spec)
    if forked:  # each rank a fork of the server that imported torch and zerotrain once (`rank_fork`)
        config.start_method = "forkserver"
        server = rank_fork.start_server(rank_fork.preload_for(spec))
    env = rank_environment(plan, gpus=spec.resources.gpu > 0)
    if forked:
        env[RANK_PARENT_PID_ENV] = str(server)  # the ranks' parent: it exits with this launcher
    ctrl_c = CtrlC(on_interrupt) if on_interrupt is not None else None
    if ctrl_c is not None:
        config.signals_to_handle = "SIGTERM,SIGHUP,SIGQUIT"  # SIGINT is CtrlC's
    # torch's launcher leaves its handler (it raises SignalException) installed once it returns: a signal after
    # that, while the stopper closes or a pod reports its round, would end the launcher with a traceback.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    previous = signal.signal(signal.SIGINT, ctrl_c) if ctrl_c is not None else None
    stopper = Stopper(stop, server if forked else None) if stop is not None else None
    try:
        with scoped_environ(env):
            if forked:
                from zerotrain.runtime.job.forked_context import forked_ranks

                with forked_ranks():
                    elastic_launch(config, rank_fork.run_rank)(str(config_path), dict(os.environ))
            else:
                elastic_launch(config, sys.executable)(*rank_command(spec, config_path))
    except ChildFailedError as e:
        if stopper is not None and stopper.fired:
            return LaunchOutcome(128 + signal.SIGKILL, Outcome.STOPPED, "the operator restarts the gang in place")
        return outcome_of_failures(e.failures, rank_log_folders(log_dir, e.failures))
    except SignalException as e:
        if e.sigval == signal.SIGTERM:
            return LaunchOutcome(
                0, Outcome.PREEMPTED, "SIGTERM: forwarded to every rank, all stopped", to_launcher=True
            )
        if ctrl_c is not None and ctrl_c.count > 1:
            return LaunchOutcome(128 + int(e.sigval), Outcome.INTERRUPTED, "SIGINT twice: every rank stopped at once")
        return LaunchOutcome(128 + int(e.sigval), Outcome.INTERRUPTED, f"{e.sigval.name}: ranks stopped")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if stopper is not None:
            stopper.close()
    return LaunchOutcome(0, Outcome.SUCCEEDED, f"{plan.nproc_per_node} rank(s) finished")


class Stopper:
    """Kills every rank of the launch once `stop` is set: each rank leads a session of its own, so its group
    goes with it; the fork server (`spare`), which serves the next round, stays."""

    def __init__(self, stop: threading.Event, spare: int | None) -> None:
        self.stop, self.spare = stop, spare
        self.fired = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zerotrain-round-stopper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            if self.stop.wait(0.2):
                self.fired = True
                for pid in child_pids():
                    if pid != self.spare:
                        with suppress(ProcessLookupError, PermissionError):
                            os.killpg(pid, signal.SIGKILL)
                if self._done.wait(0.5):  # ranks starting as it fired are killed too
                    return

    def close(self) -> None:
        self._done.set()
        self._thread.join(2.0)


class CtrlC:
    """SIGINT in an interactive launcher: the first asks every rank to finish its step, save and stop (torch's
    launcher forwards it, as it does SIGTERM); a second kills the ranks at once. Without this the second would only
    interrupt the launcher's wait, and it would then wait the whole shutdown timeout again."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.count = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        self.count += 1
        if self.count == 1:
            self.say("Ctrl-C: every rank finishes its step, saves and stops; Ctrl-C again stops them at once")
            raise SignalException(f"Process {os.getpid()} got signal: SIGINT", sigval=signal.SIGINT)
        self.say("Ctrl-C again: stopping every rank now; a checkpoint not yet committed is not used")
        for pid in child_pids():
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # each rank leads its own process group (its own session)


def child_pids(proc: Path = Path("/proc")) -> list[int]:
    """The ranks this process started (Linux): its children, and the fork server's (the ranks forked from it),
    each the leader of its own session."""
    parents: dict[int, int] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    me = os.getpid()
    mine = [pid for pid, parent in parents.items() if parent == me]
    return mine + [pid for pid, parent in parents.items() if parent in mine]


@contextmanager
def scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set `values` in os.environ for the block (the elastic launcher passes its env to the ranks), then restore."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def termination_line(outcome: LaunchOutcome) -> str:
    """The termination message: `<outcome>: <detail> (exit status N)`, within what Kubernetes keeps (4096 bytes)."""
    return f"{outcome.reason.value}: {outcome.summary()[:3000]} (exit status {outcome.exit_code})"


def write_termination_log(outcome: LaunchOutcome) -> None:
    """Kubernetes' termination message: to $ZEROTRAIN_TERMINATION_LOG, else to /dev/termination-log if it exists."""
    configured = os.environ.get(TERMINATION_LOG_ENV)
    path = Path(configured or TERMINATION_LOG)
    if not configured and not path.is_file():
        return  # not in a pod: never create files under /dev
    try:
        with path.open("w") as f:
            f.write(termination_line(outcome) + "\n")
    except OSError:
        return
