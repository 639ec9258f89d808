"""Start (and stop) a real Kueue beside a real kube-apiserver, for tests/e2e/test_kueue_e2e.py.

    python tests/e2e/kueue_env.py up --kubeconfig ~/.cache/zt-k8s/admin.kubeconfig \\
        --kueue-bin ~/.cache/zt-kueue/bin/kueue --kueue-src ~/.cache/zt-kueue-src
    export ZEROTRAIN_E2E_KUEUE=http://127.0.0.1:PORT      # what `up` prints last
    python tests/e2e/kueue_env.py down --kubeconfig ~/.cache/zt-k8s/admin.kubeconfig

`up` takes Kueue's manager as a binary built from Kueue's own source at the pinned release (RELEASE; this project
keeps no recipe that builds it: docs/operator.md says how) and that source tree, for its CRDs and webhook
manifests. It installs the CRDs, serves the webhooks of pods and of Kueue's own kinds from the manager on
127.0.0.1 with a CA made here (the webhook configurations point at `https://127.0.0.1:PORT/...`), runs the manager
with only its pod integration on, no leader election and no visibility server, and waits until it is ready. `down`
stops exactly that process (by the PID and start time `up` recorded), deletes the webhook configurations (an API
server would otherwise refuse every pod while no webhook answers) and the CRDs, and removes the state directory.
A step that fails says which, in one line, with where its log is.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

RELEASE = "v0.19.2"
HEALTH_ENV = "ZEROTRAIN_E2E_KUEUE"
WEBHOOKS = ("zerotrain-e2e-kueue-mutating", "zerotrain-e2e-kueue-validating")
STATE = Path.home() / ".cache" / "zt-kueue" / "state"
# Without its internal certificate management the manager reads its metrics server's certificate from here, a path
# it does not let one configure (cmd/kueue/main.go): `up` puts the serving certificate there when nothing is, and
# `down` removes what `up` put.
METRICS_CERTS = Path("/etc/kueue/metrics/certs")


class StepFailed(Exception):
    """One step of `up` or `down` failed: the message says which, and where its log is."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(step: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> str:
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        out.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise StepFailed(f"kueue: step {step} failed (exit {done.returncode}); log: {log}")
    return done.stdout


def _kubectl(kubeconfig: str) -> list[str]:
    found = os.environ.get("ZT_KUBECTL") or shutil.which("kubectl")
    local = Path.home() / ".cache" / "zt-k8s" / "bin" / "kubectl"
    binary = str(local) if local.exists() else found
    if not binary:
        raise StepFailed("kueue: step find-kubectl failed: no kubectl (set ZT_KUBECTL, or put one on PATH)")
    return [binary, "--kubeconfig", kubeconfig]


def _certs(state: Path, log: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 (the webhook configurations trust the CA)."""
    certs = state / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    ca, ca_key, key, csr, crt = (certs / n for n in ("ca.crt", "ca.key", "tls.key", "tls.csr", "tls.crt"))
    ext = certs / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    new_key = ["-newkey", "rsa:2048", "-nodes"]
    steps = {
        "make-ca": ["req", "-x509", *new_key, "-days", "2", "-subj", "/CN=zt-kueue-ca", "-keyout", str(ca_key)],
        "make-serving-key": ["req", *new_key, "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr)],
        "sign-serving-cert": ["x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-days", "2"],
    }
    steps["make-ca"] += ["-out", str(ca)]
    steps["sign-serving-cert"] += ["-CAcreateserial", "-extfile", str(ext), "-out", str(crt)]
    for step, argv in steps.items():
        _run(step, ["openssl", *argv], log)
    return ca.read_bytes()


def _webhooks(src: Path, port: int, ca: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations for pods and its own kinds, pointed at the manager on 127.0.0.1:`port`."""
    docs = list(yaml.safe_load_all((src / "config/components/webhook/manifests.yaml").read_text()))
    bundle = base64.b64encode(ca).decode()
    out = []
    for doc, name in zip(sorted(docs, key=lambda d: d["kind"]), WEBHOOKS, strict=True):  # Mutating, Validating
        kept = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            if "-v1-pod" in path or "kueue-x-k8s-io" in path:
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
                if "-v1-pod" in path:  # as Kueue's kustomization patches it
                    exclude = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
                    hook["namespaceSelector"] = {"matchExpressions": [exclude]}
                kept.append(hook)
        doc["metadata"] = {"name": name}
        doc["webhooks"] = kept
        out.append(doc)
    return out


def _config(state: Path, webhook: int, health: int) -> Path:
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(state / "certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["pod"]},
    }
    path = state / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def up(kubeconfig: str, binary: Path, src: Path, state: Path) -> str:
    if (state / "manager.json").exists():
        raise StepFailed(f"kueue: step check-state failed: {state} holds a running Kueue; run `down` first")
    state.mkdir(parents=True, exist_ok=True)
    log = state / "setup.log"
    chart = src / "charts/kueue/Chart.yaml"
    got = yaml.safe_load(chart.read_text()).get("appVersion") if chart.exists() else None
    if got != RELEASE:
        raise StepFailed(f"kueue: step check-source failed: {src} is Kueue {got}, not {RELEASE}; log: none")
    if not os.access(binary, os.X_OK):
        raise StepFailed(f"kueue: step check-binary failed: {binary} is not an executable Kueue manager")
    kubectl = _kubectl(kubeconfig)
    ca = _certs(state, log)
    crds = src / "config/components/crd/bases"
    _run("install-crds", [*kubectl, "apply", "--server-side", "-f", str(crds)], log)
    _run("wait-crds", [*kubectl, "wait", "--for=condition=established", "--timeout=60s", "-f", str(crds)], log)
    webhook, health = _free_port(), _free_port()
    hooks = state / "webhooks.yaml"
    hooks.write_text(yaml.safe_dump_all(_webhooks(src, webhook, ca)))
    _metrics_certs(state)
    manager_log = state / "kueue.log"
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    argv = [str(binary), f"--config={_config(state, webhook, health)}", "--feature-gates=VisibilityOnDemand=false"]
    with manager_log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    record = {"pid": proc.pid, "start": _start_time(proc.pid), "health": f"http://127.0.0.1:{health}"}
    (state / "manager.json").write_text(json.dumps(record))
    deadline = time.monotonic() + 90
    while not _ready(record["health"]):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise StepFailed(f"kueue: step start-manager failed (exit {proc.poll()}); log: {manager_log}")
        time.sleep(0.5)
    _run("install-webhooks", [*kubectl, "apply", "-f", str(hooks)], log)
    return str(record["health"])


def _metrics_certs(state: Path) -> None:
    if METRICS_CERTS.exists():
        return
    made = METRICS_CERTS
    while not made.parent.exists():  # the outermost directory made here is what `down` removes
        made = made.parent
    try:
        METRICS_CERTS.mkdir(parents=True)
    except OSError as e:
        raise StepFailed(f"kueue: step metrics-certs failed: cannot make {METRICS_CERTS} ({e}); log: none") from None
    for name in ("tls.crt", "tls.key"):
        shutil.copy(state / "certs" / name, METRICS_CERTS / name)
    (state / "metrics-certs-made").write_text(str(made))


def _ready(health: str) -> bool:
    try:
        with urllib.request.urlopen(f"{health}/readyz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def down(kubeconfig: str, src: Path | None, state: Path) -> None:
    log = state / "teardown.log"
    state.mkdir(parents=True, exist_ok=True)
    kubectl = _kubectl(kubeconfig)
    _run("delete-webhooks", [*kubectl, "delete", "--ignore-not-found", *_webhook_kinds()], log)
    record = state / "manager.json"
    if record.exists():
        got = json.loads(record.read_text())
        pid = int(got["pid"])
        if got.get("start") and _start_time(pid) == got["start"]:  # the process `up` started, and no other
            os.killpg(pid, signal.SIGTERM)
            for _ in range(100):
                if _start_time(pid) is None:
                    break
                time.sleep(0.1)
            else:
                os.killpg(pid, signal.SIGKILL)
    if (made := state / "metrics-certs-made").exists():
        shutil.rmtree(made.read_text().strip(), ignore_errors=True)
    if src is not None:
        crds = src / "config/components/crd/bases"
        _run("delete-crds", [*kubectl, "delete", "--ignore-not-found", "--wait=false", "-f", str(crds)], log)
    shutil.rmtree(state, ignore_errors=True)


def _webhook_kinds() -> list[str]:
    mutating, validating = WEBHOOKS
    return [f"mutatingwebhookconfiguration/{mutating}", f"validatingwebhookconfiguration/{validating}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--kubeconfig", required=True, help="the API server's admin kubeconfig")
    parser.add_argument("--kueue-bin", type=Path, help="Kueue's manager, built from RELEASE (up)")
    parser.add_argument("--kueue-src", type=Path, help="Kueue's source tree at RELEASE: its CRDs and webhooks")
    parser.add_argument("--state", type=Path, default=STATE, help="where the certificates, config and logs go")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            if args.kueue_bin is None or args.kueue_src is None:
                parser.error("up needs --kueue-bin and --kueue-src")
            health = up(args.kubeconfig, args.kueue_bin, args.kueue_src, args.state)
            print(f"export {HEALTH_ENV}={health}")
        else:
            down(args.kubeconfig, args.kueue_src, args.state)
    except StepFailed as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
