"""Reading a dashboard JSON back: the queries its panels and annotations run (what the tests check against a live
Prometheus and against `queries`)."""

from __future__ import annotations

from typing import Any


def annotation_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, expr) of every Prometheus annotation of a dashboard JSON (Grafana's built-in one has no expr)."""
    listed = dashboard.get("annotations", {}).get("list", [])
    return [(a.get("name", ""), a["expr"]) for a in listed if "expr" in a]


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of a dashboard JSON, rows included."""
    out = []
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            out += [(inner.get("title", ""), t["expr"]) for t in inner.get("targets", []) if "expr" in t]
    return out
