"""Job conditions: their types, reasons and the one way to set them (so a pass that changes nothing writes nothing)."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

from zerotrain.job_status import Condition, ZeroTrainingJobStatus


class ConditionType(str, Enum):
    """Condition types a job reports."""

    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    INVALID_SPEC = "InvalidSpec"
    UNSCHEDULABLE = "Unschedulable"
    CHILD_WRITE_FAILED = "ChildWriteFailed"
    CONTAINERS_WAITING = "ContainersWaiting"
    QUEUED = "Queued"
    QUEUE_UNAVAILABLE = "QueueUnavailable"
    STAGE_CHOSEN = "StageChosen"
    OUT_OF_MEMORY = "OutOfMemory"
    STRAGGLER = "Straggler"


class Reason:
    """Condition and Event reasons (CamelCase, machine-readable)."""

    GANG_CREATED = "GangCreated"
    GANG_CREATING = "GangCreating"
    GANG_RESTARTING = "GangRestarting"
    REJOIN_TIMEOUT = "RejoinTimeout"
    ALL_RANKS_RUNNING = "AllRanksRunning"
    RANK_FAILED = "RankFailed"
    GANG_RECOVERED = "GangRecovered"
    COMPLETED = "Completed"
    ALL_RANKS_SUCCEEDED = "AllRanksSucceeded"
    PERMANENT_EXIT_CODE = "PermanentExitCode"
    NON_RETRYABLE_EXIT_CODE = "NonRetryableExitCode"
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    JOB_SUSPENDED = "JobSuspended"
    JOB_RESUMED = "JobResumed"
    STARTUP_TIMEOUT = "StartupTimeout"
    PODS_SCHEDULED = "PodsScheduled"
    CONTAINERS_STARTED = "ContainersStarted"
    WAITING_FOR_ADMISSION = "WaitingForAdmission"
    ADMITTED = "Admitted"
    KUEUE_NOT_INSTALLED = "KueueNotInstalled"
    LOCAL_QUEUE_NOT_FOUND = "LocalQueueNotFound"
    QUEUE_FOUND = "QueueFound"
    INVALID_SPEC = "InvalidSpec"
    INVALID_NAME = "InvalidName"
    INVALID_POD_TEMPLATE = "InvalidPodTemplate"
    ELASTIC_IN_QUEUE = "ElasticInQueue"
    MEMORY_PLAN_DOES_NOT_FIT = "MemoryPlanDoesNotFit"
    SPEC_VALID = "SpecValid"
    SLOW_INPUT = "SlowInput"
    SLOW_COMPUTE = "SlowCompute"
    GANG_KEEPS_PACE = "GangKeepsPace"
    LOWEST_STAGE_THAT_FITS = "LowestStageThatFits"
    OUT_OF_MEMORY = "OutOfMemory"
    INVALID_CONFIG = "InvalidConfig"


def get_condition(status: ZeroTrainingJobStatus, kind: ConditionType) -> Condition | None:
    return next((c for c in status.conditions if c.type == kind.value), None)


def is_true(status: ZeroTrainingJobStatus, kind: ConditionType, reason: str | None = None) -> bool:
    c = get_condition(status, kind)
    return c is not None and c.status == "True" and (reason is None or c.reason == reason)


def set_condition(
    status: ZeroTrainingJobStatus, kind: ConditionType, true: bool, reason: str, message: str, now: datetime
) -> None:
    """Upsert; lastTransitionTime moves only when the status flips, so repeated passes change nothing."""
    value = "True" if true else "False"
    old = get_condition(status, kind)
    if old is None:
        status.conditions.append(
            Condition(type=kind.value, status=value, reason=reason, message=message, last_transition_time=now)
        )
        return
    if old.status != value:
        old.last_transition_time = now
    old.status, old.reason, old.message = value, reason, message


def gang_created_message(status: ZeroTrainingJobStatus) -> str:
    return f"gang {status.restarts.total} created"
