"""One rank's process: `python -m zerotrain.runtime.job.rank --config JOB.yaml`, started by the launcher.

It reads the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) into a `RankContext`,
installs the stop-signal handling, starts the rank's metrics before the first collective, forms the process group,
runs `train.train` and ends the process.

Exit status: 0 done, 2 the configuration cannot run (message names the field, the value and the fix), 143
(EXIT_PREEMPTED) stopped on SIGTERM after committing a checkpoint of the step every rank had finished.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

import torch.distributed as dist

from zerotrain.errors import UserError
from zerotrain.hf_config import local_files
from zerotrain.pod_contract import DEBUG_ENV
from zerotrain.runtime.job.failures import FailureKind, classify, write_failure_record
from zerotrain.runtime.job.metrics_endpoint import metrics_endpoint
from zerotrain.runtime.job.out_of_memory import (
    RankOutOfMemory,
    apply_memory_limit,
    at_limit,
    before_training,
    is_allocation_failure,
)
from zerotrain.runtime.job.preemption import EXIT_PREEMPTED, Preempted, Preemption, die_with_launcher, exit_preempted
from zerotrain.runtime.job.rank_metrics import RankMetrics
from zerotrain.runtime.job.spec_bindings import device_for
from zerotrain.runtime.job.train import RankContext, train
from zerotrain.runtime.zero.process_group import init_group
from zerotrain.spec import ZeroTrainingJobSpec


def start_metrics(job: str, spec: ZeroTrainingJobSpec, ctx: RankContext) -> RankMetrics:
    """The rank's metrics, serving before the first collective (spec.metrics; see `metrics_endpoint`)."""
    metrics = RankMetrics(
        job,
        ctx.rank,
        ctx.local_rank,
        ctx.world_size,
        int(spec.zero.fixed_stage),
        spec.training.steps,
        enabled=spec.metrics.enabled,
    )
    if spec.metrics.enabled:
        nproc = int(os.environ.get("LOCAL_WORLD_SIZE") or ctx.world_size)
        metrics.serve(metrics_endpoint(spec.metrics.port, ctx.local_rank, nproc))
    return metrics


def init_process_group(spec: ZeroTrainingJobSpec, ctx: RankContext) -> None:
    """gloo on CPU; on CUDA, NCCL for CUDA tensors and gloo for CPU ones (see `process_group_backend`). The device
    is checked first: a job that cannot run here fails before any rank waits for the others."""
    if dist.is_initialized():
        return
    init_group(device_for(spec, ctx.local_rank), spec.zero.collective_timeout_seconds)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerotrain.runtime.job.rank", description=__doc__)
    parser.add_argument("--config", required=True, help="the ZeroTrainingJob manifest (YAML or JSON)")
    args = parser.parse_args(argv)
    die_with_launcher()
    limit = apply_memory_limit(os.environ)
    try:
        if at_limit(limit):  # a rank forked from the preloaded server holds torch already: nothing left to start
            raise MemoryError(f"the process holds its whole data limit of {limit} bytes before its first tensor")
        from zerotrain.manifest import load_job

        job = load_job(args.config)
        spec = job.spec
        ctx = RankContext.from_env()
        preemption = None
        if spec.checkpoint.save_on_termination:
            preemption = Preemption(spec.checkpoint.termination_budget_seconds, exit_preempted)
            preemption.install()
        metrics = start_metrics(str(job.metadata.get("name") or "zerotrain"), spec, ctx)
        init_process_group(spec, ctx)
        train(spec, ctx, metrics=metrics, preemption=preemption)
        metrics.stop()
    except Preempted as e:
        print(f"zerotrain rank {os.environ.get('RANK', '?')}: {e}", file=sys.stderr, flush=True)
        fail(str(e), EXIT_PREEMPTED, FailureKind.PREEMPTED)
    except KeyboardInterrupt:  # SIGINT with spec.checkpoint.saveOnTermination false, or before training
        print(f"zerotrain rank {os.environ.get('RANK', '?')}: SIGINT; stopped, nothing saved", file=sys.stderr)
        fail("SIGINT; stopped, nothing saved", 128 + int(signal.SIGINT), FailureKind.PREEMPTED)
    except SystemExit as e:
        if e.code not in (0, None):
            fail(f"SystemExit: {e.code}", e.code if isinstance(e.code, int) else 1)
        raise
    except Exception as e:
        if (is_allocation_failure(e) or at_limit(limit)) and not isinstance(e, RankOutOfMemory):
            e = RankOutOfMemory(before_training(e, int(os.environ.get("RANK", 0)), limit))
        kind, code, expected = classify(e)
        report_error(e, expected)
        fail(_failure_line(e), code, kind, e)
    # The engine's hooks form reference cycles; collect it (and the gloo work objects it holds) while the
    # process group is alive, or finalising them at interpreter exit can abort the process.
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _failure_line(error: BaseException) -> str:
    """The failure as the launcher reports it: the account itself for what the runtime explains in words."""
    if isinstance(error, RankOutOfMemory):
        return str(error)
    return f"error: {error}" if isinstance(error, UserError) else f"{type(error).__name__}: {error}"


def report_error(error: BaseException, expected: bool) -> None:
    """Print a rank's failure: an error the runtime understands (a lost peer, a timeout, a divergence, a
    configuration it cannot run) as one line; anything else with its traceback. ZEROTRAIN_DEBUG=1 prints every
    traceback, ZEROTRAIN_DEBUG=0 none (`zerotrain run` keeps them in each rank's traceback file)."""
    debug = os.environ.get(DEBUG_ENV)
    rank = os.environ.get("RANK", "?")
    if debug == "1" or (debug is None and not expected):
        traceback.print_exception(error)
    head = "error" if isinstance(error, (UserError, RankOutOfMemory)) else type(error).__name__
    print(f"zerotrain rank {rank}: {head}: {error}", file=sys.stderr, flush=True)


def fail(
    message: str, code: int, kind: FailureKind = FailureKind.ERROR, error: BaseException | None = None
) -> NoReturn:
    """Record the failure for the launcher and exit at once with `code`.

    No process-group teardown: with peers gone or stuck it can hang, or abort and replace `code` with SIGABRT.
    """
    write_failure_record(message, kind, error)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_after(code: int) -> NoReturn:
    """End a rank whose work is done without the interpreter's teardown: gloo (torch 2.13) can still hold a C++
    thread then, whose destructor aborts the process ("terminate called without an active exception", SIGABRT)
    after every step ran and the summary was written; seen 1 run in ~30 under load, also after the group was
    destroyed. Nothing is lost: every file the rank writes is closed by now, and the streams are flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    with local_files():  # the pod's own files (a Hugging Face config.json the plan reads)
        code = main()
    exit_after(code)
