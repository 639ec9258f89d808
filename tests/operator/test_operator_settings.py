"""Operator settings from env and CLI flags, and the errors bad ones give."""

from __future__ import annotations

import pytest

from zerotrain.cli import build_parser
from zerotrain.errors import UserError
from zerotrain.operator.settings import OperatorSettings


def test_defaults_are_the_documented_ports() -> None:
    s = OperatorSettings.from_env({})
    assert (s.health_port, s.metrics_port, s.namespaces, s.gpu_memory) == (8080, 9090, [], None)


def test_env_namespaces_are_comma_separated_and_flags_win() -> None:
    env = {"ZEROTRAIN_NAMESPACES": "a, b,,c", "ZEROTRAIN_GPU_MEMORY": "80Gi", "ZEROTRAIN_RESYNC_SECONDS": "5"}
    s = OperatorSettings.from_env(env)
    assert (s.namespaces, s.gpu_memory, s.resync_seconds) == (["a", "b", "c"], "80Gi", 5.0)
    assert OperatorSettings.from_env(env, namespaces=["x"]).namespaces == ["x"]


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"ZEROTRAIN_HEALTH_PORT": "0"}, "ZEROTRAIN_HEALTH_PORT"),
        ({"ZEROTRAIN_GPU_MEMORY": "lots"}, "ZEROTRAIN_GPU_MEMORY"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(UserError) as e:
        OperatorSettings.from_env(env)
    assert names in str(e.value) and "got" in str(e.value)


def test_cli_flags() -> None:
    args = build_parser().parse_args(["operator", "-n", "a", "--namespace", "b", "--metrics-port", "0"])
    assert args.namespaces == ["a", "b"] and args.metrics_port == 0 and args.health_port is None
