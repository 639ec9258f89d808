"""The entry-point contract: `module:function` is imported, its arguments checked, its result checked."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from zerotrain.runtime.job.task import ConfigError, TrainingTask, build_task, load_entrypoint

MODULE = """
import torch
from zerotrain.runtime.job.task import TrainingTask

def good(rank, world_size, width=4):
    model = torch.nn.Linear(width, 1)
    return TrainingTask(model=model, loss=lambda out, b: out.sum(), batches=iter([torch.ones(1, width)]))

def not_a_task(rank, world_size):
    return {"model": None}

def empty(rank, world_size):
    return TrainingTask(model=torch.nn.ReLU(), loss=lambda o, b: o.sum(), batches=iter([]))

value = 3
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "zt_user_entry.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "zt_user_entry"
    sys.modules.pop("zt_user_entry", None)


def test_builds_the_task_with_rank_world_size_and_args(user_module: str) -> None:
    task = build_task(f"{user_module}:good", rank=1, world_size=2, args={"width": 3})
    assert isinstance(task, TrainingTask)
    assert isinstance(task.model, torch.nn.Linear) and task.model.in_features == 3


def test_missing_module_names_field_value_and_fix() -> None:
    with pytest.raises(ConfigError) as e:
        load_entrypoint("no_such_pkg.train:build")
    msg = str(e.value)
    assert "spec.entrypoint" in msg and "'no_such_pkg.train:build'" in msg and "install it" in msg


def test_missing_function_lists_the_module_functions(user_module: str) -> None:
    with pytest.raises(ConfigError, match=r"has no attribute 'biuld'.*use one of its functions: .*good"):
        load_entrypoint(f"{user_module}:biuld")


def test_attribute_that_is_not_callable(user_module: str) -> None:
    with pytest.raises(ConfigError, match=r"'value' is not callable"):
        load_entrypoint(f"{user_module}:value")


def test_unknown_entrypoint_args_are_refused_before_the_call(user_module: str) -> None:
    with pytest.raises(ConfigError, match=r"spec\.entrypointArgs: got \{'depth': 2\}.*does not accept"):
        build_task(f"{user_module}:good", rank=0, world_size=1, args={"depth": 2})


def test_result_must_be_a_training_task(user_module: str) -> None:
    with pytest.raises(ConfigError, match=r"returned dict, not a TrainingTask"):
        build_task(f"{user_module}:not_a_task", rank=0, world_size=1, args={})


def test_model_without_parameters_is_refused(user_module: str) -> None:
    with pytest.raises(ConfigError, match=r"model with no parameters"):
        build_task(f"{user_module}:empty", rank=0, world_size=1, args={})


def test_a_declared_parameter_count_for_another_model_is_refused_naming_both() -> None:
    from torch import nn

    from zerotrain.runtime.job.task import ConfigError, check_declared_parameters

    model = nn.Linear(100, 10)  # 1,010 parameters
    check_declared_parameters(model, None)
    check_declared_parameters(model, 1_005)  # rounded: within 1%
    with pytest.raises(ConfigError) as e:
        check_declared_parameters(model, 2_000)
    message = str(e.value)
    assert message.startswith("spec.model.parameters: got 2,000") and "has 1,010" in message, message
    assert "set spec.model.parameters: 1010" in message
