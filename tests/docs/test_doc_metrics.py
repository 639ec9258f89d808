"""Every `zerotrain_...` name README.md and docs/*.md mention is one the code exports: a metric of a rank
(runtime/job/rank_metrics.py's RankMetrics, its collector fed a snapshot with every field set) or of the operator
(operator/metrics.py's OperatorMetrics, with a reconcile, a job and a gang restart recorded), as Prometheus sees
them in the text exposition; or a label those series carry or the chart's monitors add.

Names are what a query uses: a gauge's name; a counter's `_total` (and `_created`) series, not its bare family
name; a histogram's family name or its `_bucket`, `_sum`, `_count` (and `_created`) series.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from md_extract import MetricMention, doc_files, metric_mentions
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

MENTIONS = [m for f in doc_files() for m in metric_mentions(f)]


@dataclass(frozen=True)
class Exported:
    names: frozenset[str]
    """What a query can name."""
    labels: frozenset[str]
    families: dict[str, str]
    """Family name -> type."""


def exposition(registry: CollectorRegistry) -> tuple[set[str], set[str], dict[str, str]]:
    names: set[str] = set()
    labels: set[str] = set()
    families: dict[str, str] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        families[fam.name] = fam.type
        if fam.type in ("gauge", "histogram", "summary", "untyped"):
            names.add(fam.name)
        for s in fam.samples:
            names.add(s.name)
            labels.update(s.labels)
    labels.discard("le")
    labels.discard("quantile")
    return names, labels, families


class _AnyBytes:
    """A MemoryReport stand-in: every field the exporter reads is 1."""

    def __getattr__(self, name: str) -> int:
        return 1


def rank_registry() -> CollectorRegistry:
    from zerotrain.runtime.job.device_memory import DeviceMemory
    from zerotrain.runtime.job.rank_metrics import RankMetrics, Snapshot, StepValues

    m = RankMetrics("job", rank=0, local_rank=0, world_size=2, stage=3, total_steps=10)
    cuda = {"allocated": 1, "reserved": 1, "peak_allocated": 1, "alloc_retries": 1}
    step = StepValues(
        step=1,
        seconds=0.1,
        loss=1.0,
        grad_norm=1.0,
        learning_rate=1e-3,
        loss_scale=1.0,
        applied=True,
        skipped=False,
        tokens=10,
    )
    memory: Any = _AnyBytes()
    m.snapshot = Snapshot(
        memory=memory,
        comm={"all_gather": (1, 1, 1, 0.1)},
        comm_planned={"all_gather": 1},
        device=DeviceMemory(device="cuda:0", used_bytes=1, limit_bytes=2, rss_bytes=1, cuda=cuda),
        step=step,
        grad_norm=1.0,
        steps_applied=1,
        tokens=10,
        saves=1,
        save_seconds=0.1,
        save_bytes=1,
        last_save_seconds=0.1,
        blocked_seconds=0.1,
        last_blocked_seconds=0.01,
        last_committed_step=1,
        load_seconds=0.1,
        load_bytes=1,
    )
    m.step_seconds.observe(0.1)
    return m.registry


def operator_registry() -> CollectorRegistry:
    from datetime import datetime, timezone

    from zerotrain import goodput
    from zerotrain.job_status import Phase, Resize, ResizeCause
    from zerotrain.operator.metrics import JobView, OperatorMetrics
    from zerotrain.zero_config import Stage

    m = OperatorMetrics()
    m.observe_reconcile("ok", 0.01)
    m.gang_restarted("RankFailed")
    m.resized(Resize(from_replicas=4, to_replicas=3, cause=ResizeCause.UNSCHEDULABLE, gradient_accumulation_steps=4))
    m.replanned("OutOfMemory")
    m.api_request("POST", "pods", 201, 0.5)
    ledger = goodput.start(datetime(2026, 12, 7, tzinfo=timezone.utc))
    view = JobView(next(iter(Phase)), {"failure": 1}, replicas=3, stage=Stage.PARAMETERS, goodput=ledger)
    m.set_job(("ns", "job"), view)
    return m.registry


def monitor_labels() -> set[str]:
    """Labels the chart's PodMonitor and ServiceMonitor relabelings add."""
    from doc_run import chart_util

    values = {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}}
    out: set[str] = set()
    for obj in chart_util.render(values):
        if obj["kind"] in ("PodMonitor", "ServiceMonitor"):
            spec = obj["spec"]
            for ep in [*spec.get("podMetricsEndpoints", []), *spec.get("endpoints", [])]:
                for r in [*ep.get("relabelings", []), *ep.get("metricRelabelings", [])]:
                    if "targetLabel" in r:
                        out.add(r["targetLabel"])
    return out


_exported: list[Exported] = []


def exported() -> Exported:
    if not _exported:
        names: set[str] = set()
        labels = monitor_labels()
        families: dict[str, str] = {}
        for registry in (rank_registry(), operator_registry()):
            n, lab, fam = exposition(registry)
            names |= n
            labels |= lab
            families |= fam
        _exported.append(Exported(frozenset(names), frozenset(labels), families))
    return _exported[0]


def where(m: MetricMention) -> str:
    return f"{m.where}:{m.text}"


def test_the_exporters_export_what_a_query_names() -> None:
    e = exported()
    # The suffix rules this test relies on, on the real families.
    assert e.families["zerotrain_step_duration_seconds"] == "histogram"
    assert {f"zerotrain_step_duration_seconds{s}" for s in ("", "_bucket", "_sum", "_count")} <= e.names
    assert e.families["zerotrain_checkpoint_saves"] == "counter"
    assert "zerotrain_checkpoint_saves_total" in e.names and "zerotrain_checkpoint_saves" not in e.names
    assert {"zerotrain_job", "rank"} <= e.labels
    assert any(n.startswith("zerotrain_operator_") for n in e.names)
    assert any(n.startswith("zerotrain_cuda_") for n in e.names)


def test_the_docs_mention_metrics() -> None:
    assert len(MENTIONS) > 30


@pytest.mark.parametrize("mention", MENTIONS, ids=where)
def test_every_metric_the_docs_name_is_exported(mention: MetricMention) -> None:
    e = exported()
    known: Iterable[str] = e.names | e.labels
    if mention.prefix:
        (prefix,) = mention.candidates
        assert any(n.startswith(prefix) for n in known), (
            f"{mention.where}: no exported metric starts with {prefix} ({mention.text})"
        )
        return
    found = [c for c in mention.candidates if c in known]
    if len(mention.candidates) > 1:
        assert len(found) == 1, (
            f"{mention.where}: `{mention.text}` abbreviates after a full name; it should stand for exactly one "
            f"exported metric of {list(mention.candidates)}, found {found}"
        )
        return
    (name,) = mention.candidates
    hint = sorted(n for n in e.names if n.split("_")[1] == name.split("_")[1])
    assert found, f"{mention.where}: {name} is not exported (by a rank, the operator or the chart's monitors); {hint}"
