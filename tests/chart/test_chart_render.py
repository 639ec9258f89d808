"""The chart renders, lints strictly and produces valid Kubernetes objects for the default and every CI values file."""

from __future__ import annotations

import re
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from chart_util import CHART_DIR, CI_VALUES, NAMESPACE, OPTIONAL_KINDS, Obj, by_kind, load_values, one, render

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schema kubernetes-validate ships.
KUBE_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]

CASES = [pytest.param(None, id="default")] + [pytest.param(p, id=p.name) for p in CI_VALUES]


def _values(path: Path | None) -> Obj | None:
    return None if path is None else load_values(path)


def test_ci_values_files_exist() -> None:
    assert len(CI_VALUES) >= 3, f"expected the namespaced, monitoring and minimal CI values in {CHART_DIR / 'ci'}"


@pytest.mark.parametrize("values_file", CASES)
def test_lint_strict(values_file: Path | None) -> None:
    report = helm.lint(CHART_DIR, _values(values_file), strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems, f"helm lint --strict: {problems}"


@pytest.mark.parametrize("values_file", CASES)
def test_objects_validate_against_kubernetes_schemas(values_file: Path | None) -> None:
    objects = render(_values(values_file))
    assert objects
    for obj in objects:
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        if (obj.get("apiVersion"), obj.get("kind")) in OPTIONAL_KINDS:
            assert obj["metadata"]["name"] and obj["spec"], f"{name} is empty"
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{name} is invalid for Kubernetes {version}: {e.message} at {list(e.path)}")


def test_the_chart_crd_validates_as_a_crd() -> None:
    for path in (CHART_DIR / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)


def test_only_known_kinds_are_rendered() -> None:
    """The optional-CRD exemption above covers exactly the monitors, nothing else slips through unvalidated."""
    for values_file in CI_VALUES:
        for obj in render(load_values(values_file)):
            if obj["kind"] in ("ServiceMonitor", "PodMonitor"):
                assert obj["apiVersion"] == "monitoring.coreos.com/v1"


def test_one_resource_kind_per_template() -> None:
    templates = [p for p in (CHART_DIR / "templates").glob("*.yaml")]
    kinds = {p.name: set(re.findall(r"^kind: (\w+)$", p.read_text(), flags=re.M)) for p in templates}
    assert all(len(k) == 1 for k in kinds.values()), kinds
    assert sorted(kind for k in kinds.values() for kind in k) == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "PodMonitor",
            "PrometheusRule",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ServiceMonitor",
        ]
    )


def test_default_render_objects() -> None:
    kinds = sorted(o["kind"] for o in render())
    # The dashboard ConfigMap is on by default: it costs nothing without Grafana's sidecar.
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "Role",  # leader election, in the release namespace
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]


def test_deployment_is_single_recreate_non_root_read_only() -> None:
    deploy = one(render(), "Deployment")
    assert deploy["metadata"]["namespace"] == NAMESPACE
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    pod = deploy["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    assert container["command"] == ["zerotrain", "operator"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe == {"path": "/healthz", "port": "health"} and ports["health"] == 8080
    assert ports["metrics"] == 9090
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ZEROTRAIN_NAMESPACES"] == ""
    assert env["ZEROTRAIN_METRICS_PORT"] == "9090" and env["ZEROTRAIN_HEALTH_PORT"] == "8080"


def test_the_selector_picks_the_operator_pod_and_the_service_targets_it() -> None:
    objects = render()
    deploy, service = one(objects, "Deployment"), one(objects, "Service")
    selector = deploy["spec"]["selector"]["matchLabels"]
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_namespaced_scope_grants_nothing_cluster_wide() -> None:
    objects = render({"operator": {"scope": "namespaced", "watchNamespaces": ["team-a", "team-b"]}})
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ClusterRoleBinding")
    elected = "-leader-election"
    roles = [r for r in by_kind(objects, "Role") if not r["metadata"]["name"].endswith(elected)]
    bindings = [b for b in by_kind(objects, "RoleBinding") if not b["metadata"]["name"].endswith(elected)]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["roleRef"]["kind"] == "Role"
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "zt-zerotrain-operator", "namespace": NAMESPACE}]
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ZEROTRAIN_NAMESPACES"] == "team-a,team-b"


def test_metrics_disabled_turns_the_endpoint_off() -> None:
    objects = render({"metrics": {"enabled": False}})
    assert not by_kind(objects, "Service")
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ZEROTRAIN_METRICS_PORT"] == "0"
    assert [p["name"] for p in container["ports"]] == ["health"]


def test_names_in_the_docs() -> None:
    """docs/install.md installs release `zerotrain-operator` and names its Deployment and Service."""
    objects = render(release="zerotrain-operator")
    assert one(objects, "Deployment")["metadata"]["name"] == "zerotrain-operator"
    assert one(objects, "Service")["metadata"]["name"] == "zerotrain-operator-metrics"
    docs = (CHART_DIR.parents[1] / "docs" / "install.md").read_text()
    assert "rollout status deployment/zerotrain-operator" in docs and "`zerotrain-operator-metrics`" in docs


def test_digest_wins_over_tag() -> None:
    digest = "sha256:" + "ab" * 32
    container = one(render({"image": {"digest": digest}}), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"ghcr.io/zerotrain/operator@{digest}"


# A kubeconfig whose server is never contacted: a client-side dry run renders through Helm's install action.
_UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: unused}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


@pytest.mark.parametrize("values_file", CASES)
def test_install_action_accepts_the_chart(values_file: Path | None) -> None:
    """`helm install --dry-run=client`: the install action's own checks (kubeVersion, CRDs, NOTES) pass offline."""
    with helm.Config(kubeconfig_content=_UNREACHABLE_KUBECONFIG, namespace=NAMESPACE) as cfg:
        release = cfg.install(CHART_DIR, "zt", _values(values_file), namespace=NAMESPACE, dry_run="client")
    kinds = {doc["kind"] for doc in yaml.safe_load_all(release["manifest"]) if doc}
    assert "Deployment" in kinds
    assert "kubectl" in release["notes"] and "quickstart" in release["notes"]
