"""Elastic gangs in compute_status (`controller.resize`): shrink past the startup timeout to what was scheduled, probe
for room after the hold-off, grow when probes are placed, never below minReplicas or to a size that does not fit."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from zerotrain.elastic import ElasticSpec
from zerotrain.job_status import Phase, Resize, ResizeCause, ZeroTrainingJobStatus
from zerotrain.manifest import parse_spec
from zerotrain.operator.children import builders, naming
from zerotrain.operator.controller import resize
from zerotrain.operator.controller.conditions import ConditionType, get_condition, is_true
from zerotrain.operator.controller.observe import ObservedPod, PodPhase, observe_pod
from zerotrain.operator.controller.status import Backoff, compute_status
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.zero_config import Stage

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
LONG_AGO = NOW - timedelta(minutes=30)


def manifest(**extra: Any) -> ZeroTrainingJobSpec:
    raw = {
        "image": "i",
        "entrypoint": "m:f",
        "replicas": 4,
        "zero": {"stage": 2, "gradientAccumulationSteps": 3},
        "elastic": {"minReplicas": 2, "maxReplicas": 4, "holdOffSeconds": 300},
        "scheduling": {"startupTimeoutSeconds": 60},
        "checkpoint": {"claimName": "ckpt"},
        **extra,
    }
    return parse_spec(raw)


def sizing(spec: ZeroTrainingJobSpec, refuse: tuple[int, ...] = ()) -> resize.Sizing:
    assert spec.elastic is not None

    def check(r: int) -> resize.SizeVerdict:
        return resize.SizeVerdict(r not in refuse, Stage.GRADIENTS, "plan does not fit" if r in refuse else "")

    return resize.Sizing(spec.elastic, spec, check)


def rank(replica: int, gang: int = 0, scheduled: bool = True, **kw: Any) -> ObservedPod:
    phase = PodPhase.RUNNING if scheduled else PodPhase.PENDING
    unschedulable = "" if scheduled else "0/3 nodes are available: 3 Insufficient cpu."
    return ObservedPod(
        f"j-worker-{replica}", replica, gang, phase, scheduled=scheduled, unschedulable=unschedulable, created=LONG_AGO
    )


def probe(index: int, gang: int = 0, scheduled: bool = False) -> ObservedPod:
    phase = PodPhase.RUNNING if scheduled else PodPhase.PENDING
    return ObservedPod(f"j-probe-{index}", None, gang, phase, scheduled=scheduled, probe=index, created=LONG_AGO)


def created(spec: ZeroTrainingJobSpec) -> ZeroTrainingJobStatus:
    return compute_status(spec, [], None, LONG_AGO, Backoff()).status


def test_pods_unschedulable_past_the_timeout_shrink_the_gang_to_what_was_scheduled() -> None:
    spec = manifest()
    st = created(spec)
    pods = [rank(0), rank(1), rank(2), rank(3, scheduled=False)]
    d = compute_status(spec, pods, st, NOW, Backoff(), sizing=sizing(spec))
    assert d.status.replicas == 3 and d.resize is not None
    r = d.resize
    assert (r.from_replicas, r.to_replicas, r.cause, r.gradient_accumulation_steps) == (
        4,
        3,
        ResizeCause.UNSCHEDULABLE,
        4,
    )
    assert "1 of 4 pods unschedulable for over startupTimeoutSeconds=60" in r.message
    assert "3 Insufficient cpu" in r.message and "4 micro-batches a rank per step" in r.message
    assert d.status.phase == Phase.RESTARTING and d.restart_cause == resize.RESIZED
    assert d.status.restarts.failures == 0 and d.status.restarts.by_cause == {"Resized": 1}
    assert sorted(d.delete_pods) == [f"j-worker-{i}" for i in range(4)]
    assert d.status.resizes == [r]


def test_a_resize_records_the_plan_admission_gave_its_size_asking_admission_once_per_size() -> None:
    from zerotrain.operator.controller.pass_facts import PassFacts
    from zerotrain.plan.model_states import PlanInput, plan

    spec = manifest()
    assert spec.elastic is not None
    asked: list[int] = []

    def check(r: int) -> resize.SizeVerdict:
        asked.append(r)
        return resize.SizeVerdict(True, Stage.GRADIENTS, plan=plan(PlanInput(parameters=1_000_000, data_parallel=r)))

    pods = [rank(0), rank(1), rank(2), rank(3, scheduled=False)]
    at_four = plan(PlanInput(parameters=1_000_000, data_parallel=4))
    facts = PassFacts(Stage.GRADIENTS, at_four)
    d = compute_status(
        spec, pods, created(spec), NOW, Backoff(), sizing=resize.Sizing(spec.elastic, spec, check), facts=facts
    )
    assert d.resize is not None and d.resize.to_replicas == 3
    assert asked == [3], "the resize's size was admitted again after the resize decided it"
    assert d.status.memory_plan == plan(PlanInput(parameters=1_000_000, data_parallel=3))


def test_a_size_that_does_not_fit_or_divide_is_skipped_and_min_replicas_holds() -> None:
    spec = manifest()
    st = created(spec)
    # Two scheduled of four: 3 would not be placed, 2 is the largest that fits and divides 12 slots.
    d = compute_status(
        spec, [rank(0), rank(1), rank(2, scheduled=False), rank(3, scheduled=False)], st, NOW, sizing=sizing(spec)
    )
    assert d.status.replicas == 2 and d.resize is not None and d.resize.gradient_accumulation_steps == 6
    # One scheduled: below minReplicas, no resize; the Unschedulable condition says what waits.
    pods = [rank(0), *(rank(i, scheduled=False) for i in (1, 2, 3))]
    d = compute_status(spec, pods, st, NOW, sizing=sizing(spec))
    assert d.resize is None and d.status.replicas == 4 and is_true(d.status, ConditionType.UNSCHEDULABLE)
    assert "elastic: 1 pod(s) scheduled, fewer than minReplicas=2" in _unschedulable(d.status)
    # Three scheduled, and neither 3 nor 2 pods' plan fits (a fixed stage): the condition says so, no resize.
    pods = [rank(0), rank(1), rank(2), rank(3, scheduled=False)]
    d = compute_status(spec, pods, st, NOW, sizing=sizing(spec, refuse=(2, 3)))
    assert d.resize is None
    said = _unschedulable(d.status)
    assert "j-worker-3: 0/3 nodes are available: 3 Insufficient cpu." in said  # the scheduler's own words
    assert "elastic: no smaller size runs (2: plan does not fit; 3: plan does not fit)" in said
    # Three scheduled, but a 3-pod gang's plan does not fit: 2.
    pods = [rank(0), rank(1), rank(2), rank(3, scheduled=False)]
    d = compute_status(spec, pods, st, NOW, sizing=sizing(spec, refuse=(3,)))
    assert d.resize is not None and d.resize.to_replicas == 2


def test_not_before_the_startup_timeout_and_never_without_elastic() -> None:
    spec = manifest()
    st = created(spec)
    young = rank(3, scheduled=False)
    young = ObservedPod(**{**young.__dict__, "created": NOW - timedelta(seconds=10)})
    d = compute_status(spec, [rank(0), rank(1), rank(2), young], st, NOW, sizing=sizing(spec))
    assert d.resize is None and d.requeue_after is not None and d.requeue_after <= 50
    fixed = spec.model_copy(update={"elastic": None})
    d = compute_status(fixed, [rank(0), rank(1), rank(2), rank(3, scheduled=False)], created(fixed), NOW)
    assert d.resize is None and is_true(d.status, ConditionType.UNSCHEDULABLE)


def shrunk() -> tuple[ZeroTrainingJobSpec, ZeroTrainingJobStatus]:
    """A gang resized to 3 at NOW and running since."""
    spec = manifest()
    d = compute_status(
        spec, [rank(0), rank(1), rank(2), rank(3, scheduled=False)], created(spec), NOW, sizing=sizing(spec)
    )
    three = builders.at_replicas(spec, 3)
    d = compute_status(three, [], d.status, NOW, sizing=sizing(spec))
    assert d.create_gang and d.status.replicas == 3
    d = compute_status(three, [rank(i, gang=1) for i in range(3)], d.status, NOW, sizing=sizing(spec))
    assert d.status.phase == Phase.RUNNING and d.create_probes == []
    return spec, d.status


def test_after_the_hold_off_probes_look_for_room_and_placed_probes_grow_the_gang() -> None:
    spec, st = shrunk()
    three = builders.at_replicas(spec, 3)
    gang = [rank(i, gang=1) for i in range(3)]
    early = compute_status(three, gang, st, NOW + timedelta(seconds=100), sizing=sizing(spec))
    assert early.create_probes == [] and early.requeue_after == 200  # the hold-off's end
    later = NOW + timedelta(seconds=301)
    d = compute_status(three, gang, st, later, sizing=sizing(spec))
    assert d.create_probes == [0] and d.resize is None  # one pod missing to maxReplicas
    d = compute_status(three, [*gang, probe(0, gang=1)], st, later, sizing=sizing(spec))
    assert d.create_probes == [] and d.resize is None  # still Pending: nothing to do
    d = compute_status(three, [*gang, probe(0, gang=1, scheduled=True)], st, later, sizing=sizing(spec))
    assert d.resize is not None and (d.resize.to_replicas, d.resize.cause) == (4, ResizeCause.CAPACITY_RETURNED)
    assert d.resize.gradient_accumulation_steps == 3 and d.status.replicas == 4
    assert "1 capacity probe(s) scheduled after the 300s hold-off" in d.resize.message
    assert sorted(d.delete_pods) == ["j-worker-0", "j-worker-1", "j-worker-2"]
    assert [r.cause for r in d.status.resizes] == [ResizeCause.UNSCHEDULABLE, ResizeCause.CAPACITY_RETURNED]
    # The probe keeps the room while the ranks save and stop; it goes as the 4-pod gang is created.
    four = builders.at_replicas(spec, 4)
    stopping = [ObservedPod(**{**p.__dict__, "terminating": True}) for p in gang]
    held = compute_status(four, [*stopping, probe(0, gang=1, scheduled=True)], d.status, later, sizing=sizing(spec))
    assert not held.create_gang and held.delete_pods == []
    new = compute_status(four, [probe(0, gang=1, scheduled=True)], d.status, later, sizing=sizing(spec))
    assert new.create_gang and new.delete_pods == ["j-probe-0"]


def test_probes_are_kept_for_the_next_size_only_and_an_ended_one_is_replaced() -> None:
    spec = manifest(elastic={"minReplicas": 1, "maxReplicas": 4, "holdOffSeconds": 0})
    two = builders.at_replicas(spec, 2)
    gang = [rank(i) for i in range(2)]
    st = compute_status(two, gang, created(two), NOW, sizing=sizing(spec)).status  # running at 2 pods
    d = compute_status(two, gang, st, NOW, sizing=sizing(spec))
    # 3 pods is the next size that divides 12 slots: one probe, not two.
    assert d.status.phase == Phase.RUNNING and d.create_probes == [0]
    ended = ObservedPod("j-probe-0", None, 0, PodPhase.FAILED, scheduled=True, probe=0)
    d = compute_status(two, [*gang, ended], st, NOW, sizing=sizing(spec))
    assert d.delete_pods == ["j-probe-0"] and d.create_probes == [] and d.resize is None


def test_a_finished_job_deletes_its_probes() -> None:
    spec, st = shrunk()
    three = builders.at_replicas(spec, 3)
    done = [ObservedPod(f"j-worker-{i}", i, 1, PodPhase.SUCCEEDED) for i in range(3)]
    d = compute_status(three, [*done, probe(0, gang=1)], st, NOW + timedelta(seconds=400), sizing=sizing(spec))
    assert d.status.phase == Phase.SUCCEEDED and d.delete_pods == ["j-probe-0"]


def test_a_probe_asks_for_what_a_rank_pod_asks_and_runs_nothing() -> None:
    init = {"name": "warm", "image": "busybox", "command": ["sh"], "resources": {"requests": {"cpu": "4"}}}
    spec = manifest(
        resources={"cpu": "2", "memory": "4Gi"},
        scheduling={"nodeSelector": {"pool": "train"}, "startupTimeoutSeconds": 60},
        podTemplate={"spec": {"initContainers": [init]}},
    )
    job = builders.JobRef("j", "ns", "uid")
    p = builders.build_probe(job, builders.at_replicas(spec, 3), 1, 0)
    assert p["metadata"]["name"] == "j-probe-0" and p["metadata"]["labels"][naming.LABEL_PROBE] == "0"
    assert naming.LABEL_REPLICA not in p["metadata"]["labels"]
    (c,) = p["spec"]["containers"]
    assert c["command"] == builders.PROBE_COMMAND and c["resources"]["requests"] == {"cpu": "2", "memory": "4Gi"}
    assert c["image"] == spec.image and "env" not in c and "volumeMounts" not in c
    # The init container's request counts toward the pod's (the larger of it and the containers' sum): kept.
    (i,) = p["spec"]["initContainers"]
    assert i["command"] == builders.PROBE_INIT_COMMAND and i["resources"] == init["resources"]
    # Placement and volumes (a claim's topology) as a rank pod's.
    rank_pod = builders.build_pod(job, builders.at_replicas(spec, 3), 0, 1)
    assert p["spec"]["nodeSelector"] == {"pool": "train"} and p["spec"]["volumes"] == rank_pod["spec"]["volumes"]
    seen = observe_pod(
        {**p, "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}}
    )
    assert seen.probe == 0 and seen.scheduled and seen.replica is None


def test_the_gang_in_force_gets_its_size_and_the_ranks_keep_the_manifests() -> None:
    spec = manifest()
    job = builders.JobRef("j", "ns", "uid")
    config, *pods = builders.build_gang(job, spec, 1, 3)
    assert len(pods) == 3
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["WORLD_SIZE"] == "3" and env["NNODES"] == "3"
    assert "replicas: 4" in config["data"][naming.CONFIG_KEY]


def _unschedulable(st: ZeroTrainingJobStatus) -> str:
    condition = get_condition(st, ConditionType.UNSCHEDULABLE)
    assert condition is not None
    return condition.message


def test_a_growth_that_had_to_shrink_back_doubles_the_hold_off() -> None:
    e = ElasticSpec(min_replicas=2, max_replicas=4, hold_off_seconds=300)

    def r(cause: ResizeCause) -> Resize:
        return Resize(from_replicas=3, to_replicas=4, cause=cause, gradient_accumulation_steps=3)

    shrink, grow = r(ResizeCause.UNSCHEDULABLE), r(ResizeCause.CAPACITY_RETURNED)
    assert resize.hold_off(e, []) == resize.hold_off(e, [shrink]) == 300
    assert resize.hold_off(e, [shrink, grow, shrink]) == 600
    assert resize.hold_off(e, [shrink, grow, shrink, grow, shrink]) == 1200
    assert resize.hold_off(e, [shrink, grow, shrink, grow]) == 300  # the last growth held: back to the stated one
