"""What the API server says about a job's pods, reduced to the facts status and restart decisions need."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from zerotrain.operator.children import kueue, naming
from zerotrain.pod_contract import INVALID_CONFIG_OUTCOME, ROUND_ANNOTATION, ROUND_END_ANNOTATION, ROUND_EXIT
from zerotrain.pod_rounds import parse_round, parse_round_end


class PodPhase(str, Enum):
    """Kubernetes pod phase."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class Disruption(str, Enum):
    """Why a pod ended without its program failing; such restarts don't count against backoffLimit."""

    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    NODE_LOST = "NodeLost"
    NODE_SHUTDOWN = "NodeShutdown"
    DELETED = "PodDeleted"


# pod.status.reason values set by the kubelet, node lifecycle and scheduler.
_BY_POD_REASON = {
    "Evicted": Disruption.EVICTED,
    "Preempting": Disruption.PREEMPTED,
    "Preempted": Disruption.PREEMPTED,
    "NodeLost": Disruption.NODE_LOST,
    "DeletionByTaintManager": Disruption.NODE_LOST,
    "Shutdown": Disruption.NODE_SHUTDOWN,
    "Terminated": Disruption.NODE_SHUTDOWN,
    "NodeShutdown": Disruption.NODE_SHUTDOWN,
}
# Reasons of the DisruptionTarget pod condition (Kubernetes >= 1.26).
_BY_DISRUPTION_TARGET = {
    "PreemptionByScheduler": Disruption.PREEMPTED,
    "PreemptionByKubeScheduler": Disruption.PREEMPTED,
    "DeletionByTaintManager": Disruption.NODE_LOST,
    "DeletionByPodGC": Disruption.NODE_LOST,
    "EvictionByEvictionAPI": Disruption.EVICTED,
    "TerminationByKubelet": Disruption.NODE_SHUTDOWN,
}
# The condition Kueue sets on each pod of a workload it stops, before deleting the pod (its pod integration's Stop):
# its reason says why, e.g. WorkloadEvictedDueToPreempted when a higher-priority workload took the quota.
KUEUE_STOPPED = "TerminationTarget"
KUEUE_EVICTED = "WorkloadEvicted"
PREEMPTED_MESSAGE = "preempted"
"""The runtime writes this to /dev/termination-log when it exits 0 after SIGTERM, so a checkpointed
preemption is not mistaken for a finished run."""


@dataclass(frozen=True)
class ObservedPod:
    """One pod of the job as last seen."""

    name: str
    replica: int | None
    gang: int | None
    phase: PodPhase
    ready: bool = False
    terminating: bool = False
    exit_code: int | None = None
    disruption: Disruption | None = None
    created: datetime | None = None
    message: str = ""
    finished: datetime | None = None
    """When the training container terminated (its finishedAt): the first failure by this time is the cause."""
    peer_lost: bool = False
    """Its ranks failed because a peer was gone (the runtime says so in the termination message): a consequence,
    never the cause, of a gang's failure."""
    waiting: str = ""
    """Why a container cannot start (ImagePullBackOff, CreateContainerConfigError...), as the kubelet says."""
    waiting_message: str = ""
    """The kubelet's message for `waiting`."""
    gated: bool = False
    """Kueue holds it (its admission scheduling gate): the gang waits for quota, it is not stuck."""
    invalid_config: str = ""
    """The launcher's refusal before any rank started (the entry point, the pretrained files: the checks `zerotrain
    validate` runs), when that is how it ended: the same gang would be refused again."""
    out_of_memory: str = ""
    """Why it ran out of memory, when it did: the rank's own account (`runtime.job.out_of_memory`), or the
    kubelet's OOMKilled."""
    scheduled: bool = False
    """A node was chosen for it (PodScheduled=True, a nodeName, or a phase past Pending)."""
    unschedulable: str = ""
    """The scheduler's message when it found no node (PodScheduled=False, reason Unschedulable)."""
    probe: int | None = None
    """A capacity probe of an elastic job (its index, `naming.LABEL_PROBE`), not a rank pod."""
    node: str = ""
    """The node it was bound to (spec.nodeName), once scheduled."""
    alive: bool = False
    """Its container runs (phase Running, not terminating, no disruption under way): a pod an in-place restart
    keeps. `phase` is what its ranks do: Pending while it waits for its next round, Failed (or Succeeded) once it
    reported its round ended as a terminated container would."""
    round: int | None = None
    """The rendezvous round its launcher was told to run (`pod_contract.ROUND_ANNOTATION`); None for a pod of an
    operator before in-place restarts."""
    round_ended: int | None = None
    """The newest round whose ranks its launcher reported stopped (`pod_contract.ROUND_END_ANNOTATION`)."""
    exiting: bool = False
    """Its launcher was told to end with its last round's outcome (`pod_contract.ROUND_EXIT`)."""
    config: str = ""
    """The ConfigMap it mounts as its job config (a pod kept in place keeps the one it was created with)."""

    @property
    def between_rounds(self) -> bool:
        """Alive with no rank running: its launcher reported its round's end and waits for word."""
        return self.alive and self.round is not None and self.round_ended == self.round


def timestamp(value: Any) -> datetime | None:
    """An API timestamp (RFC 3339, 'Z' for UTC) as a datetime; None when absent."""
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _terminated(status: dict[str, Any]) -> dict[str, Any]:
    """The training container's termination record (any container's if it has another name)."""
    records = status.get("containerStatuses") or []
    records = sorted(records, key=lambda c: c.get("name") != naming.CONTAINER_NAME)
    for c in records:
        term = (c.get("state") or {}).get("terminated") or (c.get("lastState") or {}).get("terminated")
        if term:
            return dict(term)
    return {}


def _disruption(pod: dict[str, Any], phase: PodPhase, term: dict[str, Any]) -> Disruption | None:
    status = pod.get("status") or {}
    if found := _BY_POD_REASON.get(status.get("reason") or ""):
        return found
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return _BY_DISRUPTION_TARGET.get(cond.get("reason") or "", Disruption.EVICTED)
        if cond.get("type") == KUEUE_STOPPED and cond.get("status") == "True":
            reason = str(cond.get("reason") or "")
            if reason.startswith(KUEUE_EVICTED):  # WorkloadEvictedDueToPreempted, ...DueToPodsReadyTimeout, ...
                return Disruption.PREEMPTED if "Preempted" in reason else Disruption.EVICTED
    if phase == PodPhase.UNKNOWN:
        return Disruption.NODE_LOST
    if phase == PodPhase.SUCCEEDED and (term.get("message") or "").strip().startswith(PREEMPTED_MESSAGE):
        return Disruption.PREEMPTED
    return None


# Container waiting reasons that mean the pod cannot start until someone acts (not a slow image pull).
STUCK_WAITING = (
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
)
# What the runtime's launcher writes in the termination message when a rank failed only because a peer died
# (zerotrain.runtime.zero.engine_errors.PeerLostError).
PEER_LOST_MARKERS = ("PeerLostError", "a peer rank is gone")


def _waiting(status: dict[str, Any]) -> tuple[str, str]:
    for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_WAITING:
            return str(waiting["reason"]), f"container {c.get('name')}: {waiting.get('message') or waiting['reason']}"
    return "", ""


def _config(pod: dict[str, Any]) -> str:
    volumes = (pod.get("spec") or {}).get("volumes") or []
    found: dict[str, Any] = next((v for v in volumes if v.get("name") == naming.CONFIG_VOLUME), {})
    return str((found.get("configMap") or {}).get("name") or "")


def _in_round(
    phase: PodPhase, alive: bool, gang: int | None, told: int | None, ended: int | None
) -> tuple[PodPhase, bool]:
    """(the phase of its ranks, whether the round's end stands for its container's) of a pod whose launcher runs
    rounds: moved to a gang past the round it was told to run, it waits (Pending); having reported the end of its
    gang's round, it ended as a container would have."""
    if not alive or told is None or gang is None:
        return phase, False
    if told < gang:
        return PodPhase.PENDING, False
    return (PodPhase.FAILED, True) if ended == gang else (phase, False)


def observe_pod(pod: dict[str, Any]) -> ObservedPod:
    md = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = md.get("labels") or {}
    annotations = md.get("annotations") or {}
    try:
        phase = PodPhase(status.get("phase") or "Pending")
    except ValueError:
        phase = PodPhase.UNKNOWN
    term = _terminated(status)
    terminating = bool(md.get("deletionTimestamp"))
    alive = phase == PodPhase.RUNNING and not terminating and _disruption(pod, phase, {}) is None
    gang, told = _int(labels.get(naming.LABEL_GANG)), parse_round(annotations.get(ROUND_ANNOTATION))
    ended = parse_round_end(annotations.get(ROUND_END_ANNOTATION))
    scheduled = phase != PodPhase.PENDING
    phase, reported = _in_round(phase, alive, gang, told, ended.round if ended else None)
    if reported and ended is not None:
        term = ended.termination()
        phase = PodPhase.FAILED if ended.exit_code else PodPhase.SUCCEEDED
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    waiting, waiting_message = _waiting(status)
    said = str(term.get("message") or "")
    placed: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    refused = placed.get("status") == "False" and placed.get("reason") == "Unschedulable"
    return ObservedPod(
        name=md.get("name", ""),
        replica=_int(labels.get(naming.LABEL_REPLICA)),
        gang=gang,
        phase=phase,
        ready=ready and phase == PodPhase.RUNNING,
        terminating=terminating,
        exit_code=_int(term.get("exitCode")) if phase == PodPhase.FAILED or term else None,
        disruption=_disruption(pod, phase, term),
        created=timestamp(md.get("creationTimestamp")),
        message=str(status.get("message") or term.get("reason") or ""),
        finished=timestamp(term.get("finishedAt")),
        peer_lost=any(m in said for m in PEER_LOST_MARKERS),
        waiting=waiting,
        waiting_message=waiting_message,
        gated=kueue.is_gated(pod),
        out_of_memory=_out_of_memory(term, said),
        invalid_config=_invalid_config(said),
        scheduled=placed.get("status") == "True" or bool((pod.get("spec") or {}).get("nodeName")) or scheduled,
        unschedulable=str(placed.get("message") or "no node fits it") if refused else "",
        probe=_int(labels.get(naming.LABEL_PROBE)),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        alive=alive,
        round=told,
        round_ended=ended.round if ended else None,
        exiting=annotations.get(ROUND_ANNOTATION) == ROUND_EXIT,
        config=_config(pod),
    )


# The account a rank that could not allocate leaves in the launcher's termination message.
OUT_OF_MEMORY_MARKER = "out of memory: rank "


def _out_of_memory(term: dict[str, Any], said: str) -> str:
    if (at := said.find(OUT_OF_MEMORY_MARKER)) >= 0:
        return _account(said[at:])
    if term.get("reason") == "OOMKilled":
        return "the kernel's OOM killer stopped the container at its memory limit (OOMKilled)"
    return ""


def _invalid_config(said: str) -> str:
    prefix = f"{INVALID_CONFIG_OUTCOME}: "
    if not said.startswith(prefix):
        return ""
    return _account(said.removeprefix(prefix))


def _account(said: str) -> str:
    """A launcher's account: its first line, without the "(exit status N)" the launcher appends."""
    return said.splitlines()[0].rsplit(" (exit status", 1)[0]


def observe_pods(pods: list[dict[str, Any]]) -> list[ObservedPod]:
    return sorted((observe_pod(p) for p in pods), key=lambda p: (p.replica is None, p.replica or 0, p.name))
