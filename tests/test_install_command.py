"""The command lines `make demo` and `make test` give pip (`make -n`, nothing installed): torch comes from
PyTorch's CPU index unless TORCH_INDEX_URL says otherwise, the extra indexes of pip's own configuration and
environment survive (on pip's command line --extra-index-url replaces them), and only the torch step asks the
torch index (an unreachable index costs seconds of retries per package)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU = "https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make, which runs the README's commands")


def pip_lines(
    tmp_path: Path, config: str | None, *make_args: str, env: dict[str, str] | None = None
) -> list[list[str]]:
    """The pip install command lines of a fresh .venv's set-up, under a pip configuration of `config` (None: no
    configuration file at all, as on an ordinary machine)."""
    conf = tmp_path / "pip.conf"
    if config is not None:
        conf.write_text(config)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    environ |= {"PIP_CONFIG_FILE": str(conf) if config is not None else os.devnull, **(env or {})}
    venv = tmp_path / "venv"
    argv = ["make", "-n", "-B", f"VENV={venv}", f"PYTHON={sys.executable}", *make_args, f"{venv}/.zerotrain-installed"]
    out = subprocess.run(argv, cwd=ROOT, env=environ, capture_output=True, text=True, check=True).stdout
    return [shlex.split(line) for line in out.splitlines() if " install " in line]


def indexes(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == "--extra-index-url"]


def test_an_ordinary_machine_gets_torch_from_the_cpu_index_and_everything_else_from_pypi(tmp_path: Path) -> None:
    torch_step, project_step = pip_lines(tmp_path, None)
    assert torch_step[-1] == "torch" and "--no-deps" in torch_step and "constraints.txt" in torch_step
    assert indexes(torch_step) == [CPU]
    assert indexes(project_step) == [] and project_step[-1] == ".[dev]"
    assert "--index-url" not in torch_step + project_step  # PyPI stays the index: nothing is cut off


def test_the_configured_extra_indexes_are_passed_along(tmp_path: Path) -> None:
    config = "[global]\nextra-index-url = file:///srv/a/simple file:///srv/b/simple\n"
    torch_step, project_step = pip_lines(tmp_path, config, env={"PIP_EXTRA_INDEX_URL": "https://mirror.example/simple"})
    configured = ["file:///srv/a/simple", "file:///srv/b/simple", "https://mirror.example/simple"]
    assert sorted(indexes(torch_step)[:-1]) == configured and indexes(torch_step)[-1] == CPU
    assert indexes(project_step) == []  # no command-line index: pip reads its configuration itself


@pytest.mark.parametrize(
    ("setting", "expected"),
    [("https://download.pytorch.org/whl/cu128", ["https://download.pytorch.org/whl/cu128"]), ("", [])],
)
def test_torch_index_url_chooses_the_build(tmp_path: Path, setting: str, expected: list[str]) -> None:
    torch_step, _ = pip_lines(tmp_path, None, f"TORCH_INDEX_URL={setting}")
    assert indexes(torch_step) == expected
