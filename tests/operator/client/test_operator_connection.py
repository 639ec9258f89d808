"""client.connection: the places a connection is loaded from, in the client's order, and what a failure says."""

from __future__ import annotations

from pathlib import Path

import kubernetes
import pytest
import yaml

from zerotrain.errors import UserError
from zerotrain.operator.client.connection import ConnectionSource, load
from zerotrain.operator.client.kube import Kube

NO_CLUSTER: dict[str, str] = {}


def kubeconfig(path: Path, server: str = "http://127.0.0.1:1") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def test_a_valid_kubeconfig_from_the_environment_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = kubernetes.client.Configuration()
    kc = kubeconfig(tmp_path / "kc", "http://127.0.0.1:4321")
    assert load(config, environ={"KUBECONFIG": str(kc)}) == ConnectionSource.KUBECONFIG
    assert config.host == "http://127.0.0.1:4321"
    assert config.api_key == {"BearerToken": "Bearer t0ken"}


def test_a_kubeconfig_list_loads_when_one_of_its_files_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # kubectl merges the files of $KUBECONFIG that exist and ignores the rest; refusing the list would break that.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = kubernetes.client.Configuration()
    listed = f"{tmp_path / 'missing'}:{kubeconfig(tmp_path / 'kc', 'http://127.0.0.1:4322')}"
    assert load(config, environ={"KUBECONFIG": listed}) == ConnectionSource.KUBECONFIG
    assert config.host == "http://127.0.0.1:4322"


def test_kube_connect_with_an_explicit_path_keeps_working(tmp_path: Path) -> None:
    kube = Kube.connect(str(kubeconfig(tmp_path / "kc", "http://127.0.0.1:4323")))
    try:
        assert kube.source == ConnectionSource.KUBECONFIG
        assert kube.config.host == "http://127.0.0.1:4323"
    finally:
        kube.close()


def test_the_environment_at_start_up_is_read_not_the_one_at_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client froze $KUBECONFIG when it was imported; a message naming the current value must be about that value.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "later"
    with pytest.raises(UserError, match=f"KUBECONFIG={missing} \\(not found\\)"):
        load(kubernetes.client.Configuration(), environ={"KUBECONFIG": str(missing)})


def test_every_missing_file_of_a_list_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    a, b = tmp_path / "a", tmp_path / "b"
    with pytest.raises(UserError) as e:
        load(kubernetes.client.Configuration(), environ={"KUBECONFIG": f"{a}:{b}"})
    assert f"({a} not found, {b} not found)" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_kubeconfig_that_is_not_a_mapping_is_named(tmp_path: Path) -> None:
    kc = tmp_path / "kc"
    kc.write_text("- just\n- a list\n")
    with pytest.raises(UserError, match=f"cannot load the kubeconfig {kc} \\(from --kubeconfig\\): not a kubeconfig"):
        load(kubernetes.client.Configuration(), str(kc), environ=NO_CLUSTER)
