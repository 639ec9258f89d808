"""A reader that goes away (`zerotrain plan ... | head`) ends the command quietly, as SIGPIPE ends `cat`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
