"""The start-up peak (construction and loading) beside the training peak: `plan -f`, `validate` and admission."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from zerotrain.cli import main
from zerotrain.manifest import parse_spec
from zerotrain.operator.controller.admission import admit
from zerotrain.plan.start_up import start_up_plan

ROOT = Path(__file__).resolve().parents[2]


def example(name: str) -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all((ROOT / "examples" / name).read_text()) if d["kind"] == "ZeroTrainingJob")


def test_a_gpu_rank_starts_with_its_slice_of_every_parameter_and_one_block() -> None:
    spec = parse_spec(example("gpu-7b.yaml")["spec"])
    plan = start_up_plan(spec)
    assert plan is not None and plan.largest_unit_known
    psi, block = 7057739776, 12 * 4096**2 + 13 * 4096
    assert plan.slices == pytest.approx(4 * psi / 16, rel=1e-6)
    assert plan.unit == 4 * block and plan.engine == 0  # the engine's states are on the GPU
    assert plan.per_pod == 8 * plan.per_rank and plan.whole_model == 4 * psi
    assert plan.per_rank < plan.whole_model / 10


def test_a_cpu_rank_also_holds_the_engine_it_builds_and_pretrained_reads_a_chunk() -> None:
    doc = example("quickstart.yaml")["spec"]
    plain = start_up_plan(parse_spec(doc))
    tuned = start_up_plan(parse_spec({**doc, "model": {**doc["model"], "pretrained": {"path": "/w"}}}))
    assert plain is not None and tuned is not None
    assert plain.engine > 0 and plain.unit == 2 * 4 * (12 * 128**2 + 13 * 128)
    assert tuned.per_rank - plain.per_rank == tuned.read_chunk == 16 << 20


def test_admission_refuses_a_pod_whose_memory_cannot_hold_its_ranks_start_up(tmp_path: Path) -> None:
    doc = example("gpu-7b.yaml")
    assert admit(doc["spec"], "gpt-7b").admitted
    doc["spec"]["resources"]["memory"] = "16Gi"
    verdict = admit(doc["spec"], "gpt-7b")
    assert not verdict.admitted
    said = " ".join(verdict.message.split())
    assert said.startswith("resources.memory: got '16Gi'; each rank needs 360.0 MB the process itself")
    assert "+ 2.6 GB at start-up, with 20% headroom, more than its 2.1 GB share" in said
    # 8 ranks × (360 MB + 2.6 GB) / 0.8
    assert "set resources.memory to at least 27943Mi" in said
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 2
    doc["spec"]["resources"]["memory"] = "27943Mi"
    assert admit(doc["spec"], "gpt-7b").admitted


def test_plan_shows_the_start_up_beside_the_training_peak(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(ROOT / "examples" / "gpu-70b.yaml"), "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    start = out["startUp"]
    assert start["perPod"] == 8 * start["perRank"] and start["wholeModel"] == 4 * 70912000000
    assert main(["plan", "-f", str(ROOT / "examples" / "gpu-70b.yaml")]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "start-up (construction and loading): 7.7 GB of host memory per rank" in said
    assert "7.7 GB at start-up per rank, with 20% headroom; resources.memory of at least 76425Mi for 8" in said
    assert "resources.memory 128Gi holds it" in said
