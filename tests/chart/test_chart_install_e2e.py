"""Install the chart into a real cluster, see the operator become ready and accept the quickstart job.

Runs only when ZEROTRAIN_E2E_KUBECONFIG names a kubeconfig. The cluster must be able to pull the operator image:
ZEROTRAIN_E2E_OPERATOR_IMAGE (repository:tag) overrides the chart's default, e.g. an image loaded into kind.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
import yaml
from budget import budget
from chart_util import CHART_DIR, ROOT

from zerotrain.spec import GROUP, KIND, PLURAL, VERSION

KUBECONFIG = os.environ.get("ZEROTRAIN_E2E_KUBECONFIG", "")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not KUBECONFIG, reason="set ZEROTRAIN_E2E_KUBECONFIG to a cluster's kubeconfig to run"),
]
TIMEOUT_S = 300


def _values() -> dict[str, Any]:
    image = os.environ.get("ZEROTRAIN_E2E_OPERATOR_IMAGE")
    if not image:
        return {}
    repository, _, tag = image.rpartition(":")
    return {"image": {"repository": repository, "tag": tag}}


@pytest.fixture
def release() -> Iterator[tuple[str, str]]:
    """(release name, namespace) of a fresh install; uninstalled and the namespace deleted afterwards."""
    from kubernetes import client, config

    name, namespace = "zt-e2e", f"zerotrain-e2e-{uuid.uuid4().hex[:6]}"
    api = config.new_client_from_config(config_file=KUBECONFIG)
    with helm.Config(kubeconfig_path=KUBECONFIG, namespace=namespace) as cfg:
        try:
            # wait: every object ready, the Deployment included (its readiness probe is kopf's /healthz).
            cfg.install(
                CHART_DIR,
                name,
                _values(),
                namespace=namespace,
                create_namespace=True,
                wait="watcher",
                timeout=TIMEOUT_S,
            )
            yield name, namespace
        finally:
            cfg.uninstall(name, ignore_not_found=True, wait="watcher", timeout=TIMEOUT_S)
            try:
                client.CoreV1Api(api).delete_namespace(namespace)
            except client.ApiException as e:
                if e.status != 404:  # a failed install may not have created it; don't hide the install's error
                    raise
            api.close()


def test_install_and_accept_the_quickstart_job(release: tuple[str, str]) -> None:
    from kubernetes import client, config

    name, namespace = release
    api = config.new_client_from_config(config_file=KUBECONFIG)
    try:
        deployment = client.AppsV1Api(api).read_namespaced_deployment_status(f"{name}-zerotrain-operator", namespace)
        assert deployment.status.ready_replicas == 1
        (job,) = [
            d for d in yaml.safe_load_all((ROOT / "examples" / "quickstart.yaml").read_text()) if d["kind"] == KIND
        ]
        jobs = client.CustomObjectsApi(api)
        jobs.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
        # Accepted: the operator admitted it and wrote a status (a refused job would get phase Failed/InvalidSpec).
        deadline, status = time.monotonic() + budget(120), {}
        while time.monotonic() < deadline and not status.get("phase"):
            time.sleep(2)
            status = (
                jobs.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job["metadata"]["name"]).get(
                    "status"
                )
                or {}
            )
        assert status.get("phase") in ("Pending", "Running", "Succeeded"), f"operator status: {status}"
        invalid = [c for c in status.get("conditions", []) if c["type"] == "InvalidSpec" and c["status"] == "True"]
        assert not invalid, invalid
        jobs.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job["metadata"]["name"])
    finally:
        api.close()
