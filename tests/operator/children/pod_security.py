"""The Pod Security Standards' `baseline` and `restricted` profiles (Kubernetes 1.30+), as plain checks over a pod
manifest.

Each rule follows https://kubernetes.io/docs/concepts/security/pod-security-standards/ (baseline, then the
restricted additions; the capability lists are those of the pod-security-admission checks in
k8s.io/pod-security-admission/policy); `violations` returns one line per broken rule, empty when the pod passes
`restricted`, and `level` names the least privileged level whose namespace admits the pod.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
BASELINE_CAPS = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def _containers(spec: Obj) -> list[Obj]:
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def _baseline(spec: Obj) -> list[str]:
    out = [f"host namespaces: {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    psc = spec.get("securityContext") or {}
    out += [f"hostPath volume {v['name']}" for v in spec.get("volumes", []) if "hostPath" in v]
    out += [f"unsafe sysctl {s['name']}" for s in psc.get("sysctls", []) if s["name"] not in SAFE_SYSCTLS]
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{c['name']}: hostProcess")
        extra = set((sc.get("capabilities") or {}).get("add", [])) - BASELINE_CAPS
        out += [f"{c['name']}: capability {cap} beyond baseline" for cap in sorted(extra)]
        out += [f"{c['name']}: hostPort {p['hostPort']}" for p in c.get("ports", []) if p.get("hostPort")]
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{c['name']}: procMount {sc['procMount']}")
        for ctx in (psc, sc):
            if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
                out.append(f"{c['name']}: seccomp Unconfined")
    return out


def _restricted(spec: Obj) -> list[str]:
    out = [
        f"volume {v['name']} of a type restricted forbids"
        for v in spec.get("volumes", [])
        if not set(v) - {"name"} <= RESTRICTED_VOLUMES
    ]
    psc = spec.get("securityContext") or {}
    for c in _containers(spec):
        sc, name = c.get("securityContext") or {}, c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation must be false")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            out.append(f"{name}: runAsNonRoot must be true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            out.append(f"{name}: capabilities must drop ALL")
        out += [f"{name}: adds capability {cap}" for cap in caps.get("add", []) if cap != "NET_BIND_SERVICE"]
    return out


def violations(pod: Obj) -> list[str]:
    """What keeps `pod` out of a namespace enforcing `restricted` (empty: it is admitted)."""
    spec = pod["spec"]
    return _baseline(spec) + _restricted(spec)


def baseline_violations(pod: Obj) -> list[str]:
    """What keeps `pod` out of a namespace enforcing `baseline` (empty: it is admitted)."""
    return _baseline(pod["spec"])


def level(pod: Obj) -> str:
    """`restricted`, `baseline` or `privileged`: the `pod-security.kubernetes.io/enforce` label a namespace needs at
    most for `pod` to be admitted."""
    if _baseline(pod["spec"]):
        return "privileged"
    return "baseline" if _restricted(pod["spec"]) else "restricted"
