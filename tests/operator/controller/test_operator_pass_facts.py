"""settle: the one status a pass writes, from compute_status's decision and what the pass's writes did; a pass
held back keeps the previous status and says why, one that acted says how far its gang's creation got."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from zerotrain.job_status import Phase
from zerotrain.manifest import parse_spec
from zerotrain.operator.children import kueue
from zerotrain.operator.client.kube import KubeError
from zerotrain.operator.controller.api_failure import ChildWriteError
from zerotrain.operator.controller.conditions import ConditionType, Reason, get_condition, is_true
from zerotrain.operator.controller.observe import ObservedPod, PodPhase
from zerotrain.operator.controller.pass_facts import Acted, settle
from zerotrain.operator.controller.status import Backoff, compute_status

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def spec() -> Any:
    return parse_spec({"image": "i", "entrypoint": "m:f", "replicas": 600, "nprocPerNode": 1})


def refused() -> ChildWriteError:
    answer = KubeError(403, "Forbidden", "exceeded quota: q", "POST")
    return ChildWriteError("create", "Pod", "v1", "j-worker-0", answer)


def test_a_gang_larger_than_one_pass_says_how_far_it_got_and_asks_for_the_next_pass_now() -> None:
    d = compute_status(spec(), [], None, NOW, Backoff())
    s = settle(None, d.status, d.requeue_after, Acted(gang_created=(500, 600)), NOW)
    c = get_condition(s.status, ConditionType.CREATED)
    assert c is not None and (c.status, c.reason) == ("False", Reason.GANG_CREATING)
    assert c.message == "500 of 600 pods of gang 0 created; the next pass creates more"
    assert s.requeue_after == 0.0
    assert not is_true(d.status, ConditionType.CREATED, Reason.GANG_CREATING)  # the decision itself is untouched
    later = NOW + timedelta(seconds=2)
    d2 = compute_status(spec(), [], s.status, later, Backoff())
    done = settle(s.status, d2.status, d2.requeue_after, Acted(gang_created=(600, 600)), later)
    c = get_condition(done.status, ConditionType.CREATED)
    assert c is not None and (c.status, c.reason, c.message) == ("True", Reason.GANG_CREATED, "gang 0 created")
    assert c.last_transition_time == later and done.requeue_after == d2.requeue_after


def test_a_refused_write_keeps_the_previous_status_with_the_refusal_and_clears_once_writes_go_through() -> None:
    before = compute_status(spec(), [], None, NOW, Backoff())
    first = settle(None, before.status, None, Acted(gang_created=(600, 600)), NOW)
    d = compute_status(spec(), [], first.status, NOW, Backoff())
    held = settle(first.status, d.status, d.requeue_after, Acted(refused=refused()), NOW)
    c = get_condition(held.status, ConditionType.CHILD_WRITE_FAILED)
    assert c is not None and (c.status, c.reason) == ("True", "QuotaExceeded")
    assert "j-worker-0" in c.message and held.requeue_after is None
    assert held.status.model_dump(exclude={"conditions"}) == first.status.model_dump(exclude={"conditions"})
    retry = compute_status(spec(), [], held.status, NOW, Backoff())  # the next pass starts from what was written
    ok = settle(held.status, retry.status, retry.requeue_after, Acted(), NOW)
    c = get_condition(ok.status, ConditionType.CHILD_WRITE_FAILED)
    assert c is not None and (c.status, c.reason) == ("False", "ChildrenWritten")


def test_a_missing_queue_creates_nothing_and_says_so() -> None:
    d = compute_status(spec(), [], None, NOW, Backoff())
    missing = (Reason.LOCAL_QUEUE_NOT_FOUND, "LocalQueue 'q' not found in namespace 'a'")
    s = settle(None, d.status, d.requeue_after, Acted(queue_missing=missing), NOW)
    c = get_condition(s.status, ConditionType.QUEUE_UNAVAILABLE)
    assert c is not None and (c.status, c.reason, c.message) == ("True", *missing)
    assert get_condition(s.status, ConditionType.CREATED) is None and s.status.phase == Phase.PENDING
    assert s.status.start_time is None  # nothing the pass decided happened


def test_a_held_gang_says_what_kueue_says_it_waits_for_and_the_same_words_write_nothing_new() -> None:
    workload = {
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": "couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor "
                    "cpu-only, 2 more needed",
                }
            ]
        }
    }
    said = kueue.waiting_reason(workload)
    assert said is not None and said.startswith("Pending: couldn't assign flavors")
    assert kueue.waiting_reason({"status": {"conditions": [{"type": "QuotaReserved", "status": "True"}]}}) is None
    gated = [ObservedPod(name=f"j-worker-{r}", replica=r, gang=0, phase=PodPhase.PENDING, gated=True) for r in range(2)]
    two = parse_spec({"image": "i", "entrypoint": "m:f", "replicas": 2})
    first = compute_status(two, [], None, NOW, Backoff()).status
    d = compute_status(two, gated, first, NOW, Backoff())
    held = settle(first, d.status, None, Acted(kueue_says=said), NOW).status
    queued = get_condition(held, ConditionType.QUEUED)
    assert queued is not None and queued.reason == Reason.WAITING_FOR_ADMISSION
    assert queued.message.endswith(f"; Kueue: {said}"), queued.message
    again = compute_status(two, gated, held, NOW + timedelta(seconds=5), Backoff())
    assert settle(held, again.status, None, Acted(kueue_says=said), NOW).status == held
