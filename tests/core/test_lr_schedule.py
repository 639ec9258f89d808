"""spec.training.lrSchedule: the rate of every step against transformers' own schedules, and its bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from zerotrain.errors import UserError
from zerotrain.lr_schedule import learning_rate, lr_factor
from zerotrain.manifest import parse_spec
from zerotrain.spec import LrSchedule, TrainingSpec

SPEC: dict[str, Any] = {"image": "x", "entrypoint": "zerotrain.runtime.examples.gpt:build"}


def transformers_factors(decay: str, warmup: int, total: int, min_ratio: float) -> list[float]:
    """What transformers' LambdaLR multiplies lr by after t = 1 … total scheduler steps."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    if decay == "cosine":
        made = transformers.get_cosine_with_min_lr_schedule_with_warmup(opt, warmup, total, min_lr_rate=min_ratio)
    elif decay == "linear":
        made = transformers.get_linear_schedule_with_warmup(opt, warmup, total)
    else:
        made = transformers.get_constant_schedule_with_warmup(opt, warmup)
    return [made.lr_lambdas[0](t) for t in range(1, total + 1)]


@pytest.mark.parametrize(
    ("decay", "warmup", "min_ratio"),
    [("cosine", 3, 0.1), ("cosine", 0, 0.0), ("linear", 4, 0.0), ("constant", 5, 0.0)],
)
def test_step_t_trains_at_the_factor_transformers_reaches_after_t_steps(
    decay: str, warmup: int, min_ratio: float
) -> None:
    schedule = LrSchedule.model_validate({"warmupSteps": warmup, "decay": decay, "minLrRatio": min_ratio})
    ours = [lr_factor(schedule, t, 20) for t in range(1, 21)]
    assert ours == pytest.approx(transformers_factors(decay, warmup, 20, min_ratio), abs=1e-12)


def test_the_warm_up_starts_above_zero_and_the_decay_stays_at_its_bottom() -> None:
    schedule = LrSchedule.model_validate({"warmupSteps": 4, "decaySteps": 4, "minLrRatio": 0.1})
    factors = [lr_factor(schedule, t, 20) for t in range(1, 21)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]  # the first step trains (transformers' first is at 0)
    assert factors[7:] == pytest.approx([0.1] * 13)  # after decaySteps, minLrRatio × lr to the end
    training = TrainingSpec.model_validate({"steps": 20, "optimizer": {"lr": 0.5}})
    assert [learning_rate(training, t) for t in (1, 20)] == [0.5, 0.5]  # no schedule: optimizer.lr


@pytest.mark.parametrize(
    ("training", "needles"),
    [
        ({"steps": 10, "lrSchedule": {"warmupSteps": 20}}, ["warmupSteps is beyond training.steps", "=20", "=10"]),
        ({"lrSchedule": {"minLrRatio": 1.5}}, ["spec.training.lrSchedule.minLrRatio", "1.5"]),
        ({"lrSchedule": {"decay": "step"}}, ["spec.training.lrSchedule.decay", "'step'", "cosine"]),
        ({"evaluation": {"everySteps": 0}}, ["spec.training.evaluation.everySteps", "got 0"]),
    ],
)
def test_bad_schedule_and_evaluation_are_refused_naming_the_field(training: dict[str, Any], needles: list[str]) -> None:
    with pytest.raises(UserError) as refused:
        parse_spec({**SPEC, "training": training})
    said = " ".join(str(refused.value).split())
    assert "\n" not in str(refused.value).strip()
    for needle in needles:
        assert needle in said, said


def test_a_steps_override_inside_the_warm_up_is_refused_before_any_rank_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerotrain.cli import main

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "llama-tiny" / "job.yaml").read_text())
    doc["spec"]["entrypointArgs"] = {"config": {"model_type": "llama"}}  # its schedule, not its files
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    logs = tmp_path / "logs"
    assert main(["run", str(manifest), "--steps", "3", "--log-dir", str(logs)]) == 2
    said = capsys.readouterr().err
    assert "--steps: got 3, fewer than spec.training.lrSchedule.warmupSteps (30)" in " ".join(said.split())
    assert not logs.exists()  # nothing started
