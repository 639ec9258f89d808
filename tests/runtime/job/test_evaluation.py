"""Evaluation and the learning-rate schedule in the loop, in-process at world size 1 with the real ZeroEngine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from zerotrain.lr_schedule import learning_rate
from zerotrain.runtime.job.rank_metrics import RankMetrics
from zerotrain.runtime.job.task import ConfigError
from zerotrain.runtime.job.train import RankContext, train
from zerotrain.runtime.zero.engine import ZeroEngine
from zerotrain.spec import ZeroTrainingJobSpec

GPT_ARGS = {"seq_len": 32, "batch_size": 4, "d_model": 32, "n_layers": 2, "n_heads": 4, "max_bytes": 60_000}


def job_spec(training: dict[str, Any], **args: Any) -> ZeroTrainingJobSpec:
    return ZeroTrainingJobSpec.model_validate(
        {
            "image": "x",
            "entrypoint": "zerotrain.runtime.examples.gpt:build",
            "entrypointArgs": {**GPT_ARGS, **args},
            "zero": {"stage": 3},
            "training": {"steps": 5, "optimizer": {"lr": 0.003}, **training},
        }
    )


@pytest.fixture
def single_rank(single_rank: Path) -> Path:
    """The job tests' single rank (tests/runtime/job/conftest.py), on one thread."""
    torch.set_num_threads(1)
    return single_rank


def trained(spec: ZeroTrainingJobSpec, metrics: RankMetrics | None = None) -> tuple[Any, dict[str, torch.Tensor]]:
    engines: list[ZeroEngine] = []

    def factory(*args: Any, **kwargs: Any) -> ZeroEngine:
        engines.append(ZeroEngine(*args, **kwargs))
        return engines[-1]

    result = train(spec, RankContext(0, 1, 0), engine_factory=factory, metrics=metrics)
    return result, {k: v.clone() for k, v in engines[0].full_state_dict().items()}


def test_evaluation_leaves_the_parameters_and_losses_bit_identical(single_rank: Path) -> None:
    plain, plain_state = trained(job_spec({}, eval_bytes=8_000))
    metrics = RankMetrics("j", 0, 0, 1, 3, 5)
    evaluated, state = trained(job_spec({"evaluation": {"everySteps": 2, "batches": 3}}, eval_bytes=8_000), metrics)
    assert evaluated.losses == plain.losses
    assert state.keys() == plain_state.keys()
    assert all(torch.equal(state[k], plain_state[k]) for k in state)
    assert [e.step for e in evaluated.evaluations] == [2, 4, 5]  # every 2 steps, and after the last
    assert all(e.batches == 3 and e.loss > 0 for e in evaluated.evaluations)
    assert metrics.snapshot.eval_loss == evaluated.evaluations[-1].loss and metrics.snapshot.eval_step == 5
    records = [json.loads(line) for line in (single_rank / "progress.jsonl").read_text().splitlines()]
    assert [r["eval_step"] for r in records if "eval_loss" in r] == [2, 4, 5]
    # The bar's last figure is the summary's: the run's throughput so far, evaluation left out of both.
    summary = json.loads((single_rank / "summary.json").read_text())
    last = [r for r in records if "step" in r][-1]
    assert last["throughput"] == summary["throughput"]


def test_the_evaluation_loss_is_the_plain_models_mean_over_the_held_out_batches(single_rank: Path) -> None:
    from zerotrain.runtime.examples.gpt import build, model_inputs, next_byte_loss

    training = {"steps": 1, "evaluation": {"everySteps": 1, "batches": 2}, "optimizer": {"lr": 1e-9}}
    spec = job_spec(training, eval_bytes=8_000)
    result, state = trained(spec, None)
    torch.manual_seed(0)
    task = build(0, 1, **GPT_ARGS, eval_bytes=8_000)
    task.model.load_state_dict(state)
    task.model.eval()
    assert task.eval_batches is not None
    with torch.no_grad():
        losses = [next_byte_loss(task.model(model_inputs(b)), b) for b in list(task.eval_batches())[:2]]
    assert result.evaluations[0].loss == pytest.approx(float(sum(losses) / 2), rel=1e-6)


def test_every_step_trains_at_the_schedules_rate(single_rank: Path) -> None:
    schedule = {"warmupSteps": 2, "decay": "linear", "minLrRatio": 0.5}
    spec = job_spec({"steps": 5, "lrSchedule": schedule})
    result, _ = trained(spec)
    assert result.learning_rates == [learning_rate(spec.training, t) for t in range(1, 6)]
    assert result.learning_rates == pytest.approx([0.0015, 0.003, 0.0025, 0.002, 0.0015])
    records = [json.loads(line) for line in (single_rank / "progress.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in records if "lr" in r] == result.learning_rates


def test_evaluation_without_evaluation_data_is_refused_before_a_step(single_rank: Path) -> None:
    with pytest.raises(ConfigError, match=r"^spec.training.evaluation: set, but .* without eval_batches"):
        train(job_spec({"evaluation": {"everySteps": 1}}), RankContext(0, 1, 0))
    assert not (single_rank / "summary.json").exists()


def test_more_evaluation_batches_than_the_data_holds_is_refused_naming_the_field(single_rank: Path) -> None:
    with pytest.raises(ConfigError, match=r"evaluation.batches: got 50, .* only 7 micro-batches per rank"):
        train(job_spec({"evaluation": {"everySteps": 1, "batches": 50}}, eval_bytes=1_000), RankContext(0, 1, 0))
