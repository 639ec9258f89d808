"""The operator benches on a real server install the CRD themselves, or stop with one line saying how, when their
kubeconfig may not (tests/e2e/cluster.py's install_crd, which both benches' set-up calls)."""

from __future__ import annotations

from typing import Any

import pytest
from e2e.cluster import install_crd

from zerotrain.operator.client.kube import KubeError


class Refusing:
    """An API server answering as RBAC does to a kubeconfig without rights on CRDs (`installed`: one exists)."""

    def __init__(self, installed: bool) -> None:
        self.installed = installed

    def request(self, method: str, path: str, body: Any = None) -> Any:
        if method == "GET" and self.installed:
            return {"status": {"conditions": [{"type": "Established", "status": "True"}]}}
        if method == "GET":
            raise KubeError(404, "Not Found", "customresourcedefinitions not found", method)
        raise KubeError(403, "Forbidden", "cannot create resource customresourcedefinitions", method)


def test_a_missing_crd_the_kubeconfig_may_not_install_is_one_line_saying_how() -> None:
    with pytest.raises(SystemExit) as stopped:
        install_crd(Refusing(installed=False))  # type: ignore[arg-type]
    message = str(stopped.value)
    assert "zerotrainingjobs.zerotrain.dev is not installed" in message and "kubectl apply -f crds/" in message
    assert "\n" not in message


def test_an_installed_crd_needs_no_rights() -> None:
    install_crd(Refusing(installed=True))  # type: ignore[arg-type]
