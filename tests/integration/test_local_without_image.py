"""spec.image is the pods' image: `zerotrain run` needs none, `validate` says the operator would want one, and the
operator refuses a job without it in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from budget import budget

from zerotrain.cli import main
from zerotrain.operator.controller.admission import NO_IMAGE, admit

ROOT = Path(__file__).resolve().parents[2]


def imageless(tmp_path: Path) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    del doc["spec"]["image"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_validate_and_the_operator_say_what_a_job_without_image_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = imageless(tmp_path)
    assert main(["validate", str(path)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "spec.image: not set: `zerotrain run` needs none, but the operator refuses the job without it" in said
    verdict = admit(yaml.safe_load(path.read_text())["spec"], "quickstart")
    assert not verdict.admitted and verdict.message == NO_IMAGE and NO_IMAGE.startswith("spec.image: missing;")


@pytest.mark.slow
def test_a_job_without_image_runs_locally(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "zerotrain.cli", "run", str(imageless(tmp_path)), "--steps", "2", "--no-metrics"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=budget(240), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 2/2" in proc.stdout
