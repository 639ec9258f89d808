"""`zerotrain validate` imports the entry point, binds its arguments and builds its model on the meta device, so
what every rank would refuse is refused first, in one line; `zerotrain run` does the same before any rank starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from zerotrain.cli import main

ROOT = Path(__file__).resolve().parents[2]
ENTRY_ARGS = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())["spec"]["entrypointArgs"]
SHAPE = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())["spec"]["model"]["shape"]


def job(tmp_path: Path, **spec: Any) -> str:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"][key], **value} if key in ("zero", "training") else value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def said(capsys: pytest.CaptureFixture[str]) -> str:
    out = capsys.readouterr()
    return " ".join((out.out + out.err).split())


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        ({"entrypoint": "no_such_module:build"}, ["spec.entrypoint", "'no_such_module' cannot be imported"]),
        ({"entrypoint": "zerotrain.runtime.examples.gpt:biuld"}, ["has no attribute 'biuld'", "build"]),
        ({"entrypointArgs": {"layers": 4}}, ["spec.entrypointArgs: got {'layers': 4}", "does not accept them"]),
        ({"model": {"parameters": 900_000}}, ["spec.model.parameters: got 900,000", "842,496", "set spec.model"]),
        ({"zero": {"unitModules": ["Blocks"]}}, ["zero.unitModules[0]: got 'Blocks'", "'Block'"]),
        ({"entrypointArgs": {"d_model": 130}}, ["spec.entrypointArgs.d_model: got 130", "n_heads"]),
        (
            {"training": {"evaluation": {"everySteps": 100, "batches": 2}}},
            ["spec.training.evaluation: set, but", "without eval_batches", "eval_bytes"],
        ),
        (  # 20 kB held out: 20000 // (16 × 129) = 9 global micro-batches
            {
                "entrypointArgs": {**ENTRY_ARGS, "eval_bytes": 20_000},
                "training": {"evaluation": {"everySteps": 100, "batches": 50}},
            },
            ["spec.training.evaluation.batches: got 50", "holds only 9 micro-batches per rank", "at most 9"],
        ),
        (
            {"model": {"parameters": 842496, "shape": {**SHAPE, "microBatchSize": 16}}},
            [
                "spec.model.shape.microBatchSize: got 16, but rank 0's first micro-batch has 8",
                "[8, 128]",
                "set microBatchSize: 8",
            ],
        ),
    ],
)
def test_validate_refuses_what_every_rank_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any], needles: list[str]
) -> None:
    assert main(["validate", job(tmp_path, **spec)]) == 2
    text = said(capsys)
    for needle in needles:
        assert needle in text, text


def test_a_good_entry_point_is_built_on_the_meta_device_and_no_import_says_it_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(ROOT / "examples" / "quickstart.yaml")]) == 0
    assert "builds a model of 842,496 parameters, 4 unit(s) of Block (built on the meta device)" in said(capsys)
    broken = job(tmp_path, entrypoint="no_such_module:build")
    assert main(["validate", broken, "--no-import"]) == 0
    assert "not imported (--no-import): its arguments, Ψ and units are unchecked" in said(capsys)


def test_run_refuses_a_wrong_parameter_count_or_missing_evaluation_data_before_any_rank_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    assert main(["run", job(tmp_path, model={"parameters": 900_000}), "--log-dir", str(logs)]) == 2
    text = said(capsys)
    assert text.count("spec.model.parameters: got 900,000") == 1 and "rank" not in text
    assert not logs.exists() or not any(logs.iterdir())
    no_data = job(tmp_path, training={"evaluation": {"everySteps": 100, "batches": 2}})
    assert main(["run", no_data, "--log-dir", str(logs)]) == 2
    text = said(capsys)
    assert text.count("spec.training.evaluation: set, but") == 1 and "rank 0" not in text
    assert not logs.exists() or not any(logs.iterdir())


@pytest.mark.slow
def test_unequal_rows_per_rank_are_said_in_one_line_by_validate_and_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    custom = ROOT / "examples" / "custom" / "job.yaml"
    doc = yaml.safe_load(custom.read_text())
    doc["spec"]["replicas"] = 3  # 64 rows chunked: 22, 22 and 20
    (tmp_path / "regression.py").write_text((custom.parent / "regression.py").read_text())  # found beside the job
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    assert main(["validate", str(tmp_path / "job.yaml")]) == 0
    assert "warning: rank 0 draws micro-batches of 22 rows and rank 2 of 20" in said(capsys)
    logs = tmp_path / "logs"
    assert main(["run", str(custom), "--nproc", "4", "--steps", "1", "--no-metrics", "--log-dir", str(logs)]) == 0
    assert "warning" not in said(capsys)  # 64 rows split evenly over 4


def test_rank_0s_first_micro_batch_is_drawn_once_for_every_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each rank's second micro-batch is half its first: a check drawing rank 0's batches again would compare its
    # second against rank 1's first and warn of unequal rows that no step ever has.
    (tmp_path / "halved.py").write_text(
        "import itertools\n"
        "from zerotrain.runtime.examples.gpt import build as gpt\n"
        "def half(b):\n"
        "    return b[: b.shape[0] // 2] if hasattr(b, 'shape') else type(b)(half(x) for x in b)\n"
        "def build(rank, world_size, **kw):\n"
        "    task = gpt(rank, world_size, **kw)\n"
        "    first = next(task.batches)\n"
        "    task.batches = itertools.chain([first, half(first)], task.batches)\n"
        "    return task\n"
    )
    path = job(tmp_path, entrypoint="halved:build")
    assert main(["validate", path]) == 0
    text = said(capsys)
    assert "builds a model of 842,496 parameters" in text and "warning" not in text, text


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({}, True),  # InPlace by default, and no claim: the restart recreates every pod
        ({"checkpoint": {"claimName": "ckpt", "intervalSteps": 10}}, False),
        ({"failurePolicy": {"restartStrategy": "Recreate"}}, False),
    ],
)
def test_validate_says_once_what_a_restart_does_where_in_place_cannot_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any], says: bool
) -> None:
    assert main(["validate", job(tmp_path, **spec)]) == 0
    out = said(capsys)
    line = "spec.failurePolicy.restartStrategy: InPlace (the default), but spec.checkpoint.claimName is not set"
    assert out.count(line) == int(says), out
    if says:
        assert "a restart recreates every pod instead" in out and "set checkpoint.claimName" in out
