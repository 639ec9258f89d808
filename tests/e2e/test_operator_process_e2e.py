"""`python -m zerotrain.operator` as its own process: settings from env, /healthz, /metrics, reconciling."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from zerotrain.operator.client.kube import Kube, path_of
from zerotrain.runtime.job.launch import free_port

from .cluster import Cluster, until, until_async
from .test_operator_e2e import JOBS, PLURAL, job_manifest, pods


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except OSError:
        return 0, ""


async def test_operator_process_serves_health_metrics_and_reconciles(
    cluster: Cluster, kube: Kube, tmp_path: Path
) -> None:
    if cluster.emulator is None:
        pytest.skip("runs its own operator process; against a real cluster the in-thread operator tests cover this")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": cluster.configuration.host}}],
                "users": [{"name": "u", "user": {"token": "dummy"}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "u"}}],
                "current-context": "emu",
            }
        )
    )
    health, metrics = free_port(), free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ZEROTRAIN_", "KUBERNETES_"))},
        "ZEROTRAIN_NAMESPACES": cluster.namespace,
        "ZEROTRAIN_BIND_ADDRESS": "127.0.0.1",
        "ZEROTRAIN_HEALTH_PORT": str(health),
        "ZEROTRAIN_METRICS_PORT": str(metrics),
        "ZEROTRAIN_RESYNC_SECONDS": "0.5",
    }
    cmd = [sys.executable, "-m", "zerotrain.operator", "--kubeconfig", str(kubeconfig)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        emu = cluster.emulator
        await until(lambda: emu.watchers("zerotrain.dev", "v1alpha1", PLURAL) and emu.watchers("", "v1", "pods"), 30)
        await until_async(lambda: fetch(f"http://127.0.0.1:{health}/healthz")[0] == 200, timeout=10)
        await asyncio.to_thread(
            kube.request, "POST", path_of(JOBS, PLURAL, cluster.namespace), job_manifest("mu", cluster.namespace)
        )
        await until_async(lambda: len(pods(kube, cluster.namespace, "mu")) == 2)
        _, text = await until_async(
            lambda: (
                (r := fetch(f"http://127.0.0.1:{metrics}/metrics"))
                and 'zerotrain_operator_jobs{phase="Pending"} 1.0' in r[1]
                and 'zerotrain_operator_reconcile_total{result="ok"}' in r[1]
                and r
            )
        )
        assert "zerotrain_operator_reconcile_duration_seconds_bucket" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = await asyncio.to_thread(proc.communicate, None, 15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, err.decode()[-2000:]
