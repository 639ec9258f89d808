"""A kubelet made of local processes: it runs each of a job's Pods as a process with the pod's env.

It polls the job's Pods through the test's Kube client and, for every new pod, runs the container's command
(`python` replaced by this interpreter; ConfigMap volumes written to files, PVC volumes mapped to one directory
per claim shared by all pods, paths under their mountPaths rewritten in the env and in mounted YAML files, as the
pod resolves them through its mounts; the pod's service-account token minted with
the TokenRequest API and projected into a directory the runtime is pointed at), then writes the pod's status with
`kubelet.set_pod_phase`: Running when started, Succeeded or Failed with the exit code when the process ends.
A deleted pod's processes are killed with SIGKILL, the whole tree: torch's launcher starts each rank in a
session of its own, and a real kubelet stops the container's whole cgroup. Only processes it started (and
their descendants) are ever signalled, by PID.

Optionally it models a scheduler and nodes (`capacity`, the elastic tests): it runs at most `capacity` pods at
once; the others stay Pending with `PodScheduled=False`/`Unschedulable` and the scheduler's kind of message, and
start, in creation order, when room frees. `lose_node(pod)` is a node going away with its pod: the process is
killed, the pod Failed with the `DisruptionTarget` condition the pod garbage collector writes, and the capacity one
less. And it can model graceful deletion (`graceful`): it holds each pod it runs with a finalizer, so a DELETE
leaves the pod Terminating while the container gets SIGTERM and up to its terminationGracePeriodSeconds (then
SIGKILL), as a kubelet does; once it exited the status is written and the finalizer removed.

What a cluster network would do, done by hand: MASTER_ADDR (rank 0's DNS name through the job's headless
Service) becomes 127.0.0.1, and each gang gets its own free MASTER_PORT, shared by its pods, so no process of an old
gang can join a new gang's rendezvous. A gang is known by the ConfigMap its pods mount: pods an in-place restart
keeps go on with theirs (and their port), and the pods created beside them mount the same.

`kill_rank(pod)` is the in-place fault: SIGKILL to one rank process of the pod, its launcher left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from zerotrain.operator.children import naming
from zerotrain.operator.client.kube import Kube, KubeError, path_of
from zerotrain.runtime.job.launch import free_port

from .cluster import Cluster, project_token
from .kubelet import set_pod_phase

KUBELET_FINALIZER = "zerotrain.dev/e2e-kubelet"
"""Holds a pod the process kubelet runs (with `graceful`) until its container stopped, as a kubelet's final
deletion does."""
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")  # what an image provides; nothing else of the test's env


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[19])


def is_alive(pid: int, start: int) -> bool:
    """The process that had this start time still runs (a reused PID has another start time)."""
    st = _stat(pid)
    return st is not None and st[2] == start and st[0] != "Z"


def process_tree(root: int) -> set[tuple[int, int]]:
    """(pid, start time) of `root` and all its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            children.setdefault(st[1], []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if (st := _stat(pid)) is not None and st[0] != "Z":
            found.add((pid, st[2]))
            todo += children.get(pid, [])
    return found


@dataclass
class PodProcess:
    """One pod's container, run locally."""

    name: str
    uid: str
    gang: str
    popen: subprocess.Popen[bytes]
    root: Path
    """Its own directory: output.log (stdout and stderr), termination-log, ConfigMap files."""
    tree: set[tuple[int, int]] = field(default_factory=set)
    """Every (pid, start time) seen in its process tree, kept after it ended."""
    exit_code: int | None = None
    """The container's exit code once it ended (128 + signal when a signal killed it)."""
    deleted: bool = False
    """Its pod was deleted while it ran: killed, and no status written."""
    stopping_since: float | None = None
    """When a graceful deletion sent it SIGTERM (`graceful`)."""
    grace_s: float = 30.0
    """Its pod's terminationGracePeriodSeconds."""

    def output(self) -> str:
        return (self.root / "output.log").read_text(errors="replace")


class ProcessKubelet:
    """Runs the pods of job `job` in the cluster's namespace; `async with` it in a test."""

    def __init__(
        self,
        cluster: Cluster,
        job: str,
        workdir: Path,
        poll_s: float = 0.2,
        capacity: int | None = None,
        graceful: bool = False,
    ) -> None:
        self.cluster = cluster
        self.capacity, self.graceful = capacity, graceful
        self._refused: set[str] = set()  # pods marked Unschedulable (uid), so each is written once
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
        await asyncio.to_thread(self.stop)  # the emulator answers API calls on this event loop: never block it

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        with self._lock:
            for p in self.pods:
                self._kill(p)
            if self.graceful:  # a pod left holding this kubelet's finalizer would keep its namespace Terminating
                for name in {p.name for p in self.pods}:
                    with contextlib.suppress(KubeError):
                        self._release(name)
        self.kube.close()

    def kill(self, pod: str) -> PodProcess:
        """The fault: SIGKILL the running container of `pod`; the next poll reports it Failed with 137."""
        with self._lock:
            running = [p for p in self.pods if p.name == pod and p.popen.poll() is None]
            assert running, f"pod {pod} has no running process to kill (did it finish already?)"
            self._kill(running[0])
            return running[0]

    def kill_rank(self, pod: str) -> int:
        """The fault an in-place restart recovers from: SIGKILL to one rank of `pod` (the lowest-numbered), its
        launcher left running; the rank's pid."""
        with self._lock:
            running = [p for p in self.pods if p.name == pod and p.popen.poll() is None]
            assert running, f"pod {pod} has no running process (did it finish already?)"
            ranks = sorted((rank_of(pid), pid) for pid, _ in process_tree(running[0].popen.pid) if rank_of(pid) >= 0)
            assert ranks, f"pod {pod} runs no rank process yet"
            os.kill(ranks[0][1], signal.SIGKILL)
            return ranks[0][1]

    def terminate(self, pod: str) -> PodProcess:
        """What a kubelet does first when it evicts or preempts a pod: SIGTERM to the container's process (the
        launcher, PID 1 in a container). The next poll reports how it exited, with its termination message."""
        with self._lock:
            running = [p for p in self.pods if p.name == pod and p.popen.poll() is None]
            assert running, f"pod {pod} has no running process to terminate (did it finish already?)"
            running[0].popen.send_signal(signal.SIGTERM)
            return running[0]

    def set_capacity(self, pods: int) -> None:
        """Nodes came back (or went): at most `pods` pods run from the next poll."""
        with self._lock:
            self.capacity = pods
            self._refused.clear()

    def lose_node(self, pod: str) -> PodProcess:
        """The node under `pod` goes away: its processes die, the pod garbage collector fails the pod (phase
        Failed, DisruptionTarget=True/DeletionByPodGC), and the capacity is one pod less."""
        with self._lock:
            running = [p for p in self.pods if p.name == pod and p.popen.poll() is None]
            assert running, f"pod {pod} has no running process (did it finish already?)"
            self._kill(running[0])
            running[0].exit_code = _exit_code(running[0].popen.wait())
            if self.capacity is not None:
                self.capacity -= 1
            status = {
                "phase": "Failed",
                "reason": "NodeLost",
                "message": "the node the pod ran on is gone",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "DeletionByPodGC",
                        "message": "PodGC: node no longer exists",
                    }
                ],
            }
            path = path_of("v1", "pods", self.namespace, pod, "status")
            self.kube.request("PATCH", path, {"status": status}, "application/merge-patch+json")
            return running[0]

    def gang(self, gang: int) -> list[PodProcess]:
        return [p for p in self.pods if p.gang == str(gang)]

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                with self._lock:
                    self._sync()
            except Exception as e:  # the test asserts there are none; a dead loop would only show as a timeout
                self.errors.append(e)

    def _sync(self) -> None:
        listed = self.kube.list_job_pods(self.namespace, self.job).items
        stored = {p["metadata"]["uid"]: p for p in listed}
        live = {uid: p for uid, p in stored.items() if not p["metadata"].get("deletionTimestamp")}
        for proc in (p for p in self.pods if p.exit_code is None):
            if proc.uid not in stored or (proc.uid not in live and not self.graceful):
                self._kill(proc)
                proc.deleted, proc.exit_code = True, _exit_code(proc.popen.wait())
                continue
            proc.tree |= process_tree(proc.popen.pid)
            if proc.uid not in live:
                self._stop_gracefully(proc)
            if (rc := proc.popen.poll()) is not None:
                proc.exit_code = _exit_code(rc)
                log = proc.root / "termination-log"
                message = log.read_text().strip() if log.is_file() else ""
                ended = "Succeeded" if rc == 0 else "Failed"
                self._set_phase(proc.name, ended, proc.exit_code, message, datetime.now(timezone.utc))
        for proc in self.pods:
            if self.graceful and proc.exit_code is not None and proc.uid in stored and proc.uid not in live:
                self._release(proc.name)
        self._schedule(live)

    def _schedule(self, live: dict[str, dict[str, Any]]) -> None:
        """Start new Pending pods while there is room (all, without a capacity); mark the rest Unschedulable."""
        started = {p.uid for p in self.pods}
        running = sum(1 for p in self.pods if p.exit_code is None)
        waiting = sorted(
            (
                pod
                for uid, pod in live.items()
                if uid not in started
                and pod.get("status", {}).get("phase", "Pending") == "Pending"
                and not pod["spec"].get("schedulingGates")  # a scheduler binds no gated pod (Kueue's admission)
            ),
            key=lambda pod: pod["metadata"].get("creationTimestamp") or "",
        )
        for pod in waiting:
            if self.capacity is None or running < self.capacity:
                if self.graceful and not self._hold(pod["metadata"]["name"]):
                    continue  # deleted since the list
                self.pods.append(self._start(pod))
                self._set_phase(pod["metadata"]["name"], "Running", at=datetime.now(timezone.utc))
                running += 1
            elif pod["metadata"]["uid"] not in self._refused:
                self._refused.add(pod["metadata"]["uid"])
                self._unschedulable(pod["metadata"]["name"], running)

    def _unschedulable(self, name: str, running: int) -> None:
        """What kube-scheduler writes on a pod no node can take."""
        nodes = max(self.capacity or 0, 1)
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": f"0/{nodes} nodes are available: {nodes} Insufficient cpu. preemption: 0/{nodes} nodes are "
            f"available: {nodes} No preemption victims found for incoming pod.",
        }
        path = path_of("v1", "pods", self.namespace, name, "status")
        with contextlib.suppress(KubeError):
            self.kube.request(
                "PATCH",
                path,
                {"status": {"phase": "Pending", "conditions": [condition]}},
                "application/merge-patch+json",
            )

    def _hold(self, name: str) -> bool:
        """Put the finalizer on a pod about to start; False when the pod is gone."""
        return self._finalizer(name, hold=True)

    def _release(self, name: str) -> None:
        """The container stopped: let the API server remove the pod (as far as this kubelet is concerned)."""
        self._finalizer(name, hold=False)

    def _finalizer(self, name: str, hold: bool) -> bool:
        """Add or remove this kubelet's finalizer alone, leaving any other (Kueue's `kueue.x-k8s.io/managed`): the
        list is written with the resourceVersion it was read at, and read again when another writer came between."""
        path = path_of("v1", "pods", self.namespace, name)
        for _ in range(10):
            try:
                md = self.kube.request("GET", path)["metadata"]
                others = [f for f in md.get("finalizers") or [] if f != KUBELET_FINALIZER]
                wanted = [*others, KUBELET_FINALIZER] if hold else others
                patch = {"metadata": {"finalizers": wanted or None, "resourceVersion": md["resourceVersion"]}}
                self.kube.request("PATCH", path, patch, "application/merge-patch+json")
                return True
            except KubeError as e:
                if e.status == 404:
                    return False
                if e.status != 409:
                    raise
        raise AssertionError(f"pod {name}: its finalizers kept changing under the process kubelet")

    def _stop_gracefully(self, proc: PodProcess) -> None:
        """SIGTERM to the container's process once; SIGKILL to its tree after the grace period."""
        now = time.monotonic()
        if proc.stopping_since is None:
            proc.stopping_since = now
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        elif now - proc.stopping_since > proc.grace_s and proc.popen.poll() is None:
            self._kill(proc)

    def _set_phase(
        self, name: str, phase: str, code: int | None = None, message: str = "", at: datetime | None = None
    ) -> None:
        # The pod may be deleted between the list and this write (the operator tearing the gang down); a
        # recreated pod of the same name cannot be hit: the operator waits out a back-off before creating it.
        try:
            set_pod_phase(self.kube, self.namespace, name, phase, code, message=message, at=at)
        except KubeError as e:
            if e.status != 404:
                raise

    def _kill(self, proc: PodProcess) -> None:
        if proc.popen.poll() is None:
            proc.tree |= process_tree(proc.popen.pid)
        for pid, start in proc.tree:
            if is_alive(pid, start):
                os.kill(pid, signal.SIGKILL)
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
        gang = md["labels"][naming.LABEL_GANG]
        token_dir = root / "serviceaccount"
        if naming.LABEL_PROBE not in md["labels"]:  # a capacity probe runs nothing: no rendezvous, no token
            master = naming.master_addr(self.job, self.namespace)
            assert env.get("MASTER_ADDR") == master, f"pod env MASTER_ADDR={env.get('MASTER_ADDR')!r}, not {master!r}"
            project_token(self.cluster, self.kube, spec.get("serviceAccountName", "default"), pod, token_dir)
        env.update(
            ZEROTRAIN_SERVICE_ACCOUNT_DIR=str(token_dir),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(self._ports.setdefault(_config_map(spec) or gang, free_port())),
            ZEROTRAIN_STATUS_API=self.api_url,
            ZEROTRAIN_TERMINATION_LOG=str(root / "termination-log"),
            PYTHONSAFEPATH="1",
            OMP_NUM_THREADS="1",
        )
        argv = [_remap(mounts, a) for a in container["command"] + container.get("args", [])]
        argv[0] = sys.executable if argv[0] in ("python", "python3") else argv[0]
        with (root / "output.log").open("wb") as out:
            popen = subprocess.Popen(
                argv, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        grace = float(spec.get("terminationGracePeriodSeconds", 30))
        return PodProcess(md["name"], md["uid"], gang, popen, root, grace_s=grace)

    def _mounts(self, spec: dict[str, Any], container: dict[str, Any], root: Path) -> dict[str, Path]:
        """mountPath -> local directory, for ConfigMap (files written now) and PVC (one per claim) volumes."""
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts: dict[str, Path] = {}
        config_maps: list[tuple[Path, str]] = []
        for m in container.get("volumeMounts", []):
            vol = volumes[m["name"]]
            if "configMap" in vol:
                mounts[m["mountPath"]] = local = root / vol["name"]
                config_maps.append((local, vol["configMap"]["name"]))
            elif "persistentVolumeClaim" in vol:
                mounts[m["mountPath"]] = local = self.workdir / "pvc" / vol["persistentVolumeClaim"]["claimName"]
                local.mkdir(parents=True, exist_ok=True)
        for local, name in config_maps:
            cm = self.kube.request("GET", path_of("v1", "configmaps", self.namespace, name))
            local.mkdir()
            for key, text in cm.get("data", {}).items():
                (local / key).write_text(_remap_document(mounts, text))
        return mounts


def rank_of(pid: int) -> int:
    """The RANK of a rank process (in its title, `RANK=N`, when forked from the launcher's server; in its environment
    when spawned); -1 for any other process."""
    try:
        found = Path(f"/proc/{pid}/cmdline").read_bytes() + b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return -1
    if b"zerotrain.runtime.job.rank" not in found:
        return -1
    words = found.replace(b"\0", b" ").split()
    return next((int(v[5:]) for v in words if v.startswith(b"RANK=") and v[5:].isdigit()), -1)


def _config_map(spec: dict[str, Any]) -> str | None:
    """The ConfigMap a pod mounts as the job's config (its gang's, or the one of the pods it joins)."""
    for volume in spec.get("volumes", []):
        if volume.get("name") == naming.CONFIG_VOLUME:
            return str(volume["configMap"]["name"])
    return None


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _remap(mounts: dict[str, Path], value: str) -> str:
    """A path under a volume's mountPath, rewritten to the local directory standing in for the volume."""
    for mount in sorted(mounts, key=len, reverse=True):
        base = mount.rstrip("/")
        if value == mount or value.startswith(base + "/"):
            return str(mounts[mount]) + value[len(base) :]
    return value


def _remap_document(mounts: dict[str, Path], text: str) -> str:
    """A mounted YAML file with every path under a mountPath rewritten, as the pod would resolve it through the
    mount (the job's spec names its checkpoint directory inside the pod); any other file as it is."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if not isinstance(doc, dict):
        return text

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return _remap(mounts, node) if isinstance(node, str) and node.startswith("/") else node

    return yaml.safe_dump(walk(doc), sort_keys=False)


def _field(pod: dict[str, Any], source: dict[str, Any]) -> str:
    """The downward API's fieldRef values (the pod runs on this host)."""
    path = source["fieldRef"]["fieldPath"]
    md = pod["metadata"]
    known = {"metadata.name": md["name"], "metadata.namespace": md["namespace"], "metadata.uid": md["uid"]}
    known |= {"spec.nodeName": "localhost", "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
    for kind in ("labels", "annotations"):
        known |= {f"metadata.{kind}['{k}']": v for k, v in (md.get(kind) or {}).items()}
    assert path in known, f"downward API field {path!r} is not emulated by the process kubelet"
    return known[path]
