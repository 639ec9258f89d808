"""Pure status: from the spec, the observed pods and the previous status to the next status and the
actions that make the world match it. No I/O, no clock: `now` is an argument."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from zerotrain import goodput
from zerotrain.job_status import Phase, RankCounts, Resize, ZeroTrainingJobStatus
from zerotrain.operator.controller import goodput_ledger, pass_facts, pod_start, resize
from zerotrain.operator.controller.conditions import (
    ConditionType,
    Reason,
    gang_created_message,
    get_condition,
    is_true,
    set_condition,
)
from zerotrain.operator.controller.observe import Disruption, ObservedPod, PodPhase
from zerotrain.operator.controller.straggler_condition import set_straggler
from zerotrain.plan.model_states import MemoryPlan
from zerotrain.quantity import format_bytes
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.training_spec import RestartStrategy
from zerotrain.zero_config import Stage

TERMINAL = (Phase.SUCCEEDED, Phase.FAILED)


@dataclass(frozen=True)
class Backoff:
    """Exponential delay before a gang restart after a counted failure."""

    base_seconds: float = 10.0
    max_seconds: float = 300.0

    def delay(self, failures: int) -> float:
        return 0.0 if failures <= 0 else min(self.base_seconds * 2 ** (failures - 1), self.max_seconds)


@dataclass
class Decision:
    """The next status and what to do so the cluster matches it."""

    status: ZeroTrainingJobStatus
    create_gang: bool = False
    """Create the current gang's missing pods (labelled with gang = status.restarts.total)."""
    delete_pods: list[str] = field(default_factory=list)
    move_pods: list[str] = field(default_factory=list)
    """Living pods an in-place restart keeps: moved into the current gang (their launchers stop their ranks)."""
    start_pods: list[str] = field(default_factory=list)
    """Kept pods whose launchers may start the current gang's round (every one stopped its old ranks)."""
    exit_pods: list[str] = field(default_factory=list)
    """Pods between rounds whose launchers are to exit with their last round's outcome (the job ended)."""
    delete_job: bool = False
    requeue_after: float | None = None
    restart_cause: str | None = None
    """Set when this decision tore the gang down for a restart."""
    create_probes: list[int] = field(default_factory=list)
    """Capacity probes (by index) an elastic gang below maxReplicas creates (`resize`)."""
    resize: Resize | None = None
    """The resize this decision made, if any."""
    resize_plan: MemoryPlan | None = None
    """Admission's memory plan at the resize's size."""
    died: datetime | None = None
    """When the rank whose failure ends the gang died (its container's finishedAt), if known."""


def rank_counts(spec: ZeroTrainingJobSpec, pods: Sequence[ObservedPod]) -> RankCounts:
    per = spec.nproc_per_node

    def count(pred: Callable[[ObservedPod], bool]) -> int:
        return per * sum(1 for p in pods if pred(p))

    return RankCounts(
        total=spec.world_size,
        ready=count(lambda p: p.ready),
        running=count(lambda p: p.phase == PodPhase.RUNNING),
        succeeded=count(lambda p: p.phase == PodPhase.SUCCEEDED),
        failed=count(lambda p: p.phase == PodPhase.FAILED and p.disruption is None),
    )


def compute_status(
    spec: ZeroTrainingJobSpec,
    observed: Sequence[ObservedPod],
    previous: ZeroTrainingJobStatus | None,
    now: datetime,
    backoff: Backoff = Backoff(),
    replan: bool = False,
    sizing: resize.Sizing | None = None,
    facts: pass_facts.PassFacts | None = None,
) -> Decision:
    """The whole lifecycle in one pure step; see docs/operator.md for the state diagram. `spec` is the gang's
    in force (an elastic job's replicas are the size it runs at). `replan`: the stage is `auto`'s choice, so a
    rank out of memory moves the job to the next stage instead of failing it. `sizing`: the job is elastic.
    `facts`: what admission decided (plan, stage, generation...), recorded in the same status."""
    queued = facts is not None and bool(facts.queue)
    d = _lifecycle(spec, observed, previous, now, backoff, replan, sizing, queued)
    gang = [p for p in observed if p.gang == d.status.restarts.total and p.probe is None and not p.terminating]
    set_straggler(d.status, gang, spec.nproc_per_node, now)
    created = facts.created if facts is not None else None
    goodput_ledger.keep(previous, d.status, d.restart_cause, d.died, created, now)
    ledger = d.status.goodput
    if ledger is not None and d.status.step is not None:  # the step and the ledger run to the same report
        d.status.progress = goodput.progress(d.status.step, spec.training.steps, ledger.seconds.training)
    if facts is not None:
        # A resize's next gang runs at the plan admission gave its size when the resize was decided.
        moved = pass_facts.Moved(d.resize_plan, d.resize.stage) if d.resize is not None else None
        pass_facts.record(facts, d.status, moved, now)
    return d


def _lifecycle(
    spec: ZeroTrainingJobSpec,
    observed: Sequence[ObservedPod],
    previous: ZeroTrainingJobStatus | None,
    now: datetime,
    backoff: Backoff,
    replan: bool,
    sizing: resize.Sizing | None,
    queued: bool = False,
) -> Decision:
    st = (previous or ZeroTrainingJobStatus()).model_copy(deep=True)
    if is_true(st, ConditionType.INVALID_SPEC):  # the spec was fixed: admit the job afresh
        st.phase, st.completion_time = Phase.PENDING, None
        set_condition(st, ConditionType.FAILED, False, Reason.SPEC_VALID, "spec is valid", now)
    set_condition(st, ConditionType.INVALID_SPEC, False, Reason.SPEC_VALID, "spec is valid", now)
    gang = st.restarts.total
    st.replicas = spec.replicas
    current = [p for p in observed if p.gang == gang and not p.terminating and p.probe is None]
    probes = [p for p in observed if p.gang == gang and not p.terminating and p.probe is not None]
    st.ranks = rank_counts(spec, current)
    d = Decision(status=st)
    alive = [p.name for p in observed if not p.terminating]
    if st.phase in TERMINAL:
        return _finished(spec, d, observed, now)
    if spec.suspend:
        return _suspend(d, alive, now)
    if st.phase == Phase.SUSPENDED:
        st.phase, st.start_time = Phase.PENDING, None  # the deadline clock restarts, as for batch/v1 Jobs
        set_condition(st, ConditionType.SUSPENDED, False, Reason.JOB_RESUMED, "job resumed", now)
    deadline = spec.active_deadline_seconds
    if deadline and st.start_time and now - st.start_time >= timedelta(seconds=deadline):
        return _fail(
            d, observed, Reason.DEADLINE_EXCEEDED, f"job ran longer than activeDeadlineSeconds={deadline}", now
        )
    stale = [p for p in observed if p.gang != gang and not p.terminating]
    if not is_true(st, ConditionType.CREATED, Reason.GANG_CREATED):
        return _create(spec, d, observed, stale, now)
    d.delete_pods = [p.name for p in stale]
    # Pods another controller deleted, saying why (Kueue's TerminationTarget on a preempted workload's pods).
    leaving = [p for p in observed if p.gang == gang and p.terminating and p.disruption is not None]
    keep = _keepers(spec, queued, current)
    d = _judge(spec, d, current, now, backoff, replan, sizing, probes, leaving, keep)
    if d.status.phase in TERMINAL:  # a probe holds room for a gang that will not grow now
        d.delete_pods = sorted({*d.delete_pods, *(p.name for p in probes)})
    return d


def _create(
    spec: ZeroTrainingJobSpec, d: Decision, observed: Sequence[ObservedPod], stale: list[ObservedPod], now: datetime
) -> Decision:
    """Create the gang once the previous one is gone and the back-off has passed. After an in-place restart the
    living pods join it instead (moved into it, then told to start once every one stopped its old ranks); only the
    missing ones are created. An elastic gang's capacity probes stay until then (the room they hold is what the new
    gang needs) and go as it is created."""
    st = d.status
    gang = st.restarts.total
    in_place = st.restarts.strategy == RestartStrategy.IN_PLACE
    movable = {p.name for p in stale if in_place and p.alive and p.probe is None}
    # Pod names are stable per rank, so the old gang must be gone before the new one is created; so must a kept
    # pod whose container ended before it rejoined.
    died = [p for p in observed if p.gang == gang and not p.alive and p.round is not None and p.round < gang]
    old = [p for p in observed if (p.gang != gang or p.terminating) and p.probe is None and p.name not in movable]
    old += [p for p in died if p not in old]
    if old or movable:
        d.delete_pods = sorted(p.name for p in old if not p.terminating)
        d.move_pods = sorted(movable)
        d.requeue_after = 1.0 if old else 0.2
        return d
    kept = [p for p in observed if p.gang == gang and p.probe is None and p.round is not None and p.round < gang]
    if _rejoining(spec, d, kept, now):
        return d
    if st.next_restart_time and now < st.next_restart_time:
        d.requeue_after = (st.next_restart_time - now).total_seconds()
        return d
    d.delete_pods = [p.name for p in stale if p.probe is not None]
    d.create_gang = True
    d.start_pods = sorted(p.name for p in kept)
    st.next_restart_time = None
    st.start_time = st.start_time or now
    if st.phase != Phase.RESTARTING:
        st.phase = Phase.PENDING
    # A gang created over several passes stays Created=False/GangCreating, its transition time that of the first of
    # them, until the pass that creates its last pods says so (reconcile knows how many one pass creates).
    created = get_condition(st, ConditionType.CREATED)
    if created is None or created.reason != Reason.GANG_CREATING:
        set_condition(st, ConditionType.CREATED, True, Reason.GANG_CREATED, gang_created_message(st), now)
    return d


def _rejoining(spec: ZeroTrainingJobSpec, d: Decision, kept: list[ObservedPod], now: datetime) -> bool:
    """Whether the gang still waits for pods it keeps in place to stop their old rounds' ranks (no rank of an old
    round may meet one of the new). One that has not within failurePolicy.rejoinTimeoutSeconds of the restart is
    deleted, to be created again, and the Restarting condition says which and why."""
    stuck = sorted((p for p in kept if p.round_ended != p.round), key=lambda p: p.name)
    if not stuck:
        return False
    budget = spec.failure_policy.rejoin_timeout_seconds
    restarting = get_condition(d.status, ConditionType.RESTARTING)
    since = (restarting.last_transition_time if restarting is not None else None) or now
    left = budget - (now - since).total_seconds()
    if left > 0:
        d.requeue_after = min(1.0, left)
        return True
    names = ", ".join(p.name for p in stuck)
    message = (
        f"pod(s) {names} did not stop their ranks of round {stuck[0].round} within failurePolicy."
        f"rejoinTimeoutSeconds={budget} of the in-place restart; deleting them to create them again"
    )
    set_condition(d.status, ConditionType.RESTARTING, True, Reason.REJOIN_TIMEOUT, message, now)
    d.delete_pods = sorted({*d.delete_pods, *(p.name for p in stuck)})
    d.requeue_after = 1.0
    return True


def _keepers(spec: ZeroTrainingJobSpec, queued: bool, current: list[ObservedPod]) -> list[ObservedPod]:
    """The pods a restart of the gang keeps in place: every living one, where spec.failurePolicy asks for InPlace
    and it applies (a recreated pod must find the checkpoint on the shared claim; a Kueue group that lost a pod goes
    back to the queue whole, as Kueue re-admits a group, not a pod)."""
    if spec.failure_policy.restart_strategy != RestartStrategy.IN_PLACE or not spec.checkpoint.claim_name:
        return []
    alive = [p for p in current if p.alive]
    if queued and len(alive) < spec.replicas:
        return []
    return alive


def _judge(
    spec: ZeroTrainingJobSpec,
    d: Decision,
    current: list[ObservedPod],
    now: datetime,
    backoff: Backoff,
    replan: bool = False,
    sizing: resize.Sizing | None = None,
    probes: Sequence[ObservedPod] = (),
    leaving: Sequence[ObservedPod] = (),
    keep: Sequence[ObservedPod] = (),
) -> Decision:
    st = d.status
    by_replica = {p.replica: p for p in current}
    # The cause first: a rank that failed on its own before one that only lost its peer, then the earliest to end.
    failed = sorted(
        (p for p in current if p.phase == PodPhase.FAILED and p.disruption is None),
        key=lambda p: (p.peer_lost, p.finished is None, p.finished or now, p.replica or 0),
    )
    disrupted = [p for p in current if p.disruption is not None]
    missing = [r for r in range(spec.replicas) if r not in by_replica]
    if failed and failed[0].invalid_config:
        # Refused before any rank started, by the checks `zerotrain validate` runs: a new gang would be refused
        # alike, so no back-off is spent and the refusal itself is the condition's message.
        refused = failed[0]
        message = f"pod {refused.name} (node rank {refused.replica}) refused the job before any rank started: "
        return _fail(d, current, Reason.INVALID_CONFIG, message + refused.invalid_config, now)
    if failed and failed[0].out_of_memory and not failed[0].peer_lost:
        return _out_of_memory(spec, d, current, failed[0], now, replan)
    if failed:
        return _on_failure(spec, d, current, failed[0], now, backoff, keep)
    if disrupted or missing:
        # A pod that says why it ended: one of the gang's, else one another controller deleted saying why.
        told = disrupted or [p for p in leaving if p.replica in missing]
        cause = told[0].disruption if told else Disruption.DELETED
        what = told[0].name if told else f"pod of node rank {missing[0]}"
        assert cause is not None
        message = f"{what}: {cause.value}; restarting the gang (not counted)"
        return _restart(d, current, cause.value, message, now, 0, keep)
    if all(by_replica[r].phase == PodPhase.SUCCEEDED for r in range(spec.replicas)):
        d.delete_pods = sorted({*d.delete_pods, *(p.name for p in probes)})
        st.phase, st.completion_time = Phase.SUCCEEDED, now
        set_condition(st, ConditionType.SUCCEEDED, True, Reason.ALL_RANKS_SUCCEEDED, "all ranks exited 0", now)
        set_condition(st, ConditionType.RUNNING, False, Reason.COMPLETED, "job finished", now)
        if is_true(st, ConditionType.RESTARTING):
            set_condition(st, ConditionType.RESTARTING, False, Reason.COMPLETED, "job finished", now)
        return _ttl(spec, d, now)
    shrunk = resize.shrink(spec, sizing, current, now) if sizing is not None else None
    if isinstance(shrunk, resize.ResizeStep):
        return _resized(d, current, shrunk, now)
    if (delay := pod_start.report(spec, st, current, now, shrunk.why if shrunk else "")) is not None:
        d.requeue_after = delay
    if all(p.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED) for p in current):
        st.phase = Phase.RUNNING
        msg = f"{st.ranks.running} of {st.ranks.total} ranks running"
        set_condition(st, ConditionType.RUNNING, True, Reason.ALL_RANKS_RUNNING, msg, now)
        if is_true(st, ConditionType.RESTARTING):
            set_condition(st, ConditionType.RESTARTING, False, Reason.GANG_RECOVERED, "the new gang is running", now)
        if is_true(st, ConditionType.OUT_OF_MEMORY):
            msg = f"the gang at stage {spec.zero.fixed_stage.value} is running"
            set_condition(st, ConditionType.OUT_OF_MEMORY, False, Reason.GANG_RECOVERED, msg, now)
    elif st.phase != Phase.RESTARTING:
        st.phase = Phase.PENDING
    if sizing is not None:
        growth = resize.grow(spec, sizing, st, probes, now)
        if growth.step is not None:
            return _resized(d, current, growth.step, now)
        d.create_probes = growth.create_probes
        d.delete_pods = sorted({*d.delete_pods, *growth.delete_probes})
        if growth.look_again_in is not None:
            d.requeue_after = min(d.requeue_after or growth.look_again_in, growth.look_again_in)
    return d


def _resized(d: Decision, pods: list[ObservedPod], step: resize.ResizeStep, now: datetime) -> Decision:
    """Restart the gang at the resize's size (deleting a rank's pod makes it commit its step first)."""
    resize.keep(d.status, step)
    d.resize, d.resize_plan = step.record, step.plan
    r = step.record
    message = f"resizing the gang from {r.from_replicas} to {r.to_replicas} pods ({r.cause.value}): {r.message}"
    return _restart(d, pods, resize.RESIZED, message, now, 0)


def _on_failure(
    spec: ZeroTrainingJobSpec,
    d: Decision,
    current: list[ObservedPod],
    pod: ObservedPod,
    now: datetime,
    backoff: Backoff,
    keep: Sequence[ObservedPod] = (),
) -> Decision:
    policy, code = spec.failure_policy, pod.exit_code
    d.died = pod.finished
    where = f"pod {pod.name} (node rank {pod.replica}) exited with code {code}"
    if pod.peer_lost:
        # Every failed rank only lost its peer (whose own end was not a failure we saw, e.g. its node went):
        # its exit code says nothing about the program, so the exit-code rules do not apply.
        where += " after losing a peer rank"
    elif code is not None and code in policy.permanent_exit_codes:
        return _fail(d, current, Reason.PERMANENT_EXIT_CODE, f"{where}, listed in permanentExitCodes", now)
    elif policy.retryable_exit_codes and code not in policy.retryable_exit_codes:
        return _fail(d, current, Reason.NON_RETRYABLE_EXIT_CODE, f"{where}, not in retryableExitCodes", now)
    if d.status.restarts.failures >= policy.backoff_limit:
        msg = f"{where}; backoffLimit {policy.backoff_limit} spent"
        return _fail(d, current, Reason.BACKOFF_LIMIT_EXCEEDED, msg, now)
    delay = backoff.delay(d.status.restarts.failures + 1)
    return _restart(d, current, "Failed", f"{where}; restarting the whole gang in {delay:g}s", now, delay, keep)


def _out_of_memory(
    spec: ZeroTrainingJobSpec,
    d: Decision,
    current: list[ObservedPod],
    pod: ObservedPod,
    now: datetime,
    replan: bool,
) -> Decision:
    """A rank ran out of memory: the same gang would again. Under `stage: auto` below stage 3 the gang restarts
    at the next stage (from the newest checkpoint, resharded; cause OutOfMemory, not counted as a failure); else
    the job fails at once, saying what to change, with the plan's figures, instead of spending its back-off."""
    stage = spec.zero.fixed_stage
    d.died = pod.finished
    plan = ""
    if (mp := d.status.memory_plan) is not None and mp.usable_memory is not None:
        planned = mp.stages[stage]
        plan = f"; the plan gave stage {stage.value} {format_bytes(planned.required_bytes)} of " + (
            f"{format_bytes(mp.usable_memory)} usable per rank"
        )
    message = f"pod {pod.name} (node rank {pod.replica}): {pod.out_of_memory}{plan}"
    moves = replan and stage < Stage.PARAMETERS
    # Past stage 3 auto has one move left: recompute activations instead of keeping them (a third more compute).
    recompute = replan and not moves and not spec.zero.activation_checkpointing
    if moves:
        d.status.stage_floor = Stage(stage + 1)
        message += f"; stage auto moves to stage {stage.value + 1} or higher and restarts from the newest checkpoint"
    elif recompute:
        d.status.activation_checkpointing = True
        message += (
            "; stage auto turns on zero.activationCheckpointing at stage 3 and restarts from the newest checkpoint"
        )
    elif replan:
        message += "; stage auto has no stage above 3 left to try, and activation checkpointing is on"
    set_condition(d.status, ConditionType.OUT_OF_MEMORY, True, Reason.OUT_OF_MEMORY, message, now)
    if moves or recompute:
        return _restart(d, current, Reason.OUT_OF_MEMORY, message, now, 0)
    return _fail(d, current, Reason.OUT_OF_MEMORY, message, now)


def _restart(
    d: Decision,
    current: list[ObservedPod],
    cause: str,
    message: str,
    now: datetime,
    delay: float,
    keep: Sequence[ObservedPod] = (),
) -> Decision:
    """End the gang: the next one is status.restarts.total. The pods in `keep` stay (an in-place restart: moved into
    the next gang now, which stops their ranks); the others are deleted."""
    st = d.status
    counted = cause == "Failed"
    kept = sorted(p.name for p in keep)
    if kept:
        message += f"; in place: {len(kept)} of {len(current)} pods kept, their ranks started again"
    st.restarts.total += 1
    st.restarts.failures += int(counted)
    st.restarts.by_cause[cause] = st.restarts.by_cause.get(cause, 0) + 1
    st.restarts.in_place += int(bool(kept))
    st.restarts.strategy = RestartStrategy.IN_PLACE if kept else RestartStrategy.RECREATE
    st.next_restart_time = now + timedelta(seconds=delay) if delay > 0 else None
    st.phase = Phase.RESTARTING
    reason = Reason.RANK_FAILED if counted else cause
    set_condition(st, ConditionType.RESTARTING, True, reason, message, now)
    set_condition(st, ConditionType.RUNNING, False, Reason.GANG_RESTARTING, message, now)
    set_condition(st, ConditionType.CREATED, False, Reason.GANG_RESTARTING, message, now)
    d.delete_pods = sorted({*d.delete_pods, *(p.name for p in current if p.name not in kept)})
    d.move_pods = kept
    d.restart_cause = cause
    d.requeue_after = max(delay, 0.5)
    return d


def _fail(d: Decision, pods: Sequence[ObservedPod], reason: str, message: str, now: datetime) -> Decision:
    """Terminal failure: ranks still running are stopped; finished pods stay for their logs."""
    st = d.status
    st.phase, st.completion_time, st.next_restart_time = Phase.FAILED, now, None
    set_condition(st, ConditionType.FAILED, True, reason, message, now)
    if get_condition(st, ConditionType.RUNNING) is not None:
        set_condition(st, ConditionType.RUNNING, False, reason, message, now)
    if is_true(st, ConditionType.RESTARTING):
        set_condition(st, ConditionType.RESTARTING, False, reason, message, now)
    _stop_unfinished(d, pods)
    return d


def _stop_unfinished(d: Decision, pods: Sequence[ObservedPod]) -> None:
    """Pods of a failed job with ranks still running are deleted (SIGTERM: they commit their step); a pod between
    in-place rounds is told to end with its last round's outcome, so it stays Failed with its log, as a pod whose
    container ended does."""
    done = (PodPhase.SUCCEEDED, PodPhase.FAILED)
    told = [p for p in pods if p.exiting]
    d.exit_pods = sorted(p.name for p in pods if p.between_rounds and not p.terminating)
    left = [p for p in pods if not p.terminating and p not in told and p.name not in d.exit_pods]
    d.delete_pods = sorted({*d.delete_pods, *(p.name for p in left if p.phase not in done or p.alive)})


def _finished(spec: ZeroTrainingJobSpec, d: Decision, pods: Sequence[ObservedPod], now: datetime) -> Decision:
    if d.status.phase == Phase.FAILED:
        _stop_unfinished(d, pods)
    d.delete_pods = sorted({*d.delete_pods, *(p.name for p in pods if p.probe is not None and not p.terminating)})
    return _ttl(spec, d, now)


def _ttl(spec: ZeroTrainingJobSpec, d: Decision, now: datetime) -> Decision:
    ttl, done = spec.ttl_seconds_after_finished, d.status.completion_time
    if ttl is None or done is None:
        return d
    left = (done + timedelta(seconds=ttl) - now).total_seconds()
    d.delete_job = left <= 0
    d.requeue_after = None if d.delete_job else left
    return d


def _suspend(d: Decision, alive: list[str], now: datetime) -> Decision:
    st = d.status
    st.phase, st.next_restart_time = Phase.SUSPENDED, None
    set_condition(st, ConditionType.SUSPENDED, True, Reason.JOB_SUSPENDED, "spec.suspend is true; pods deleted", now)
    if get_condition(st, ConditionType.RUNNING) is not None:
        set_condition(st, ConditionType.RUNNING, False, Reason.JOB_SUSPENDED, "job suspended", now)
    if get_condition(st, ConditionType.CREATED) is not None:
        set_condition(st, ConditionType.CREATED, False, Reason.JOB_SUSPENDED, "job suspended", now)
    d.delete_pods = sorted(alive)
    return d


def invalid(previous: ZeroTrainingJobStatus | None, reason: str, message: str, now: datetime) -> ZeroTrainingJobStatus:
    """Status of a job admission refused: no pods, phase Failed, InvalidSpec True with the field path."""
    st = (previous or ZeroTrainingJobStatus()).model_copy(deep=True)
    st.phase = Phase.FAILED
    st.completion_time = st.completion_time or now
    set_condition(st, ConditionType.INVALID_SPEC, True, reason, message, now)
    set_condition(st, ConditionType.FAILED, True, reason, message, now)
    return st
