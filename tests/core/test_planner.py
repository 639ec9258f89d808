"""The ZeRO memory planner: the worked example, recommendations and refused input."""

from __future__ import annotations

import json

import pytest

from zerotrain.cli import main
from zerotrain.plan.model_states import PlanInput, Stage, min_data_parallel, plan

GB = 1e9


def test_worked_example_matches_the_paper() -> None:
    # Ψ = 7.5B, N = 64, K = 12: the ZeRO paper's Figure 1 (and the seed articles).
    result = plan(PlanInput(parameters=int(7.5e9), data_parallel=64))
    got = [round(s.model_state_bytes / GB, 1) for s in result.stages]
    assert got == [120.0, 31.4, 16.6, 1.9]
    assert [s.comm_elements_per_step for s in result.stages] == [int(15e9)] * 3 + [int(22.5e9)]
    assert result.stages[3].comm_elements_with_recompute == int(30e9)
    assert result.recommended_stage is None and result.reason == ""


@pytest.mark.parametrize(
    ("device_gb", "expected"),
    [
        (200, Stage.DATA_PARALLEL),
        (40, Stage.OPTIMIZER_STATES),
        (32, Stage.GRADIENTS),
        (16, Stage.PARAMETERS),
        (2, None),
    ],
)
def test_recommends_lowest_stage_that_fits_with_headroom(device_gb: int, expected: Stage | None) -> None:
    result = plan(PlanInput(parameters=int(7.5e9), data_parallel=64, device_memory=int(device_gb * GB)))
    assert result.recommended_stage == expected
    usable = device_gb * GB * 0.8
    for sp in result.stages:
        assert sp.fits == (sp.model_state_bytes <= usable)
    if expected is None:
        # 1.875 GB of stage-3 states against 1.6 GB usable: 75 ranks would fit.
        assert "no stage fits" in result.reason and "N = 75" in result.reason
    else:
        assert f"stage {expected.value} is the lowest that fits" in result.reason


def test_min_data_parallel_is_the_smallest_n_that_fits() -> None:
    p = PlanInput(parameters=int(7.5e9), data_parallel=1)
    usable = 20 * GB
    for stage in Stage:
        n = min_data_parallel(stage, p, usable)
        if n is None:
            assert stage in (Stage.DATA_PARALLEL, Stage.OPTIMIZER_STATES)  # 120 GB / 30 GB are never sharded
            continue
        fits = plan(PlanInput(parameters=p.parameters, data_parallel=n)).stages[stage].model_state_bytes <= usable
        smaller = plan(PlanInput(parameters=p.parameters, data_parallel=max(1, n - 1))).stages[stage]
        assert fits and (n == 1 or smaller.model_state_bytes > usable)


def test_cli_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--params", "7.5B", "--dp", "64", "--device-memory", "32GB", "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["recommendedStage"] == 2
    assert [s["modelStateBytes"] for s in out["stages"]] == [
        120_000_000_000,
        31_406_250_000,
        16_640_625_000,
        1_875_000_000,
    ]


def test_cli_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--params", "7.5e9", "--dp", "64"]) == 0
    out = capsys.readouterr().out
    for figure in ("120.0 GB", "31.4 GB", "16.6 GB", "1.9 GB", "3Ψ"):
        assert figure in out


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--params", "-5", "--dp", "8"], "--params", "-5"),
        (["--params", "0", "--dp", "8"], "--params", "0"),
        (["--params", "7.5e9", "--dp", "0"], "--dp", "0"),
        (["--params", "lots", "--dp", "8"], "--params", "'lots'"),
        (["--params", "1e9", "--dp", "8", "--headroom", "1.5"], "--headroom", "1.5"),
    ],
)
def test_cli_refuses_bad_numbers_with_field_value_and_fix(
    argv: list[str], field: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    assert field in err and value in err
    assert any(word in err for word in ("pass", "write it like", "set it"))
