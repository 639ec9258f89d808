"""tests/e2e/kueue_env.py refuses in one line naming the step: a source tree of another Kueue release, a manager that
is not an executable. (Starting one needs a cluster: test_kueue_e2e.py runs against what it starts.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .kueue_env import RELEASE, main


def source(tmp_path: Path, version: str) -> Path:
    chart = tmp_path / "kueue" / "charts" / "kueue" / "Chart.yaml"
    chart.parent.mkdir(parents=True)
    chart.write_text(yaml.safe_dump({"appVersion": version}))
    return tmp_path / "kueue"


def up(tmp_path: Path, src: Path, binary: Path) -> list[str]:
    argv = ["up", "--kubeconfig", str(tmp_path / "none"), "--kueue-bin", str(binary), "--kueue-src", str(src)]
    return [*argv, "--state", str(tmp_path / "state")]


def test_another_release_or_no_manager_is_refused_in_one_line_naming_the_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(up(tmp_path, source(tmp_path, "v0.12.0"), tmp_path / "kueue-bin")) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("kueue: step check-source failed:") and f"not {RELEASE}" in err and "\n" not in err, err
    fine = source(tmp_path / "ok", RELEASE)
    assert main(up(tmp_path, fine, tmp_path / "no-such-binary")) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("kueue: step check-binary failed:") and "no-such-binary" in err, err
