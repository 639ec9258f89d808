"""A pass's writes: make the cluster match a decision, and report what happened (`pass_facts.Acted`) for the
status to say. A refused child write ends the writes and is reported, naming the child."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from zerotrain.job_status import Phase
from zerotrain.operator.children import builders, kueue, naming
from zerotrain.operator.children.supporting import build_supporting
from zerotrain.operator.client.cached_client import CachedClient
from zerotrain.operator.client.fair_pool import FairPool
from zerotrain.operator.client.kube import Kube, KubeError, path_of
from zerotrain.operator.controller.api_failure import ChildWriteError
from zerotrain.operator.controller.conditions import ConditionType, Reason, is_true
from zerotrain.operator.controller.observe import observe_pod
from zerotrain.operator.controller.pass_facts import Acted
from zerotrain.operator.controller.status import TERMINAL, Decision
from zerotrain.pod_contract import ROUND_ANNOTATION, ROUND_EXIT
from zerotrain.spec import ZeroTrainingJobSpec

log = logging.getLogger(__name__)


@dataclass
class ChildWriter:
    """Writes one job's children: through `client` (the cache's view), pod creates and applies on the operator's
    shared, fair `pool`."""

    kube: Kube
    client: CachedClient
    pool: FairPool
    max_pod_creates_per_pass: int

    def act(
        self, job: builders.JobRef, spec: ZeroTrainingJobSpec, sized: ZeroTrainingJobSpec, d: Decision, supporting: bool
    ) -> Acted:
        """Make the cluster match the decision (`spec` is what the ranks read, `sized` the gang in force; with
        `supporting`, the spec changed or a gang starts, so the Service, ConfigMap and RBAC are applied)."""
        if d.create_gang and job.queue and (missing := self.queue_missing(job)):
            return Acted(queue_missing=missing)  # no gang without its queue
        try:
            created = self._write(job, spec, sized, d, supporting)
        except ChildWriteError as e:
            return Acted(refused=e)
        held = job.queue and is_true(d.status, ConditionType.QUEUED, Reason.WAITING_FOR_ADMISSION)
        return Acted(gang_created=created, kueue_says=self.kueue_says(job, d.status.restarts.total) if held else None)

    def _write(
        self, job: builders.JobRef, spec: ZeroTrainingJobSpec, sized: ZeroTrainingJobSpec, d: Decision, supporting: bool
    ) -> tuple[int, int] | None:
        # The supporting children follow the spec: applied when it changes and before every gang starts, not on each
        # of the many pod events in between.
        first: list[Write] = []
        then: list[Write] = []
        if supporting and d.status.phase not in TERMINAL and d.status.phase != Phase.SUSPENDED:
            first, then = self._supporting_writes(build_supporting(job, sized))
        for pod_name in d.delete_pods:
            with child_write("delete", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name}}):
                self.client.delete_pod(job.namespace, job.name, pod_name)
        gang = d.status.restarts.total
        # Moved first: a kept pod's launcher stops its ranks as soon as its gang label passes their round.
        if d.move_pods:
            self._on_pool(job, [self._patch_pod(job, n, labels={naming.LABEL_GANG: str(gang)}) for n in d.move_pods])
        created = None
        if d.create_gang:
            kept_since = gang - d.status.restarts.in_place
            gang_first, pods, created = self._gang_writes(job, spec, sized, gang, kept_since)
            first, then = first + gang_first, then + pods
        self._on_pool(job, first)
        self._on_pool(job, then)
        rounds = [(n, str(gang)) for n in d.start_pods] + [(n, ROUND_EXIT) for n in d.exit_pods]
        if rounds:
            self._on_pool(job, [self._patch_pod(job, n, annotations={ROUND_ANNOTATION: r}) for n, r in rounds])
        if d.create_probes:
            gang = d.status.restarts.total
            existing = {p["metadata"]["name"] for p in self.client.pods(job.namespace, job.name)}
            probes = [builders.build_probe(job, sized, gang, i) for i in d.create_probes]
            self._on_pool(job, [self._create(p) for p in probes if p["metadata"]["name"] not in existing])
        if d.delete_job:
            log.info("deleting %s/%s: ttlSecondsAfterFinished passed", job.namespace, job.name)
            self.kube.delete_job(job.namespace, job.name)
        return created

    def _supporting_writes(self, objs: list[dict[str, Any]]) -> tuple[list[Write], list[Write]]:
        """The job's ServiceAccount, Role, Service and PodGroup, applied at once; then its RoleBinding. A
        RoleBinding waits for its Role: without `bind`, the server checks that the operator holds what the Role
        grants, and refuses the binding while the Role does not exist."""
        first = [Write("apply", o, self.client.apply) for o in objs if o["kind"] != "RoleBinding"]
        return first, [Write("apply", o, self.client.apply) for o in objs if o["kind"] == "RoleBinding"]

    def _gang_writes(
        self, job: builders.JobRef, spec: ZeroTrainingJobSpec, sized: ZeroTrainingJobSpec, gang: int, since: int
    ) -> tuple[list[Write], list[Write], tuple[int, int]]:
        """The gang's ConfigMap (and the earlier ones going: `since`, the oldest gang whose config pods an
        in-place restart kept may still have mounted), to go with the supporting children; then its pods
        that do not exist yet, at most max_pod_creates_per_pass of them: a gang larger than that is created over
        several passes, so one job's pass never runs for minutes. Also (pods of the gang that will exist, pods in
        the gang). The pods go after the ServiceAccount (a real server refuses a pod whose account does not exist)
        and the ConfigMap (a pod of a begun gang means its ConfigMap exists), beside the RoleBinding: each phase of
        a new job's first pass is a round trip, and under a burst of jobs the slowest passes were the first ones."""
        present = self.client.pods(job.namespace, job.name)
        existing = {p["metadata"]["name"] for p in present}
        members = [
            observe_pod(p)
            for p in present
            if (p["metadata"].get("labels") or {}).get(naming.LABEL_GANG) == str(gang)
            and naming.LABEL_PROBE not in (p["metadata"].get("labels") or {})
        ]
        # Pods an in-place restart kept mount an earlier gang's config: the pods created beside them read the same.
        inherited = next((p.config for p in members if p.config != naming.config_map_name(job.name, gang)), None)
        config, *gang_pods = builders.build_gang(job, spec, gang, sized.replicas, inherited)
        first: list[Write] = []
        # An earlier pass began this gang (its ConfigMap exists and the earlier ones are gone), or it has none.
        if not members:
            first.append(Write("create", config, self.kube.ensure))  # once per gang; a retry keeps the first one
            # The earlier gangs' pods are gone (a gang is created only then): so go their configs. Pods kept in
            # place mount the config of the gang they were created in, up to one per in-place restart back; deleted
            # by name (a listing would be a read on every restart), a config already gone is a 404.
            first += [
                Write(
                    "delete",
                    {"metadata": {"name": naming.config_map_name(job.name, g)}},
                    lambda o: self.kube.delete_config_map(job.namespace, o["metadata"]["name"]),
                )
                for g in range(max(0, since - 1), gang)
            ]
        todo = [p for p in gang_pods if p["metadata"]["name"] not in existing]
        limit = self.max_pod_creates_per_pass
        done = len(gang_pods) - len(todo) + min(limit, len(todo))
        return first, [self._create(p) for p in todo[:limit]], (done, len(gang_pods))

    def kueue_says(self, job: builders.JobRef, gang: int) -> str | None:
        """Why Kueue holds the gang, from its Workload (None when it has none yet, or says nothing)."""
        path = path_of(kueue.API, "workloads", job.namespace, kueue.group_name(job.name, gang))
        try:
            return kueue.waiting_reason(self.kube.request("GET", path))
        except KubeError as e:
            if e.status in (403, 404):  # not created yet, or a chart without the grant: the plain message stands
                return None
            raise

    def queue_missing(self, job: builders.JobRef) -> tuple[str, str] | None:
        """(reason, message) when the job's Kueue LocalQueue (or Kueue itself) is missing, else None."""
        assert job.queue is not None
        path = path_of(kueue.API, "localqueues", job.namespace, job.queue)
        try:
            self.kube.request("GET", path)
            return None
        except KubeError as e:
            if e.status != 404:
                raise
        try:
            self.kube.request("GET", f"/apis/{kueue.API}")
            installed = True
        except KubeError:
            installed = False
        reason = Reason.LOCAL_QUEUE_NOT_FOUND if installed else Reason.KUEUE_NOT_INSTALLED
        return reason, kueue.missing_message(job.queue, job.namespace, installed)

    def _create(self, pod: dict[str, Any]) -> Write:
        return Write("create", pod, self.client.create_pod)

    def _patch_pod(
        self,
        job: builders.JobRef,
        name: str,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> Write:
        """A merge patch of a kept pod's gang label or round annotation (`pod_contract`'s in-place protocol)."""
        md: dict[str, Any] = {"name": name, "namespace": job.namespace}
        patch: dict[str, Any] = {
            "metadata": {
                **({"labels": labels} if labels else {}),
                **({"annotations": annotations} if annotations else {}),
            }
        }
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": md}
        return Write("patch", obj, lambda o: self.client.patch_pod(job.namespace, name, patch))

    def _on_pool(self, job: builders.JobRef, writes: list[Write]) -> None:
        """Send `writes` on the operator's shared workers, this job's in turn with every other job's (a pool of its
        own would let a big gang crowd out a small job beside it; one after another, a 128-pod gang took seconds);
        returns once all are answered. The first refusal, in `writes`' order, is the one raised (and the one the
        status reports)."""

        def one(w: Write) -> None:
            with child_write(w.verb, w.obj):
                w.send(w.obj)

        for future in self.pool.map((job.namespace, job.name), one, writes):
            future.result()


@dataclass(frozen=True)
class Write:
    """One child write of a pass: what it does (for a refusal's message), to which object, and how."""

    verb: str
    obj: dict[str, Any]
    send: Callable[[dict[str, Any]], object]


@contextlib.contextmanager
def child_write(verb: str, obj: dict[str, Any]) -> Iterator[None]:
    """Turn the server's refusal of a write to `obj` into a ChildWriteError that names the child."""
    try:
        yield
    except KubeError as e:
        md = obj.get("metadata", {})
        raise ChildWriteError(verb, obj.get("kind", "?"), obj.get("apiVersion", "?"), md.get("name", "?"), e) from e
