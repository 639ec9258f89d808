"""Every dashboard line that is one rank's says which rank in its legend; no aggregated line claims a rank."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from promql_labels import keeps

from zerotrain.monitoring import queries as q
from zerotrain.monitoring.dashboard import dashboard_json

RANK_IN_LEGEND = re.compile(r"\{\{\s*rank\s*\}\}")


def rank_series(name: str, matchers: dict[str, str]) -> bool:
    """Every series a rank exports carries `rank` (runtime/job/rank_metrics.py); the operator's, DCGM's and
    Prometheus' own (`up`: its target labels are namespace, pod, zerotrain_job, zerotrain_node_rank) do not."""
    return name.startswith("zerotrain_") and not name.startswith("zerotrain_operator_")


def per_rank(expr: str) -> bool:
    return keeps(expr, "rank", rank_series)


def targets(board: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner.get("title", ""), target


BOARD = json.loads(dashboard_json())
TARGETS = list(targets(BOARD))


def test_every_per_rank_target_names_the_rank_in_its_legend() -> None:
    unnamed = [
        f"{title!r}: legend {t.get('legendFormat', '')!r} for {t['expr']}"
        for title, t in TARGETS
        if per_rank(t["expr"]) and not RANK_IN_LEGEND.search(t.get("legendFormat", ""))
    ]
    assert not unnamed, "one line per rank, but the legend does not say which rank:\n" + "\n".join(unnamed)


def test_no_aggregated_target_puts_a_rank_in_its_legend() -> None:
    # Grafana renders {{rank}} of a series without the label as nothing: "rank " on every line.
    claimed = [
        f"{title!r}: legend {t['legendFormat']!r} for {t['expr']}"
        for title, t in TARGETS
        if RANK_IN_LEGEND.search(t.get("legendFormat", "")) and not per_rank(t["expr"])
    ]
    assert not claimed, "the query aggregates the rank away, but the legend names it:\n" + "\n".join(claimed)


def test_the_dashboard_has_both_kinds_of_target() -> None:
    # Guards the two tests above against a parser that answers the same for everything.
    kinds = {per_rank(t["expr"]) for _, t in TARGETS}
    assert kinds == {True, False}
    assert per_rank(q.PHASE.expr), "the Rank phase timeline draws one state row per rank"


@pytest.mark.parametrize("query", [x for x in q.all_queries() if x.scope in (q.Scope.RANK, q.Scope.CUDA)])
def test_queries_declared_per_rank_are_judged_per_rank(query: q.Query) -> None:
    assert per_rank(query.expr), query.expr


# (expression, keeps rank): the label rules the parser claims, each shown once.
CASES = [
    ('zerotrain_phase{rank=~"$rank"} == 1', True),
    ("time() - zerotrain_heartbeat_timestamp_seconds{}", True),
    ("sum by (zerotrain_job) (zerotrain_memory_bytes)", False),
    ("sum by (zerotrain_job, rank) (zerotrain_memory_bytes)", True),
    ("sum (zerotrain_memory_bytes) by (rank)", True),
    ("sum without (rank) (zerotrain_memory_bytes)", False),
    ("sum without (category) (zerotrain_memory_bytes)", True),
    ("sum(zerotrain_memory_bytes)", False),
    ("topk(8, sum by (zerotrain_job, rank) (zerotrain_memory_bytes))", True),
    ("quantile by (zerotrain_job) (0.5, zerotrain_memory_bytes)", False),
    ("histogram_quantile(0.9, sum by (rank, le) (rate(zerotrain_step_duration_seconds_bucket[1m])))", True),
    ("zerotrain_step_x / on(zerotrain_job) group_left() quantile by (zerotrain_job) (0.5, zerotrain_step_x)", True),
    ("zerotrain_comm_bytes_total / on(namespace, pod) zerotrain_world_size", False),
    ("zerotrain_comm_bytes_total / ignoring(rank) zerotrain_world_size", False),
    ("zerotrain_comm_bytes_total / ignoring(op) group_left() zerotrain_optimizer_steps_total", True),
    ("DCGM_FI_DEV_FB_USED * on(namespace, pod) group_left(rank) zerotrain_world_size", True),
    ("DCGM_FI_DEV_FB_USED * on(namespace, pod) group_left(zerotrain_job) zerotrain_world_size", False),
    ("sum by (namespace, pod) (zerotrain_memory_bytes) and on(namespace, pod) DCGM_FI_DEV_FB_USED", False),
    ("up or zerotrain_step", True),
    ('label_replace(up, "rank", "$1", "instance", "(.*)")', True),
    ("zerotrain_operator_job_phase == 1", False),
]


@pytest.mark.parametrize(("expr", "expected"), CASES)
def test_the_parser_follows_prometheus_label_rules(expr: str, expected: bool) -> None:
    assert per_rank(expr) is expected


@pytest.mark.parametrize("expr", ["zerotrain_step offset 5m", "predict_linear(zerotrain_step[5m], 60)", "sum("])
def test_the_parser_refuses_what_it_does_not_know(expr: str) -> None:
    with pytest.raises(ValueError):
        per_rank(expr)
