"""Multi-process helpers for runtime tests: run a function on N real gloo ranks and collect results.

`run_ranks(fn, world_size, *args)` starts `world_size` fresh processes, sets the env torchrun would set (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT), pins torch to one thread, calls
`fn(rank, world_size, *args)` and returns the ranks' return values in rank order. A rank's exception is re-raised in
the parent with its traceback. `fn` must be a module-level function (it is pickled by name). Processes still alive
after the timeout are killed by PID and the call fails.

The ranks are forked from a forkserver that has imported torch and the runtime once (it runs nothing, so no thread
pool exists to be forked): a spawned rank spent about 3 s of its 2 cores' time importing them, and the suite starts
hundreds. Each rank still begins from the caller's environment and working directory, as a spawned one would.
"""

from __future__ import annotations

import io
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp
from budget import budget

from zerotrain.runtime.job.launch import free_port


class RankFailed(AssertionError):
    """A rank raised, or did not finish in time."""


PRELOAD = ["torch", "torch.distributed", "torch.distributed.checkpoint", "zerotrain.runtime.zero.engine"]
"""Imported once by the forkserver (an ImportError there is ignored: the rank then imports it itself)."""


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read when the server starts: the first call of a test process
    return ctx


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    out: Any,
    args: tuple[Any, ...],
    parent: tuple[dict[str, str], str],
) -> None:
    import torch
    import torch.distributed as dist

    env, cwd = parent  # the forkserver's were those of the first caller
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    try:
        # Tensors go through the queue as bytes: torch's shared-memory passing dies with the sender.
        buf = io.BytesIO()
        torch.save(fn(rank, world_size, *args), buf)
        out.put((rank, True, buf.getvalue()))
    except BaseException as e:
        out.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    """`fn(rank, world_size, *args)` on `world_size` spawned ranks; their results in rank order."""
    ctx = _context()
    out = ctx.Queue()
    port = free_port()
    parent = (dict(os.environ), os.getcwd())
    procs = [ctx.Process(target=_entry, args=(fn, r, world_size, port, out, args, parent)) for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + budget(timeout)
    try:
        while len(results) < world_size:
            try:
                rank, ok, value = out.get(timeout=0.5)
                results[rank] = (ok, value)
                continue
            except queue.Empty:
                pass
            missing = sorted(set(range(world_size)) - set(results))
            dead = [r for r in missing if procs[r].exitcode is not None]
            if dead:
                codes = {r: procs[r].exitcode for r in dead}
                raise RankFailed(f"ranks died without a result (exit codes {codes}); their stderr is above")
            if time.monotonic() > deadline:
                raise RankFailed(f"ranks {missing} did not finish in {timeout}s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive() and p.pid is not None:
                p.kill()
                p.join()
    failed = [f"rank {r}: {v}" for r, (ok, v) in sorted(results.items()) if not ok]
    if failed:
        raise RankFailed("\n".join(failed))
    return [torch.load(io.BytesIO(results[r][1]), weights_only=False) for r in range(world_size)]
