"""Output to a pipe: a reader that goes away (`zerotrain plan ... | head`) ends the command quietly, as SIGPIPE ends
`cat`; a run read through a pipe (a log, CI, `| tee`) says each logged step as it happens."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from budget import budget

ROOT = Path(__file__).resolve().parents[2]


def test_a_closed_pipe_ends_the_command_without_a_traceback() -> None:
    argv = [sys.executable, "-m", "zerotrain.cli", "plan", "-f", str(ROOT / "examples" / "quickstart.yaml")]
    proc = subprocess.Popen([*argv, "--output", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes a byte: its first write finds no reader
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=budget(120)) == 141, err  # 128 + SIGPIPE
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err


def test_each_checkpoint_action_describes_itself_not_its_parent() -> None:
    said = {}
    for action in ("inspect", "export"):
        done = subprocess.run(
            [sys.executable, "-m", "zerotrain.cli", "checkpoint", action, "--help"], capture_output=True, text=True
        )
        said[action] = " ".join(done.stdout.split())
    assert "List every checkpoint under a checkpoint root" in said["inspect"]
    assert "Write the newest complete checkpoint" in said["export"] and "List every" not in said["export"]


@pytest.mark.slow
def test_a_run_writing_to_a_pipe_says_each_logged_step_as_it_happens(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["training"] |= {"steps": 12, "logEvery": 2}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    argv = [sys.executable, "-P", "-m", "zerotrain.cli", "run", str(tmp_path / "job.yaml")]
    argv += ["--no-metrics", "--log-dir", str(tmp_path / "logs")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    assert proc.stdout is not None
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("step 2/12: loss "):
                assert proc.poll() is None, "the line came only once the run had ended"
                break
        else:
            raise AssertionError("no progress line for step 2:\n" + "".join(seen))
        rest = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.wait(timeout=budget(300))
    assert proc.returncode == 0, rest
    steps = [int(m) for m in re.findall(r"^step (\d+)/12: loss \d+\.\d+, lr \S+, [\d,.]+ tokens/s", rest, re.M)]
    assert steps == [4, 6, 8, 10, 12], rest
