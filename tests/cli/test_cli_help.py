"""What the command says of itself: bare `zerotrain` prints its help, options show their defaults, `--steps`
says what it does to a decaying schedule, and `checkpoint inspect` shows a byte range only where one reads as one."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from zerotrain.cli import main
from zerotrain.commands.checkpoint import table
from zerotrain.commands.run import effective_job, steps_note
from zerotrain.commands.tables import print_rows

ROOT = Path(__file__).resolve().parents[2]


def test_bare_zerotrain_prints_its_help_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: zerotrain") and "validate" in out and "checkpoint" in out


def test_an_option_s_help_ends_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["checkpoint", "export", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "PEFT saves them (default: safetensors)" in said
    assert "(default: None)" not in said and "(default: False)" not in said


def test_steps_says_the_schedule_decays_over_the_new_count(tmp_path: Path) -> None:
    manifest = ROOT / "examples" / "llama-tiny" / "job.yaml"
    doc = yaml.safe_load(manifest.read_text())
    doc["spec"]["entrypointArgs"] = {"config": {"model_type": "llama"}}  # no files needed to read the schedule
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    job, _ = effective_job(str(path), None, 60)
    note = steps_note(300, job)
    assert note is not None and "decays (cosine) over steps 31-60, not the manifest's 31-300" in note
    assert "decaySteps" in note
    assert steps_note(60, job) is None  # the manifest's own count
    fixed = doc["spec"]["training"]["lrSchedule"] | {"decaySteps": 270}
    doc["spec"]["training"]["lrSchedule"] = fixed
    path.write_text(yaml.safe_dump(doc))
    assert steps_note(300, effective_job(str(path), None, 60)[0]) is None


def test_inspect_shows_a_range_only_where_the_sizes_read_differently() -> None:
    def printed(sizes: dict[str, int]) -> str:
        row = {"path": "/c/step-1", "step": 1, "bytes_per_rank": sizes, "complete": True}
        out = io.StringIO()
        print_rows(table([row]), Console(file=out, width=200, color_system=None))
        return out.getvalue()

    assert "2 × 3.4 MB " in printed({"0": 3_400_100, "1": 3_400_200}) and "MB-" not in printed({"0": 3_400_100})
    assert "2 × 3.4 MB-5.1 MB" in printed({"0": 3_400_000, "1": 5_100_000})
