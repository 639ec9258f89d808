"""The operator process started the way the chart's Deployment starts it (command and env from the rendered
manifest) answers the liveness/readiness probes and serves /metrics where the Service points, and stops cleanly on
SIGTERM (what a Recreate rollout sends). The API server is the KMock emulator."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import kmock
import pytest
from chart_util import Obj, one, render
from e2e.emulator import ZeroEmulator

from zerotrain.runtime.launch import free_port

pytestmark = pytest.mark.slow


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def _container(health_port: int, metrics_port: int) -> tuple[Obj, Obj]:
    values = {
        "healthPort": health_port,
        "metrics": {"port": metrics_port},
        # Test servers bind loopback only; the chart's default (all interfaces) is what a pod needs.
        "operator": {"extraEnv": [{"name": "ZEROTRAIN_BIND_ADDRESS", "value": "127.0.0.1"}]},
    }
    objects = render(values)
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0], one(objects, "Service")


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: emu, cluster: {{server: "{server}"}}}}]\n'
        "users: [{name: emu, user: {token: unused}}]\n"
        "contexts: [{name: emu, context: {cluster: emu, user: emu}}]\n"
        "current-context: emu\n"
    )
    return path


async def test_operator_started_as_the_chart_starts_it(tmp_path: Path) -> None:
    container, service = _container(free_port(), free_port())
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    command = list(container["command"])
    command[0] = shutil.which(command[0], path=str(Path(sys.executable).parent)) or command[0]
    # The e2e tests' emulator: it keeps resourceVersions, which the Lease's writes are guarded by.
    async with ZeroEmulator() as emulator, kmock.Server(emulator):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEROTRAIN_", "KUBERNETES_"))}
        # The downward API, as the kubelet fills it in for pod zt-op-0 in namespace default.
        fields = {"metadata.name": "zt-op-0", "metadata.namespace": "default"}
        env |= {
            e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
            for e in container["env"]
        }
        env["KUBECONFIG"] = str(_kubeconfig(tmp_path / "kubeconfig", str(emulator.url).rstrip("/")))
        proc = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        probes = [container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]]
        urls = [f"http://127.0.0.1:{ports[p['port']]}{p['path']}" for p in probes]
        urls.append(f"http://127.0.0.1:{ports[service['spec']['ports'][0]['targetPort']]}/metrics")
        answers: dict[str, tuple[int, str]] = {}
        running = False
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                answers = {url: await asyncio.to_thread(_get, url) for url in urls}
                if all(status == 200 for status, _ in answers.values()):
                    break
                await asyncio.sleep(0.3)
            running = proc.poll() is None
        finally:
            proc.send_signal(signal.SIGTERM)
            out = (await asyncio.to_thread(proc.communicate, None, 30))[0].decode(errors="replace")[-3000:]
    assert running, f"the operator exited with {proc.returncode}:\n{out}"
    assert all(status == 200 for status, _ in answers.values()), f"{answers}\n{out}"
    assert "zerotrain_operator_reconcile" in answers[urls[-1]][1]
    assert proc.returncode == 0, f"no clean stop on SIGTERM (exit {proc.returncode}):\n{out}"
