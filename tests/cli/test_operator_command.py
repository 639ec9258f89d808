"""`zerotrain operator` as a user runs it, on a machine that cannot reach a cluster: one line naming what it tried."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from budget import budget

ZEROTRAIN = Path(sys.executable).parent / "zerotrain"
EXIT_BAD_INPUT = 2


def run_operator(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The console script with HOME at `home` and no trace of a cluster in the environment."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "ZEROTRAIN_")) and k != "KUBECONFIG"
    }
    # Should a kubeconfig ever load, the operator would run until killed: the timeout fails the test instead.
    return subprocess.run(
        [str(ZEROTRAIN), "operator", *args],
        env={**clean, "HOME": str(home), "PYTHONSAFEPATH": "1", **env},
        capture_output=True,
        text=True,
        timeout=budget(30),
    )


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == EXIT_BAD_INPUT, (out.returncode, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert out.stderr.strip() == lines[0]
    return lines[0]


def test_missing_kubeconfig_names_the_path_and_the_in_cluster_attempt(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "kubeconfig"
    line = one_line_error(run_operator(tmp_path, KUBECONFIG=str(missing)))
    assert f"$KUBECONFIG={missing} (not found)" in line
    assert "in-cluster service account ($KUBERNETES_SERVICE_HOST" in line
    # With $KUBECONFIG set the client never reads ~/.kube/config: the message must not claim it did.
    assert ".kube/config" not in line
    assert "set KUBECONFIG or pass --kubeconfig" in line


def test_no_kubeconfig_variable_names_the_default_under_home(tmp_path: Path) -> None:
    line = one_line_error(run_operator(tmp_path))
    assert f"~/.kube/config ({tmp_path}/.kube/config not found; $KUBECONFIG is not set)" in line


def test_explicit_kubeconfig_is_the_only_place_tried(tmp_path: Path) -> None:
    missing = tmp_path / "kc.yaml"
    # A service-account environment must not be tried when --kubeconfig names a file.
    out = run_operator(tmp_path, "--kubeconfig", str(missing), KUBERNETES_SERVICE_HOST="10.0.0.1")
    line = one_line_error(out)
    assert f"--kubeconfig {missing} (not found)" in line
    assert "in-cluster" not in line


def test_malformed_yaml_names_the_file_and_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nclusters: [\n  - name: {\n")
    line = one_line_error(run_operator(tmp_path, KUBECONFIG=str(bad)))
    assert f"cannot load the kubeconfig {bad} (from $KUBECONFIG): not valid YAML" in line
    assert "at line 3, column 3" in line  # the block `-` inside a flow sequence


def test_kubeconfig_without_current_context_names_the_file_and_the_fix(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []}))
    line = one_line_error(run_operator(tmp_path, KUBECONFIG=str(kc)))
    assert f"cannot load the kubeconfig {kc} (from $KUBECONFIG)" in line
    assert "current-context" in line and "kubectl config use-context" in line


@pytest.mark.parametrize("switch", [("--debug",), ()], ids=["flag", "env"])
def test_debug_adds_the_traceback_before_the_same_line(tmp_path: Path, switch: tuple[str, ...]) -> None:
    missing = tmp_path / "kubeconfig"
    env = {"KUBECONFIG": str(missing)} | ({} if switch else {"ZEROTRAIN_DEBUG": "1"})
    out = run_operator(tmp_path, *switch, **env)
    assert out.returncode == EXIT_BAD_INPUT, out.stderr
    assert "Traceback" in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: cannot load a kubeconfig: tried"), out.stderr
    assert str(missing) in out.stderr.strip().splitlines()[-1]
