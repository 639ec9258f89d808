"""A kubelet made of local processes: it runs each of a job's Pods as `sys.executable` with the pod's env.

It polls the job's Pods through the test's Kube client, starts a process for every new pod (the container's
command, `python` replaced by this interpreter, ConfigMap mounts written to files, PVC mounts mapped to one
shared directory per claim), and writes the pod's status through the status subresource with `kubelet.py`'s
writer: Running when started, Succeeded or Failed with the exit code when the process ends. A deleted pod's
processes are killed (the whole tree: torch's launcher starts its ranks in sessions of their own, and a real
kubelet kills the container's cgroup). Only processes it started are ever signalled, by PID.

What a cluster's network would do, done by hand: MASTER_ADDR (rank 0's DNS name through the job's headless
Service) becomes 127.0.0.1, and every gang (label `zerotrain.dev/gang`) gets its own free MASTER_PORT so an old
gang's rendezvous store can never be joined by a new one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerotrain.operator import naming
from zerotrain.operator.kube import Kube, path_of

from .cluster import Cluster
from .kubelet import set_pod_phase

BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")  # what an image would provide; nothing of the test's own


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a live process, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[19])


def process_tree(root: int) -> set[tuple[int, int]]:
    """(pid, start time) of `root` and all its descendants; the start time guards against PID reuse."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _proc_stat(int(entry.name))) is not None:
            parents.setdefault(st[1], []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if (st := _proc_stat(pid)) is not None and st[0] != "Z":
            found.add((pid, st[2]))
            todo += parents.get(pid, [])
    return found


def is_alive(pid: int, start: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[2] == start and st[0] != "Z"


@dataclass
class PodProcess:
    """One pod's container, run locally."""

    name: str
    uid: str
    gang: str
    popen: subprocess.Popen[bytes]
    log: Path
    tree: set[tuple[int, int]] = field(default_factory=set)
    """Every (pid, start time) seen in its process tree, kept after the process ends."""
    exit_code: int | None = None
    """The container's exit code (128 + signal when killed by one), once it ended."""
    deleted: bool = False
    """Its pod was deleted while it ran (so it was killed and no status was written)."""

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class ProcessKubelet:
    """Plays the kubelet for job `job` in the cluster's namespace; use as `async with` in a test."""

    def __init__(self, cluster: Cluster, job: str, workdir: Path, poll_s: float = 0.2) -> None:
        self.namespace, self.job, self.workdir, self.poll_s = cluster.namespace, job, workdir, poll_s
        self.api_url = str(cluster.configuration.host)
        self.kube: Kube = cluster.client("zerotrain-e2e-kubelet")
        self.pods: list[PodProcess] = []
        self.errors: list[BaseException] = []
        self._ports: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="process-kubelet", daemon=True)

    async def __aenter__(self) -> ProcessKubelet:
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)  # the emulator serves API calls on this loop: never block it

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        with self._lock:
            for p in self.pods:
                self._kill(p)
        self.kube.close()

    def kill(self, pod: str, sig: signal.Signals = signal.SIGKILL) -> PodProcess:
        """The fault: kill the running process of `pod`; its status becomes Failed (128 + sig) on the next poll."""
        with self._lock:
            running = [p for p in self.pods if p.name == pod and p.exit_code is None and p.popen.poll() is None]
            assert running, f"pod {pod} has no running process to kill (it may have finished already)"
            self._kill(running[0], sig)
            return running[0]

    def gang(self, gang: int) -> list[PodProcess]:
        return [p for p in self.pods if p.gang == str(gang)]

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                with self._lock:
                    self._sync()
            except Exception as e:  # the test checks `errors`; a dead harness would only show up as a timeout
                self.errors.append(e)

    def _sync(self) -> None:
        pods = {p["metadata"]["uid"]: p for p in self.kube.list_pods(self.namespace, self.job)}
        live = {uid: p for uid, p in pods.items() if not p["metadata"].get("deletionTimestamp")}
        for proc in self.pods:
            if proc.exit_code is None and proc.uid not in live:
                self._kill(proc)  # no status to write: the pod object is gone
                proc.deleted, proc.exit_code = True, _exit_code(proc.popen.wait())
        for proc in self.pods:
            if proc.exit_code is None:
                proc.tree |= process_tree(proc.popen.pid)
                if (rc := proc.popen.poll()) is not None:
                    proc.exit_code = _exit_code(rc)
                    self._report_exit(proc, live[proc.uid])
        started = {p.uid for p in self.pods}
        for uid, pod in live.items():
            if uid not in started and pod.get("status", {}).get("phase", "Pending") == "Pending":
                self.pods.append(self._start(pod))
                set_pod_phase(self.kube, self.namespace, pod["metadata"]["name"], "Running")

    def _report_exit(self, proc: PodProcess, pod: dict[str, Any]) -> None:
        code = proc.exit_code or 0
        log_file = self.workdir / f"{proc.name}-{proc.uid[:8]}" / "termination-log"
        message = log_file.read_text().strip() if log_file.is_file() else ""
        phase = "Succeeded" if code == 0 else "Failed"
        set_pod_phase(self.kube, self.namespace, pod["metadata"]["name"], phase, code, message=message)

    def _kill(self, proc: PodProcess, sig: signal.Signals = signal.SIGKILL) -> None:
        if proc.popen.poll() is None:
            proc.tree |= process_tree(proc.popen.pid)
        for pid, start in proc.tree:
            if is_alive(pid, start):
                os.kill(pid, sig)
        proc.popen.wait(30)

    def _start(self, pod: dict[str, Any]) -> PodProcess:
        md, spec = pod["metadata"], pod["spec"]
        container = spec["containers"][0]
        root = self.workdir / f"{md['name']}-{md['uid'][:8]}"
        root.mkdir(parents=True)
        mounts = self._mounts(spec, container, root)
        env = {k: os.environ[k] for k in BASE_ENV if k in os.environ}
        for var in container.get("env", []):
            env[var["name"]] = _remap(mounts, var["value"]) if "value" in var else _field(pod, var["valueFrom"])
        master = naming.master_addr(self.job, self.namespace)
        assert env.get("MASTER_ADDR") == master, f"pod env MASTER_ADDR={env.get('MASTER_ADDR')!r}, expected {master!r}"
        gang = md["labels"][naming.LABEL_GANG]
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(self._ports.setdefault(gang, free_port())),
            ZEROTRAIN_STATUS_API=self.api_url,
            ZEROTRAIN_TERMINATION_LOG=str(root / "termination-log"),
            PYTHONSAFEPATH="1",
            OMP_NUM_THREADS="1",
        )
        argv = [_remap(mounts, a) for a in container["command"] + container.get("args", [])]
        argv[0] = sys.executable if argv[0] in ("python", "python3") else argv[0]
        log = root / "output.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                argv, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return PodProcess(md["name"], md["uid"], gang, popen, log)

    def _mounts(self, spec: dict[str, Any], container: dict[str, Any], root: Path) -> dict[str, Path]:
        """mountPath -> local directory, for ConfigMap (files written now) and PVC (shared per claim) volumes."""
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts: dict[str, Path] = {}
        for m in container.get("volumeMounts", []):
            vol = volumes[m["name"]]
            if "configMap" in vol:
                cm = self.kube.request("GET", path_of("v1", "configmaps", self.namespace, vol["configMap"]["name"]))
                local = root / vol["name"]
                local.mkdir()
                for key, text in cm.get("data", {}).items():
                    (local / key).write_text(text)
                mounts[m["mountPath"]] = local
            elif "persistentVolumeClaim" in vol:
                local = self.workdir / "pvc" / vol["persistentVolumeClaim"]["claimName"]
                local.mkdir(parents=True, exist_ok=True)
                mounts[m["mountPath"]] = local
        return mounts


def _exit_code(returncode: int) -> int:
    """What a container runtime reports: 128 + signal for a process killed by one."""
    return 128 - returncode if returncode < 0 else returncode


def _remap(mounts: dict[str, Path], value: str) -> str:
    """A path under a mounted volume's mountPath, as the local directory standing in for it."""
    for mount in sorted(mounts, key=len, reverse=True):
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            return str(mounts[mount]) + value[len(mount.rstrip("/")) :]
    return value


def _field(pod: dict[str, Any], source: dict[str, Any]) -> str:
    """The downward API's fieldRef values this harness can know."""
    path = source["fieldRef"]["fieldPath"]
    known = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"]["uid"],
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "spec.nodeName": "localhost",
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    assert path in known, f"downward API field {path!r} is not emulated by the process kubelet"
    return known[path]
