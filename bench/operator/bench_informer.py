"""What one pod watch event costs the operator's process, through each informer it could use.

A gang start is thousands of pod events in a few seconds, all handled by the one interpreter that also sends the
creates, so the CPU an event costs is what sets the operator's pace against a plain client's. The same watch lines
(a gang's pods as a kubelet reports them, serialized as the API server streams them) go through:

- `reflector`: the operator's own (operator/client/reflector.py): decode, cache, add the job to the work queue;
- `client-informer`: the pinned kubernetes client's SharedInformer (`kubernetes.informer`): its Watch decodes each
  line into a V1Pod model, its cache stores it, its handler adds the job to the work queue; the operator's code
  reads dicts, so `client-informer+dict` adds the conversion it would need (`sanitize_for_serialization`);
- `kopf`: kopf's per-event processing (`process_resource_event`) with one `on.event` handler that adds the job, as
  the operator ran it when kopf watched the pods.

Printed: microseconds per event, median and range over the repetitions, and each as a ratio of the reflector's.

    python bench/operator/bench_informer.py --events 4000 --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import kopf
from kopf._cogs.structs import ephemera, references
from kopf._core.actions import lifecycles
from kopf._core.engines import indexing, posting
from kopf._core.reactor import inventory, processing
from kubernetes import client as k8s_client
from kubernetes import informer as k8s_informer
from kubernetes import watch as k8s_watch

from zerotrain.manifest import parse_spec
from zerotrain.operator.children import builders
from zerotrain.operator.client.cache import ObjectCache, job_of
from zerotrain.operator.client.reflector import PodSink
from zerotrain.operator.client.work_queue import WorkQueue
from zerotrain.operator.objects import Key


def watch_lines(events: int, pods: int = 256) -> list[str]:
    """MODIFIED events of a gang's pods, each a newer resourceVersion, as the API server streams them."""
    job = builders.JobRef("pace", "ns", "0f0e0d0c-0b0a-0908-0706-050403020100")
    spec = parse_spec({"image": "ghcr.io/zerotrain/runtime:0.1", "entrypoint": "m:f", "replicas": pods})
    _, *gang = builders.build_gang(job, spec, 0, pods)
    lines = []
    for i in range(events):
        pod = json.loads(json.dumps(gang[i % pods]))
        pod["metadata"].update(
            uid=f"uid-{i % pods}", resourceVersion=str(1000 + i), creationTimestamp="2026-12-05T00:00:00Z"
        )
        pod["spec"]["nodeName"] = f"node-{i % 16}"
        pod["status"] = {
            "phase": "Running",
            "podIP": f"10.0.{i % 250}.{i % 200}",
            "startTime": "2026-12-05T00:00:01Z",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-12-05T00:00:02Z"}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": "trainer",
                    "ready": True,
                    "restartCount": 0,
                    "image": "ghcr.io/zerotrain/runtime:0.1",
                    "imageID": "sha256:" + "ab" * 32,
                    "containerID": "containerd://" + "cd" * 32,
                    "started": True,
                    "state": {"running": {"startedAt": "2026-12-05T00:00:02Z"}},
                }
            ],
        }
        lines.append(json.dumps({"type": "MODIFIED", "object": pod}))
    return lines


def queue() -> WorkQueue[Key]:
    return WorkQueue(lambda n: 1.0)


def asked_for_the_job(q: WorkQueue[Key]) -> None:
    """Every path must have done the whole of its work: the gang's job is in the queue (once)."""
    assert q.get() == ("ns", "pace") and len(q) == 0


def reflector(lines: list[str]) -> float:
    q = queue()
    sink = PodSink(ObjectCache(), "ns", q.add)
    start = time.perf_counter()
    for line in lines:
        event = json.loads(line)  # what Kube.watch does with each line
        sink.event(event["type"], event["object"])
    took = time.perf_counter() - start
    asked_for_the_job(q)
    return took


def client_informer(lines: list[str], as_dict: bool) -> float:
    q = queue()
    api = k8s_client.ApiClient()
    informer = k8s_informer.SharedInformer(list_func=lambda **_: None, namespace="ns")

    def changed(pod: Any) -> None:
        if as_dict:
            pod = api.sanitize_for_serialization(pod)
            key = job_of(pod)
        else:  # job_of's reading, on the client's V1Pod
            job = (pod.metadata.labels or {}).get("zerotrain.dev/job")
            key = (pod.metadata.namespace, job) if job else None
        if key is not None:
            q.add(key)

    informer.add_event_handler(k8s_informer.MODIFIED, changed)
    watch = k8s_watch.Watch()
    start = time.perf_counter()
    for line in lines:
        # The informer's loop body: Watch.stream's decode of the line, then the cache and the handlers.
        event = watch.unmarshal_event(line, "V1Pod")
        informer._cache._put(event["object"])
        informer._fire(k8s_informer.MODIFIED, event["object"])
    took = time.perf_counter() - start
    asked_for_the_job(q)
    return took


def kopf_events(lines: list[str]) -> float:
    return asyncio.run(_kopf_events(lines))


async def _kopf_events(lines: list[str]) -> float:
    q = queue()
    registry = kopf.OperatorRegistry()

    @kopf.on.event("v1", "pods", registry=registry)
    async def on_pod(event: kopf.RawEvent, **_: Any) -> None:
        if (key := job_of(dict(event["object"]))) is not None:  # as the operator's own job handler takes a body
            q.add(key)

    settings = kopf.OperatorSettings()
    settings.posting.enabled = False
    resource = references.Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
    process: Callable[..., Any] = processing.process_resource_event
    memories = inventory.ResourceMemories()
    indexers = indexing.OperatorIndexers()
    events: posting.K8sEventQueue = asyncio.Queue()
    raw = [json.loads(line) for line in lines]  # kopf's aiohttp decodes before processing: counted apart below
    decode_start = time.perf_counter()
    for line in lines:
        json.loads(line)
    decode = time.perf_counter() - decode_start
    start = time.perf_counter()
    for event in raw:
        await process(
            lifecycle=lifecycles.all_at_once,
            indexers=indexers,
            registry=registry,
            settings=settings,
            memories=memories,
            memobase=ephemera.Memo(),
            resource=resource,
            raw_event=event,
            event_queue=events,
        )
    took = decode + time.perf_counter() - start
    asked_for_the_job(q)
    return took


SYSTEMS: dict[str, Callable[[list[str]], float]] = {
    "reflector": reflector,
    "client-informer": lambda lines: client_informer(lines, as_dict=False),
    "client-informer+dict": lambda lines: client_informer(lines, as_dict=True),
    "kopf": kopf_events,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # kopf logs each handler run
    lines = watch_lines(args.events)
    per_event: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    for rep in range(args.reps):
        order = list(SYSTEMS) if rep % 2 == 0 else list(reversed(SYSTEMS))  # interleaved, reversed every other
        for name in order:
            per_event[name].append(SYSTEMS[name](lines) / len(lines) * 1e6)
    base = statistics.median(per_event["reflector"])
    print(f"{args.events} pod watch events ({len(lines[0])} bytes each), {args.reps} reps: µs per event")
    for name, values in per_event.items():
        med = statistics.median(values)
        print(f"  {name:22s} {med:8.1f}  ({min(values):.1f}-{max(values):.1f})  {med / base:5.2f}x the reflector")


if __name__ == "__main__":
    main()
