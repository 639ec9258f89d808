"""Ranks forked from one server that imported torch and zerotrain once, instead of each importing them again.

A rank process used to be a fresh interpreter (`python -m zerotrain.runtime.job.rank`): the launcher and every rank
imported torch, zerotrain and the entry point's libraries (transformers, peft) one after another, seconds each,
before the first collective. Here the launcher starts Python's fork server (`multiprocessing`'s forkserver) as early
as it can, preloaded with those modules, so it imports them while the launcher still checks the job; torch's
elastic launcher then starts each rank as a fork of that server (start method "forkserver"), which exists before any
thread, CUDA context or process group does.

What a fresh interpreter gave each rank, `run_rank` gives it too:
- the launcher's environment at launch time (the server's was taken when it started), with torch's own per-rank
  variables (RANK, LOCAL_RANK, ...) on top;
- a session of its own, as torch's launcher starts a subprocess in: a terminal's Ctrl-C reaches the launcher
  (which forwards it as it decides), not the ranks directly, and a second Ctrl-C kills each rank's group;
- OpenMP's thread count from OMP_NUM_THREADS, which the server's torch read before the launcher set it;
- the same exit: the rank's status, from `rank.main`, without the interpreter's teardown (a rank that finished
  returns, as torch's launcher expects of a function, and the fork server's child ends with os._exit).
Everything else (signals, failure records, out-of-memory accounts, the summary) is `rank.main`'s, unchanged.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import sys
from enum import Enum
from multiprocessing import forkserver

from zerotrain.errors import ConfigError
from zerotrain.pod_contract import RANK_PRELOAD_ENV, RANK_START_ENV
from zerotrain.spec import ZeroTrainingJobSpec

STARTED_WITH = dict(os.environ)
"""The environment of the process that imported this module: in a forked rank, the server's."""
BASE = ("zerotrain.runtime.job.rank", "torch._dynamo")
"""Always preloaded: the rank's process, with torch and the engine; torch._dynamo, which torch's optimizers import
on their first parameter group (`torch._disable_dynamo`), with sympy and torch.fx: a second each rank paid."""
PRELOAD = "zerotrain.runtime.job.preload"
"""The module the server imports first: it imports the rest (RANK_PRELOAD_ENV) and names the server for `ps`."""


class RankStart(str, Enum):
    """How a launcher starts its ranks (RANK_START_ENV)."""

    FORKSERVER = "forkserver"
    """Forks of the preloaded server (the default)."""
    SPAWN = "spawn"
    """A fresh interpreter each, as torchrun starts them: for a platform where forking misbehaves, and to compare."""


def rank_start() -> RankStart:
    """The launcher's choice: RANK_START_ENV, forkserver by default; ConfigError naming a value it is not."""
    raw = os.environ.get(RANK_START_ENV) or RankStart.FORKSERVER.value
    try:
        return RankStart(raw)
    except ValueError:
        raise ConfigError(
            f"environment {RANK_START_ENV}: got {raw!r}; use {RankStart.FORKSERVER.value} (the default) or "
            f"{RankStart.SPAWN.value}"
        ) from None


def forks(spec: ZeroTrainingJobSpec) -> bool:
    """Whether the job's ranks are forks of the server: a `module:function` entry point (a script is a program of
    its own), unless RANK_START_ENV says spawn. Torch-free, so a launcher can start the server before it imports
    torch itself."""
    return not spec.entrypoint.endswith(".py") and rank_start() is RankStart.FORKSERVER


def preload_for(spec: ZeroTrainingJobSpec) -> list[str]:
    """The modules a job's ranks need, as far as its manifest tells (`preload`)."""
    from zerotrain.plan.activations import job_architecture

    try:
        a = job_architecture(spec)
    except ValueError:
        a = None  # a config this process cannot read: the ranks import its family themselves
    return preload(spec.entrypoint, spec.model.lora is not None, a.family.value if a is not None else None)


def preload(entrypoint: str, lora: bool = False, family: str | None = None) -> list[str]:
    """The modules the server imports: the rank's own, and the entry point's module (a script imports nothing
    there); the Hugging Face family's modeling module, which transformers imports when the model is built; peft
    for LoRA's adapters."""
    modules = list(BASE)
    if ":" in entrypoint and not entrypoint.endswith(".py"):
        modules.append(entrypoint.split(":", 1)[0])
    if family is not None:
        modules.append(f"transformers.models.{family}.modeling_{family}")
    if lora:
        modules.append("peft")
    return modules


def start_server(modules: list[str]) -> int:
    """Start the fork server (once per process; it keeps serving later launches), importing `modules` while the
    caller goes on; its PID (the ranks' parent)."""
    # The server imports them through `preload`, which names it apart from the ranks it forks.
    multiprocessing.set_forkserver_preload([PRELOAD])
    saved = os.environ.get(RANK_PRELOAD_ENV)
    os.environ[RANK_PRELOAD_ENV] = ",".join(modules)
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(RANK_PRELOAD_ENV) if saved is None else os.environ.__setitem__(RANK_PRELOAD_ENV, saved)
    if not _stopping:
        _stopping.append(True)
        atexit.register(stop_server)
    return server_pid()


_stopping: list[bool] = []


def stop_server() -> None:
    """Stop the fork server and wait for it (at the launcher's exit): nothing it started outlives the launcher by
    a moment (a rank still running dies with it, as with its launcher)."""
    stop = getattr(forkserver._forkserver, "_stop", None)  # the stdlib's own, for its tests
    if callable(stop) and getattr(forkserver._forkserver, "_forkserver_pid", None) is not None:
        stop()


def server_pid() -> int:
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)  # the stdlib keeps no public accessor
    assert pid is not None, "the fork server is not running"
    return int(pid)


def rank_environment(launcher: dict[str, str]) -> dict[str, str]:
    """The rank's environment: the launcher's at launch, and what torch's launcher set in this process (every
    variable that differs from the server's own)."""
    mine = {k: v for k, v in os.environ.items() if STARTED_WITH.get(k) != v}
    return {**launcher, **mine}


def run_rank(config: str, launcher: dict[str, str]) -> None:
    """A forked rank: the environment, session and threads a fresh interpreter would have, then `rank.main`."""
    os.setsid()
    # The server hands each child the write end of its "alive" pipe, as it does every client; a rank holding it
    # would keep the server, and so itself, alive after the launcher is gone. The rank never asks for a fork.
    alive = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        setattr(forkserver._forkserver, "_forkserver_alive_fd", None)  # noqa: B010 (private: mypy knows no such name)
    environ = rank_environment(launcher)
    os.environ.clear()
    os.environ.update(environ)
    import setproctitle

    # The command line a spawned rank had, and its rank (its /proc environ is the server's: ps and tools read this).
    which = environ.get("RANK", "?")
    setproctitle.setproctitle(f"{sys.executable} -m zerotrain.runtime.job.rank --config {config} RANK={which}")
    import torch

    threads = environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))
    from zerotrain.hf_config import local_files
    from zerotrain.runtime.job import rank

    with local_files():  # the pod's own files (a Hugging Face config.json the plan reads)
        code = rank.main(["--config", config])
    if code:
        rank.exit_after(code)
    # Returned: torch's launcher counts a rank done by its return value; the process then ends with os._exit, as
    # `rank.exit_after` would, without the interpreter's teardown.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
