"""Each rank's /metrics: what it serves equals the engine's own reports at the same step, on 2 real gloo ranks;
a taken port and disabled metrics behave as documented."""

from __future__ import annotations

import os
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import run_ranks
from prometheus_client.parser import text_string_to_metric_families

from zerotrain.pod_contract import PROGRESS_ENV, SUMMARY_ENV
from zerotrain.runtime.job.metrics_endpoint import Endpoint, Served, metrics_endpoint, read_ports
from zerotrain.runtime.job.rank import start_metrics
from zerotrain.runtime.job.rank_metrics import RankMetrics
from zerotrain.runtime.job.task import ConfigError
from zerotrain.runtime.job.train import RankContext, train
from zerotrain.runtime.rank_phase import RankPhase
from zerotrain.spec import ZeroTrainingJobSpec

GPT = {"seq_len": 16, "batch_size": 4, "d_model": 16, "n_layers": 2, "n_heads": 2, "max_bytes": 50_000}
STEPS = 6


# The exported category of each MemoryReport field, written out here rather than read from the exporter's table.
MEASURED = {
    "parameters": "parameter_bytes",
    "gradients": "gradient_bytes",
    "optimizer_states": "optimizer_bytes",
    "gathered_parameters": "gathered_bytes",
    "communication_buffers": "comm_buffer_bytes",
    "activations": "activation_bytes",
    "gradient_arenas": "gradient_arena_bytes",
}
PEAKS = {
    "gathered_parameters": "gathered_peak_bytes",
    "communication_buffers": "comm_buffer_peak_bytes",
    "activations": "activation_peak_bytes",
}


def spec(**extra: Any) -> ZeroTrainingJobSpec:
    return ZeroTrainingJobSpec.model_validate(
        {
            "image": "runtime:0.1.0",
            "entrypoint": "zerotrain.runtime.examples.gpt:build",
            "entrypointArgs": GPT,
            # bf16 compute: parameter bytes (bf16 shard) differ from gradient bytes (fp32 shard), so a swapped
            # category cannot pass.
            "zero": {"stage": 3, "gradientAccumulationSteps": 2, "precision": "bf16"},
            "training": {"steps": STEPS, "optimizer": {"lr": 0.003}},
            "checkpoint": {"intervalSteps": 4},
            **extra,
        }
    )


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample served on 127.0.0.1:port, by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def train_and_scrape(rank: int, world: int, root: str) -> dict[str, Any]:
    from zerotrain.runtime import ZeroEngine

    os.environ[PROGRESS_ENV] = f"{root}/progress-{rank}.jsonl"
    os.environ[SUMMARY_ENV] = f"{root}/summary.json"
    engines: list[Any] = []

    def factory(*args: Any, **kwargs: Any) -> ZeroEngine:
        engines.append(ZeroEngine(*args, **kwargs))
        return engines[-1]

    ctx = RankContext(rank, world, rank)
    metrics = RankMetrics("unit", rank, rank, world, 3, STEPS)
    port = metrics.serve(Endpoint("127.0.0.1", 0, 0, "test"))
    try:
        before = scrape(port)  # served before the first step
        job = spec(checkpoint={"intervalSteps": 4, "path": f"{root}/ckpt"})
        train(job, ctx, engine_factory=factory, metrics=metrics)
        samples = scrape(port)
        engine = engines[0]
        return {
            "before": before,
            "samples": samples,
            "memory": engine.accounting().memory_report().model_dump(),
            "comm": engine.accounting().comm_report(),
            "ckpt_bytes": sum(f.stat().st_size for f in Path(root, "ckpt").glob(f"step-*/rank-{rank:05d}.safetensors")),
        }
    finally:
        metrics.stop()


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    matches = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(matches) == 1, f"{name}{labels}: {len(matches)} samples"
    return matches[0]


@pytest.mark.slow
def test_served_metrics_equal_the_engines_reports_at_the_same_step(tmp_path: Path) -> None:
    results = run_ranks(train_and_scrape, 2, str(tmp_path))
    for rank, res in enumerate(results):
        s, mem = res["samples"], res["memory"]
        ident = {"zerotrain_job": "unit", "rank": str(rank), "local_rank": str(rank), "stage": "3"}
        assert all(set(ident.items()) <= labels for _, labels in s), "every series carries the rank's labels"
        assert value(res["before"], "zerotrain_phase", phase="starting") == 1.0
        assert value(s, "zerotrain_phase", phase=RankPhase.FINISHED.value) == 1.0
        for category, field in MEASURED.items():
            assert value(s, "zerotrain_memory_bytes", category=category) == mem[field], category
        for category, field in PEAKS.items():
            assert value(s, "zerotrain_memory_peak_bytes", category=category) == mem[field], category
        for category in ("parameters", "gradients", "optimizer_states"):
            assert (
                value(s, "zerotrain_memory_predicted_bytes", category=category)
                == mem[f"predicted_{MEASURED[category]}"]
            )
        assert len({mem["parameter_bytes"], mem["gradient_bytes"], mem["optimizer_bytes"]}) == 3
        assert mem["activation_peak_bytes"] > 0 and mem["gathered_peak_bytes"] > 0
        for op, stats in res["comm"].items():
            assert value(s, "zerotrain_comm_calls_total", op=op) == stats["calls"], op
            assert value(s, "zerotrain_comm_bytes_total", op=op) == stats["bytes"], op
            assert value(s, "zerotrain_comm_seconds_total", op=op) == pytest.approx(stats["seconds"]), op
        assert value(s, "zerotrain_optimizer_steps_total") == STEPS
        assert value(s, "zerotrain_step_duration_seconds_count") == STEPS
        assert value(s, "zerotrain_tokens_total") == STEPS * 2 * (GPT["batch_size"] // 2) * GPT["seq_len"]
        assert value(s, "zerotrain_learning_rate") == 0.003 and value(s, "zerotrain_loss") > 0
        # Saved at step 4 and at the end (6): two commits, this rank's two files.
        assert value(s, "zerotrain_checkpoint_saves_total") == 2
        assert value(s, "zerotrain_checkpoint_last_committed_step") == STEPS
        assert value(s, "zerotrain_checkpoint_save_bytes_total") == res["ckpt_bytes"] > 0
        assert value(s, "zerotrain_device_memory_used_bytes", device="cpu") > 0
    # Both ranks report the same global loss (a mean over ranks, not each rank's own).
    assert value(results[0]["samples"], "zerotrain_loss") == value(results[1]["samples"], "zerotrain_loss")


def test_a_taken_port_is_a_configuration_error_naming_port_and_field() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        metrics = RankMetrics("j", 1, 1, 2, 3, 10)
        with pytest.raises(ConfigError) as err:
            metrics.serve(metrics_endpoint(port - 1, 1, 2, {"ZEROTRAIN_METRICS_ADDR": "127.0.0.1"}))
    message = str(err.value)
    assert f"spec.metrics.port: port {port} (local rank 1)" in message and "spec.metrics.enabled: false" in message


def test_ports_follow_the_spec_in_a_pod_and_the_launcher_locally() -> None:
    pod = metrics_endpoint(9400, 3, 4, {})
    assert (pod.addr, list(pod.candidates()), pod.setting) == ("0.0.0.0", [9403], "spec.metrics.port")
    local = metrics_endpoint(9400, 1, 2, {"ZEROTRAIN_METRICS_SEARCH": "9500"})
    assert (local.addr, local.setting) == ("127.0.0.1", "--metrics-port")
    assert list(local.candidates())[:3] == [9501, 9503, 9505]  # rank 0 has the even ones: never the same port
    assert list(metrics_endpoint(9400, 1, 2, {"ZEROTRAIN_METRICS_SEARCH": "0"}).candidates()) == [0]


def test_a_local_rank_skips_a_taken_port_and_reports_the_one_it_holds(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"ZEROTRAIN_METRICS_SEARCH": str(port), "ZEROTRAIN_METRICS_REPORT_DIR": str(tmp_path)}
        metrics = RankMetrics("j", 0, 0, 1, 3, 10)
        try:
            got = metrics.serve(metrics_endpoint(9400, 0, 1, env))
            assert got > port
            assert read_ports(tmp_path) == [Served(0, "127.0.0.1", got, port)]
            assert scrape(got)  # it serves there
        finally:
            metrics.stop()


def test_a_port_a_scrape_left_in_time_wait_is_served_again() -> None:
    metrics = RankMetrics("j", 0, 0, 1, 3, 10)
    port = metrics.serve(Endpoint("127.0.0.1", 0, 0, "test"))
    scrape(port)  # the server closes first: its side of the connection sits in TIME_WAIT
    metrics.stop()
    again = RankMetrics("j", 0, 0, 1, 3, 10)
    try:
        assert again.serve(Endpoint("127.0.0.1", port, 0, "test")) == port
    finally:
        again.stop()


def test_disabled_metrics_serve_nothing_and_record_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROTRAIN_METRICS_ADDR", "127.0.0.1")
    metrics = start_metrics("j", spec(metrics={"enabled": False}), RankContext(0, 1, 0))
    assert metrics.address is None and not metrics.enabled
    metrics.observe_step(object(), None)  # type: ignore[arg-type]  # returns before touching either
    assert metrics.snapshot.step is None
