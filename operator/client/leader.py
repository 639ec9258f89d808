"""Leader election over a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it: so the chart may run
two or more operator replicas, of which one reconciles and the others wait to take over.

The Lease names its holder and when it last renewed. A candidate takes it when it is free, released, or not renewed
for `lease_seconds`; every write carries the resourceVersion it read, so two candidates racing for it get one 409
between them. The leader renews every `renew_seconds`; if it cannot for `lease_seconds` it must stop (another may
lead by then), and it releases the Lease on a clean stop so a standby takes over at once.

Why not `kubernetes.leaderelection` (the client's own, read in kubernetes 37.0.2): its candidate and renew loops are
`while True` around `time.sleep` with no way to stop them, so a standby could not be shut down with the operator;
it never releases the Lease, so every clean stop (a rolling update of the chart) would leave the standby waiting a
whole lease duration before it leads (client-go has ReleaseOnCancel for this); and its LeaseLock builds a
`CoordinationV1Api()` on the process-wide default configuration, not on the operator's `Kube` connection (its
kubeconfig, and the call catalogue the chart's RBAC is tested against).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from zerotrain.operator.client.kube import Kube, KubeError, path_of

log = logging.getLogger(__name__)
LEASE_API = "coordination.k8s.io/v1"
_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"  # a Lease's MicroTime


def _now_iso(now: float) -> str:
    return datetime.fromtimestamp(now, timezone.utc).strftime(_MICRO)


def _parse(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass
class LeaseTimings:
    """How long a Lease holds, how often the leader renews it, how often a candidate retries."""

    lease_seconds: float = 15.0
    renew_seconds: float = 5.0
    retry_seconds: float = 2.0


class LeaderElector:
    """Acquire, hold and release one Lease for `identity`."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        timings: LeaseTimings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.t = timings or LeaseTimings()
        self.clock = clock
        self.lost = threading.Event()
        self._path = path_of(LEASE_API, "leases", namespace, name)

    def _spec(self, now: float, acquire: bool, transitions: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.t.lease_seconds)),
            "renewTime": _now_iso(now),
            "leaseTransitions": transitions,
        }
        if acquire:
            spec["acquireTime"] = _now_iso(now)
        return spec

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this candidate holds the Lease afterwards."""
        now = self.clock()
        try:
            lease = self.kube.request("GET", self._path, retry=False)
        except KubeError as e:
            if e.status != 404:
                raise
            body = {
                "apiVersion": LEASE_API,
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, acquire=True, transitions=0),
            }
            try:
                self.kube.request("POST", path_of(LEASE_API, "leases", self.namespace), body, retry=False)
                return True
            except KubeError as race:
                if race.status == 409:
                    return False
                raise
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = _parse(spec.get("renewTime")) or 0.0
        duration = float(spec.get("leaseDurationSeconds") or self.t.lease_seconds)
        mine = holder == self.identity
        if not mine and holder and now < renewed + duration:
            return False  # held by a live leader
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        patch = {
            "metadata": {"resourceVersion": lease["metadata"].get("resourceVersion")},
            "spec": self._spec(now, acquire=not mine, transitions=transitions),
        }
        try:
            self.kube.request("PATCH", self._path, patch, "application/merge-patch+json", retry=False)
        except KubeError as e:
            if e.status == 409:  # another candidate wrote first
                return False
            raise
        if not mine:
            log.info("leader election: %s now holds lease %s/%s", self.identity, self.namespace, self.name)
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this candidate leads (True) or `stop` is set (False)."""
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    return True
            except KubeError as e:
                log.warning("leader election: %s", e)
            stop.wait(self.t.retry_seconds)
        return False

    def hold(self, stop: threading.Event, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew from a daemon thread until `stop`; call `on_lost` if renewal fails for a whole lease duration."""

        def renew() -> None:
            last_ok = self.clock()
            while not stop.wait(self.t.renew_seconds):
                try:
                    if self.try_acquire_or_renew():
                        last_ok = self.clock()
                        continue
                except KubeError as e:
                    log.warning("leader election: renewing failed: %s", e)
                if self.clock() - last_ok >= self.t.lease_seconds or not self._still_mine():
                    log.error("leader election: lost lease %s/%s; stopping", self.namespace, self.name)
                    self.lost.set()
                    on_lost()
                    return

        thread = threading.Thread(target=renew, name="zerotrain-lease", daemon=True)
        thread.start()
        return thread

    def _still_mine(self) -> bool:
        try:
            lease = self.kube.request("GET", self._path, retry=False)
        except KubeError:
            return True  # cannot tell yet: keep going until the lease duration has passed
        return bool((lease.get("spec") or {}).get("holderIdentity") == self.identity)

    def release(self) -> None:
        """Give the Lease up so a standby takes over without waiting for it to expire."""
        try:
            lease = self.kube.request("GET", self._path, retry=False)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            patch = {
                "metadata": {"resourceVersion": lease["metadata"].get("resourceVersion")},
                "spec": {"holderIdentity": "", "renewTime": _now_iso(self.clock() - 3600)},
            }
            self.kube.request("PATCH", self._path, patch, "application/merge-patch+json", retry=False)
            log.info("leader election: %s released lease %s/%s", self.identity, self.namespace, self.name)
        except KubeError as e:
            log.warning("leader election: could not release the lease: %s", e)
