"""examples/custom: a user's own model and data in one short module beside its manifest, trained as it stands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from budget import budget

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "examples" / "custom" / "job.yaml"


@pytest.mark.slow
def test_the_custom_example_trains_from_anywhere_and_its_loss_falls(tmp_path: Path) -> None:
    # Run from an unrelated directory: the entry point is found beside the manifest, not in the working directory.
    summary = tmp_path / "summary.json"
    argv = [sys.executable, "-m", "zerotrain.cli", "run", str(MANIFEST), "--steps", "60", "--no-metrics"]
    argv += ["--summary-file", str(summary), "--log-dir", str(tmp_path / "logs")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=budget(240), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(summary.read_text())
    assert result["world_size"] == 2 and result["stage"] == 2 and len(result["losses"]) == 60
    assert result["final_loss"] < 0.8 * result["first_loss"], result["losses"]
    assert "samples/s" in proc.stdout
    assert result["tokens_per_s"] is None and result["throughput_unit"] == "samples/s"  # no tokens: no "0 tokens/s"


def test_a_module_neither_beside_the_manifest_nor_on_the_path_names_where_it_looked(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(MANIFEST.read_text().replace("regression:build", "nowhere:build"))
    proc = subprocess.run(
        [sys.executable, "-m", "zerotrain.cli", "run", str(job), "--no-metrics"],
        capture_output=True,
        text=True,
        timeout=budget(120),
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"module 'nowhere' cannot be imported (looked on the Python path, in the working directory, {tmp_path})" in (
        " ".join(proc.stderr.split())
    )
