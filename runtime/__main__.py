"""Pod entry point: `python -m zerotrain.runtime --config /etc/zerotrain/job.yaml`.

Reads the job manifest and the pod environment (see `zerotrain.runtime.job.launch` for the variables, the meaning
of WORLD_SIZE and the exit statuses), starts this pod's ranks through torch's elastic launcher and exits with
their status. Under restartStrategy InPlace a failed round does not end the pod: the launcher reports it on its pod
and starts the ranks again when the operator says the gang's next round may start (`runtime.job.pod_rounds`).
Each rank's stderr is also captured in a temporary folder for the launch (still shown in the pod's
log, `[rankN]:`-prefixed; stdout, the long part, is not kept): a rank killed or aborted leaves no error file, and its
stderr is what tells NCCL's watchdog abort (a consequence) from a crash.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from zerotrain.errors import EXIT_BAD_INPUT, UserError
from zerotrain.hf_config import local_files
from zerotrain.pod_contract import GANG_ENV, ROUND_STARTED_ENV
from zerotrain.runtime.job import rank_fork

if TYPE_CHECKING:  # torch: imported once the fork server is on its way
    from zerotrain.runtime.job.launch import LaunchOutcome, LaunchPlan
    from zerotrain.runtime.job.pod_rounds import PodRounds
    from zerotrain.spec import ZeroTrainingJobSpec

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
    from zerotrain.runtime.job.launch import plan_from_env, preflight, write_termination_log  # torch

    try:
        plan = plan_from_env(os.environ, job.spec)
        preflight(job.spec)
    except UserError as e:
        return _refused(e)
    name = str(job.metadata.get("name") or "zerotrain")
    from zerotrain.runtime.job.pod_rounds import for_pod

    rounds = for_pod(job.spec)
    if rounds is None or (first := rounds.first_round()) is None:
        if rounds is not None:
            rounds.close()
        outcome = _launch(job.spec, args.config, plan, name)
    else:
        outcome = _rounds(job.spec, args.config, plan, name, rounds, first)
    write_termination_log(outcome)
    return outcome.exit_code


def _launch(
    spec: ZeroTrainingJobSpec,
    config: str,
    plan: LaunchPlan,
    run_id: str,
    stop: threading.Event | None = None,
    later: bool = False,
) -> LaunchOutcome:
    """One launch of the pod's ranks (one round), its outcome said on stderr. A `later` round (an in-place restart)
    waits twice scheduling.startupTimeoutSeconds for its peers: they may be pods the operator is still placing, and
    its verdict on one that cannot start (a resize, Unschedulable) must come before this pod gives up on it."""
    from zerotrain.runtime.job.launch import launch

    timeout = 2 * spec.scheduling.startup_timeout_seconds if later else None
    with tempfile.TemporaryDirectory(prefix="zerotrain-logs-") as logs:
        outcome = launch(
            spec,
            Path(config),
            plan,
            run_id=run_id,
            log_dir=Path(logs),
            capture_stdout=False,
            stop=stop,
            rendezvous_timeout=timeout,
        )
    print(f"zerotrain: node {plan.node_rank}: {outcome.reason.value}: {outcome.message}", file=sys.stderr, flush=True)
    for line in outcome.details:
        print(f"zerotrain: node {plan.node_rank}:   {line}", file=sys.stderr, flush=True)
    return outcome


def _rounds(
    spec: ZeroTrainingJobSpec, config: str, plan: LaunchPlan, name: str, rounds: PodRounds, number: int
) -> LaunchOutcome:
    """Rounds of the pod's ranks, one per gang it belongs to (an in-place restart keeps the pod): each ends with the
    ranks (a failure, the operator's word to stop), is reported on the pod, and the next starts at the operator's
    word; the last one's outcome is the pod's. `number`: the first round's."""
    from zerotrain.runtime.job.launch import termination_line
    from zerotrain.runtime.job.pod_rounds import stays

    first = True
    while True:
        if not first:  # the ranks' clock starts with the round, not with this process (`gang_clock`)
            os.environ[ROUND_STARTED_ENV] = repr(time.time())
            os.environ[GANG_ENV] = str(number)
            print(f"zerotrain: node {plan.node_rank}: round {number}: starting the ranks again", file=sys.stderr)
        outcome = _launch(spec, config, plan, f"{name}-{number}", rounds.stop_event(number), later=not first)
        if not stays(outcome):
            rounds.close()
            return outcome
        rounds.report_end(number, outcome.exit_code, termination_line(outcome))
        print(f"zerotrain: node {plan.node_rank}: round {number} ended; waiting for the gang's next", file=sys.stderr)
        following = rounds.next_round(number)
        if following is None:
            rounds.close()
            return outcome
        number, first = following, False


def _refused(error: UserError) -> int:
    """A job no rank could run: one line, the termination message, exit status 2."""
    from zerotrain.runtime.job.launch import LaunchOutcome, Outcome, write_termination_log

    print(f"zerotrain: error: {error}", file=sys.stderr, flush=True)
    write_termination_log(LaunchOutcome(EXIT_BAD_INPUT, Outcome.INVALID_CONFIG, str(error)))
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    from zerotrain.process_exit import exit_after

    exit_after(main())  # the pod ends as soon as its outcome is written, not after torch's teardown
