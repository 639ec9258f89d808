"""The suite's time budget (tests/budget.py): one stated slowdown scales pytest-timeout's limit per test and every
wait the tests make."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from budget import ENV, budget

HERE = Path(__file__).resolve().parent


def _limit(request: pytest.FixtureRequest) -> float:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None
    return float(marker.args[0])


def test_the_default_limit_per_test_is_scaled(request: pytest.FixtureRequest) -> None:
    assert _limit(request) == budget(float(request.config.getini("timeout")))


@pytest.mark.timeout(7)
def test_a_limit_a_test_states_is_scaled_too(request: pytest.FixtureRequest) -> None:
    assert _limit(request) == budget(7)


def _scaled(value: str) -> subprocess.CompletedProcess[str]:
    code = "import budget; print(budget.budget(10))"
    env = {**os.environ, ENV: value, "PYTHONPATH": str(HERE)}
    return subprocess.run([sys.executable, "-c", code], cwd=HERE, env=env, capture_output=True, text=True, check=False)


def test_the_slowdown_is_read_from_the_environment() -> None:
    assert _scaled("2.5").stdout.strip() == "25.0"


@pytest.mark.parametrize("value", ["fast", "0", "-1"])
def test_a_slowdown_that_is_not_a_positive_number_stops_the_run_naming_it(value: str) -> None:
    ran = _scaled(value)
    assert ran.returncode != 0 and f"{ENV}='{value}': not a positive number" in ran.stderr
