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
from datetime import datetime, timezone
from pathlib import Path

import kmock
import pytest
from budget import budget
from chart_util import Obj, one, render
from e2e.emulator import ZeroEmulator

from zerotrain.operator.client.kube import Kube, KubeError, path_of
from zerotrain.operator.client.leader import LEASE_API
from zerotrain.runtime.job.launch import free_port

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


def _env(container: Obj, tmp_path: Path, server: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEROTRAIN_", "KUBERNETES_"))}
    # The downward API, as the kubelet fills it in for pod zt-op-0 in namespace default.
    fields = {"metadata.name": "zt-op-0", "metadata.namespace": "default"}
    env |= {
        e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        for e in container["env"]
    }
    env["KUBECONFIG"] = str(_kubeconfig(tmp_path / "kubeconfig", server))
    return env


def _start(container: Obj, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    command = list(container["command"])
    command[0] = shutil.which(command[0], path=str(Path(sys.executable).parent)) or command[0]
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


async def _until_served(proc: subprocess.Popen[bytes], urls: list[str]) -> dict[str, tuple[int, str]]:
    answers: dict[str, tuple[int, str]] = {}
    deadline = time.monotonic() + budget(60)
    while time.monotonic() < deadline and proc.poll() is None:
        answers = {url: await asyncio.to_thread(_get, url) for url in urls}
        if all(status == 200 for status, _ in answers.values()):
            break
        await asyncio.sleep(0.3)
    return answers


async def _terminate(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    return str((await asyncio.to_thread(proc.communicate, None, 30))[0].decode(errors="replace")[-3000:])


async def _until_holder(kube: Kube, env: dict[str, str], identity: str, proc: subprocess.Popen[bytes]) -> bool:
    path = path_of(LEASE_API, "leases", env["ZEROTRAIN_LEASE_NAMESPACE"], env["ZEROTRAIN_LEASE_NAME"])
    deadline = time.monotonic() + budget(60)
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            lease = await asyncio.to_thread(kube.request, "GET", path, retry=False)
            if lease["spec"].get("holderIdentity") == identity:
                return True
        except KubeError:
            pass  # not created yet
        await asyncio.sleep(0.2)
    return False


async def test_operator_started_as_the_chart_starts_it(tmp_path: Path) -> None:
    container, service = _container(free_port(), free_port())
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # The e2e tests' emulator: it keeps resourceVersions, which the Lease's writes are guarded by.
    async with ZeroEmulator() as emulator, kmock.Server(emulator):
        env = _env(container, tmp_path, str(emulator.url).rstrip("/"))
        proc = _start(container, env, tmp_path)
        probes = [container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]]
        urls = [f"http://127.0.0.1:{ports[p['port']]}{p['path']}" for p in probes]
        urls.append(f"http://127.0.0.1:{ports[service['spec']['ports'][0]['targetPort']]}/metrics")
        kube = Kube.connect(env["KUBECONFIG"])
        try:
            # A standby serves /healthz too: the probes are kopf's only once this replica leads.
            leads = await _until_holder(kube, env, "zt-op-0", proc)
            answers = await _until_served(proc, urls)
            running = proc.poll() is None
        finally:
            kube.close()
            out = await _terminate(proc)
    assert running and leads, f"the operator exited with {proc.returncode} or never led:\n{out}"
    assert all(status == 200 for status, _ in answers.values()), f"{answers}\n{out}"
    assert "zerotrain_operator_reconcile" in answers[urls[-1]][1]
    assert proc.returncode == 0, f"no clean stop on SIGTERM (exit {proc.returncode}):\n{out}"


async def test_a_standby_waiting_for_the_lease_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """A rollout or drain terminates standbys too; before kopf runs, nothing else handles SIGTERM."""
    container, _ = _container(free_port(), free_port())
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe = container["livenessProbe"]["httpGet"]
    health = f"http://127.0.0.1:{ports[probe['port']]}{probe['path']}"
    async with ZeroEmulator() as emulator, kmock.Server(emulator):
        server = str(emulator.url).rstrip("/")
        env = _env(container, tmp_path, server)
        kube = Kube.connect(env["KUBECONFIG"])
        try:
            ns, name = env["ZEROTRAIN_LEASE_NAMESPACE"], env["ZEROTRAIN_LEASE_NAME"]
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            lease = {
                "apiVersion": LEASE_API,
                "kind": "Lease",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"holderIdentity": "zt-op-other", "renewTime": now, "leaseDurationSeconds": 3600},
            }
            await asyncio.to_thread(kube.request, "POST", path_of(LEASE_API, "leases", ns), lease)
            proc = _start(container, env, tmp_path)
            try:
                answers = await _until_served(proc, [health])
                waiting = proc.poll() is None
            finally:
                out = await _terminate(proc)
            held = await asyncio.to_thread(kube.request, "GET", path_of(LEASE_API, "leases", ns, name))
        finally:
            kube.close()
    assert waiting and answers[health][0] == 200, f"the standby did not serve /healthz: {answers}\n{out}"
    assert "waits for lease" in out and "now holds" not in out, out
    assert proc.returncode == 0, f"the standby did not stop cleanly on SIGTERM (exit {proc.returncode}):\n{out}"
    assert held["spec"]["holderIdentity"] == "zt-op-other", "a standby must not touch the leader's lease"
