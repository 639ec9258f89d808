"""The dashboard and the alerts against a real Prometheus: it scrapes a 2-rank `zerotrain run` (and, for the
operator's panels, the operator reconciling a job on the API server), and every query must answer for every rank
or for the job. A renamed metric, a lost label or a PromQL typo fails here, not on a user's blank panel."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from budget import budget

from zerotrain.monitoring import top_sources, top_view
from zerotrain.monitoring.alerts import ALERTS
from zerotrain.monitoring.dashboard_read import annotation_queries, panel_queries
from zerotrain.monitoring.queries import MARK_ABOVE, Query, Scope, all_queries, vars_all
from zerotrain.operator.client.kube import Kube
from zerotrain.runtime.job.launch import free_port

from .cluster import Cluster, until_async
from .conftest import Operator
from .kubelet import set_pod_phase
from .prometheus import Prometheus, running_prometheus
from .test_operator_e2e import call, start_job, wait_status

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "zerotrain-operator" / "dashboards" / "zerotrain-training.json"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
JOB = "promtest"
RANKS = {"0", "1"}
# Queries that need hardware this machine lacks; they must still parse and evaluate.
NEEDS = {Scope.CUDA: "ranks on CUDA", Scope.DCGM: "NVIDIA's DCGM exporter"}


def small_job(tmp_path: Path) -> Path:
    """The quickstart, smaller (2 ranks, stage 3, a checkpoint and an evaluation every 5 steps), as job `promtest`."""
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["metadata"]["name"] = JOB
    args = {"seq_len": 32, "batch_size": 4, "d_model": 32, "n_layers": 2, "n_heads": 2, "max_bytes": 200000}
    doc["spec"]["entrypointArgs"].update(args, eval_bytes=4000)
    doc["spec"].pop("model")  # its declared Ψ is the quickstart's; the runtime refuses it for this smaller GPT
    doc["spec"]["checkpoint"] = {"intervalSteps": 5, "keepLast": 2}
    doc["spec"]["training"]["evaluation"] = {"everySteps": 5, "batches": 2}  # the evaluation panel has a value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def zerotrain(*args: str) -> list[str]:
    return [sys.executable, "-m", "zerotrain.cli", *args]


def dashboard_queries() -> list[tuple[str, Query]]:
    """(panel, Query) of every query the shipped dashboard runs; each must be one `queries` defines."""
    known = {q.expr: q for q in all_queries()}
    out = []
    for title, expr in panel_queries(json.loads(DASHBOARD.read_text())):
        assert expr in known, f"panel {title!r} runs a query zerotrain.monitoring.queries does not define: {expr}"
        out.append((title, known[expr]))
    return out


def check(prom: Prometheus, name: str, expr: str, scope: Scope, counts: dict[str, str], job: str = JOB) -> None:
    """Evaluate `expr` with every variable on All and check it answers as its scope says."""
    result = prom.query(vars_all(expr))
    labels = [r["metric"] for r in result]
    if scope in NEEDS:
        counts[name] = f"{len(result)} series (needs {NEEDS[scope]})"
        return
    if scope is Scope.RANK:
        assert {m.get("rank") for m in labels} == RANKS, f"{name}: {expr}\nanswered {labels}"
    else:
        assert labels and all(m.get("zerotrain_job") == job for m in labels), f"{name}: {expr}\nanswered {labels}"
    counts[name] = f"{len(result)} series"


def report(counts: dict[str, str]) -> None:
    print("\nquery answers:", *(f"  {k}: {v}" for k, v in counts.items()), sep="\n")


@pytest.mark.slow
def test_dashboard_and_alert_queries_answer_for_every_rank(tmp_path: Path) -> None:
    manifest, ckpt, cfg = small_job(tmp_path), tmp_path / "ckpt", tmp_path / "scrape.yml"
    # A first short run commits a checkpoint, so the second resumes and the load panel has a value.
    first = subprocess.run(
        zerotrain("run", str(manifest), "--steps", "2", "--checkpoint-dir", str(ckpt), "--no-metrics"),
        capture_output=True,
        text=True,
        timeout=budget(180),
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["run", str(manifest), "--steps", "100000", "--checkpoint-dir", str(ckpt)]
        argv += ["--metrics-port", str(port), "--prometheus-config", str(cfg)]
        proc = subprocess.Popen(
            zerotrain(*argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path, env=env
        )
        try:
            run_against_prometheus(cfg, tmp_path, proc)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=budget(60))
    text = out.decode()
    assert f"port {port} taken, rank 0 on" in text, text
    served = re.search(r"rank 0 http://127\.0\.0\.1:(\d+)/metrics", text)
    assert served and int(served.group(1)) > port, text


def run_against_prometheus(cfg: Path, tmp_path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + budget(120)
    while not cfg.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "zerotrain run wrote no Prometheus configuration"
        time.sleep(0.2)
    config = yaml.safe_load(cfg.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    with running_prometheus(config, tmp_path / "prometheus") as prom:
        # Every rank scraped, resumed and stepping, with enough samples for 30 s rate windows and a checkpoint.
        prom.wait_for("count(count_over_time(zerotrain_step[30s]) >= 4)", lambda r: r and r[0]["value"][1] == "2", 120)
        prom.wait_for("count(zerotrain_checkpoint_saves_total > 0)", lambda r: r and r[0]["value"][1] == "2", 120)
        assert proc.poll() is None, "the run ended before the queries could be checked"
        counts: dict[str, str] = {}
        for title, query in dashboard_queries():
            if query.scope is not Scope.OPERATOR:
                check(prom, f"panel {title!r} {query.legend!r}", query.expr, query.scope, counts)
        for alert in ALERTS:
            if alert.scope is not Scope.OPERATOR:
                check(prom, f"alert {alert.name}", alert.signal, alert.scope, counts)
        # Scrapes during checkpoints never failed: every sample of `up` since the start is 1.
        assert prom.query('min_over_time(up{job="zerotrain"}[5m]) == 0') == []
        report(counts)
        # `zerotrain top --prometheus` reads the same series: a local run's have no namespace, hence "".
        view = top_view.build(JOB, "test", top_sources.query_prometheus(prom.url, "", JOB))
        assert [r.rank for r in view.ranks] == [0, 1], view
        assert all(r.memory and r.plan and r.split and r.tokens_per_s for r in view.ranks), view
        assert view.step and view.steps == 100000 and view.goodput and view.goodput.training > 0, view


@pytest.mark.slow
async def test_operator_panels_answer_for_the_job_and_forget_it_when_deleted(
    cluster: Cluster, operator: Operator, kube: Kube, tmp_path: Path
) -> None:
    ns, name, port = cluster.namespace, "watched", free_port()
    operator.metrics.serve(port, "127.0.0.1")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "zerotrain-operator",
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            }
        ],
    }
    try:
        await start_job(kube, ns, name)
        await call(set_pod_phase, kube, ns, f"{name}-worker-1", "Failed", 1)
        await wait_status(kube, ns, name, lambda st: st.get("restarts", {}).get("total") == 1)
        with running_prometheus(config, tmp_path / "prometheus") as prom:
            job = f'zerotrain_job="{name}", namespace="{ns}"'
            # Two samples at least, for increase() in the restart alert.
            series = f"count_over_time(zerotrain_operator_job_restarts_total{{{job}}}[1h]) >= 2"
            await call(prom.wait_for, series, bool, 30)
            counts: dict[str, str] = {}
            for title, query in dashboard_queries():
                if query.scope is Scope.OPERATOR:
                    check(prom, f"panel {title!r} {query.legend!r}", query.expr, query.scope, counts, job=name)
            for alert in ALERTS:
                if alert.scope is Scope.OPERATOR:
                    check(prom, f"alert {alert.name}", alert.signal, alert.scope, counts, job=name)
            # An annotation answers only where its value changed (none did here): its series must be the job's.
            marks = annotation_queries(json.loads(DASHBOARD.read_text()))
            assert {n for n, _ in marks} == {"Resizes (operator)", "Re-plans (operator)"}, marks
            for mark, expr in marks:
                assert expr.endswith(MARK_ABOVE), expr
                check(prom, f"annotation {mark!r}", expr.removesuffix(MARK_ABOVE), Scope.OPERATOR, counts, job=name)
            restarts = prom.query(f"zerotrain_operator_job_restarts_total{{{job}}}")
            assert [(r["metric"]["cause"], r["value"][1]) for r in restarts] == [("Failed", "1")]
            report(counts)
            # `zerotrain top --prometheus` shows the operator's ledger of the job (no rank reported here: no
            # process ran its pods, so every second went to pending, and then to restarting).
            ledger = top_view.build(name, "test", top_sources.query_prometheus(prom.url, ns, name)).goodput
            assert ledger is not None and ledger.total() > 0 and ledger.training == 0, ledger
            # Bounded cardinality: a deleted job's series go with it.
            await call(kube.delete_job, ns, name)
            await until_async(lambda: not prom.query(f"zerotrain_operator_job_phase{{{job}}}"), timeout=30)
    finally:
        operator.metrics.stop()
