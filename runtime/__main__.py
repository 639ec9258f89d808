"""Pod entry point: `python -m zerotrain.runtime --config /etc/zerotrain/job.yaml`.

Reads the job manifest and the pod environment (see `zerotrain.runtime.job.launch` for the variables, the meaning
of WORLD_SIZE and the exit statuses), starts this pod's ranks through torch's elastic launcher and exits with
their status. Each rank's stderr is also captured in a temporary folder for the launch (still shown in the pod's
log, `[rankN]:`-prefixed; stdout, the long part, is not kept): a rank killed or aborted leaves no error file, and its
stderr is what tells NCCL's watchdog abort (a consequence) from a crash.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from zerotrain.errors import EXIT_BAD_INPUT, UserError
from zerotrain.hf_config import local_files
from zerotrain.runtime.job import rank_fork

DEFAULT_CONFIG = "/etc/zerotrain/job.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerotrain.runtime", description=__doc__)
    parser.add_argument(
        "--config", default=DEFAULT_CONFIG, help=f"the ZeroTrainingJob manifest (default {DEFAULT_CONFIG})"
    )
    args = parser.parse_args(argv)
    with local_files():  # the pod's own files: the job's config.json is read here, never in the operator
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    from zerotrain.manifest import load_job

    try:
        job = load_job(args.config)
        if rank_fork.forks(job.spec):  # the ranks' fork server imports torch while this process checks the job
            rank_fork.start_server(rank_fork.preload_for(job.spec))
    except UserError as e:
        return _refused(e)
    from zerotrain.runtime.job.launch import launch, plan_from_env, preflight, write_termination_log  # torch

    try:
        plan = plan_from_env(os.environ, job.spec)
        preflight(job.spec)
    except UserError as e:
        return _refused(e)
    run_id = str(job.metadata.get("name") or "zerotrain")
    with tempfile.TemporaryDirectory(prefix="zerotrain-logs-") as logs:
        outcome = launch(job.spec, Path(args.config), plan, run_id=run_id, log_dir=Path(logs), capture_stdout=False)
    print(f"zerotrain: node {plan.node_rank}: {outcome.reason.value}: {outcome.message}", file=sys.stderr, flush=True)
    for line in outcome.details:
        print(f"zerotrain: node {plan.node_rank}:   {line}", file=sys.stderr, flush=True)
    write_termination_log(outcome)
    return outcome.exit_code


def _refused(error: UserError) -> int:
    """A job no rank could run: one line, the termination message, exit status 2."""
    from zerotrain.runtime.job.launch import LaunchOutcome, Outcome, write_termination_log

    print(f"zerotrain: error: {error}", file=sys.stderr, flush=True)
    write_termination_log(LaunchOutcome(EXIT_BAD_INPUT, Outcome.INVALID_CONFIG, str(error)))
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
