"""The whole-peak plan: closed-form cases exactly, the transformer formula against the example model, every caller
(plan -f, validate, admission) with one number, `--measure`, and bad shapes refused with the field named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from zerotrain.cli import main
from zerotrain.plan.inputs import memory_plan, peak_input
from zerotrain.plan.peak import PeakInput, peak_plan, step_bytes
from zerotrain.plan.transformer import activation_peak, parameters
from zerotrain.spec import ModelShape, ZeroTrainingJobSpec
from zerotrain.zero_config import Stage

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
SHAPE = {"layers": 4, "hidden": 128, "heads": 4, "sequenceLength": 128, "vocabulary": 256, "microBatchSize": 8}


def _input(**kw: Any) -> PeakInput:
    base: dict[str, Any] = {
        "stage": Stage.PARAMETERS,
        "world_size": 2,
        "blocks": [64, 64, 64],
        "root": 32,
        "compute_bytes": 4.0,
        "gradient_bytes": 4.0,
        "reduce_bytes": 4.0,
        "state_bytes": 8.0,
        "reduce_bucket_elements": 10**6,
        "allgather_bucket_elements": 10**6,
        "activations": 1000,
        "activations_in_block": 600,
    }
    return PeakInput.model_validate({**base, **kw})


def test_stage_3_peak_in_closed_form() -> None:
    got = peak_plan(_input())
    # 224 padded elements: w = g = 4·224/2, K = 8·112. The pool: buckets of (N+1) columns of the largest shard (32),
    # two of them, fp32. Arenas: two blocks and the root. Backward: when it starts the root and the prefetched last
    # block (96 elements) beside every saved activation; inside a block the running one too (160) beside 600.
    assert (got.parameters, got.gradients, got.optimizer) == (448, 448, 896)
    assert got.communication_buffers == 2 * 3 * 32 * 4
    assert got.gradient_arenas == (2 * 64 + 32) * 4
    assert got.gathered_parameters == 160 * 4
    assert got.optimizer_step == 3 * 4 * 32  # single-tensor AdamW: three temporaries of the largest view
    assert got.peak == 448 + 448 + 896 + 768 + 640 + max(96 * 4 + 1000, 160 * 4 + 600)
    assert got.peak_phase == "backward"


def test_stage_0_has_no_buffers_in_fp32_and_the_step_can_set_the_peak() -> None:
    got = peak_plan(_input(stage=Stage.DATA_PARALLEL, activations=0, activations_in_block=0))
    assert got.communication_buffers == got.gradient_arenas == got.gathered_parameters == 0  # in-place all-reduce
    assert got.optimizer_step == 3 * 4 * 64 and got.peak_phase == "step"
    assert got.peak == 4 * 224 + 4 * 224 + 8 * 224 + got.optimizer_step
    # On CUDA torch's AdamW steps every view at once: one temporary per element.
    assert step_bytes(_input(stage=Stage.DATA_PARALLEL, foreach_step=True)) == 4 * 224


def test_mixed_precision_stage_1_stages_fp32_gradients_for_the_step() -> None:
    got = peak_plan(_input(stage=Stage.OPTIMIZER_STATES, compute_bytes=2.0, gradient_bytes=2.0, state_bytes=12.0))
    assert got.fp32_gradients == 4 * 112  # this rank's fp32 shard, from its reduction to the step
    accumulating = peak_plan(
        _input(stage=Stage.OPTIMIZER_STATES, compute_bytes=2.0, gradient_bytes=2.0, accumulation_steps=4)
    )
    assert accumulating.fp32_gradients == 4 * 112 + 4 * 224  # and the full-size fp32 accumulator


def _gpt(dtype: torch.dtype) -> tuple[int, int]:
    """The example GPT of SHAPE: its parameter count, and a micro-batch's activations as `--measure` counts them."""
    from zerotrain.commands.measure import measure_activations

    spec = ZeroTrainingJobSpec.model_validate(
        {
            "image": "local",
            "entrypoint": "zerotrain.runtime.examples.gpt:build",
            "entrypointArgs": {"seq_len": 128, "batch_size": 16, "d_model": 128, "n_layers": 4, "n_heads": 4},
            "replicas": 2,
            "zero": {"precision": "fp32" if dtype == torch.float32 else "bf16"},
        }
    )
    from zerotrain.runtime.examples.gpt import GPT

    model = GPT(seq_len=128, d_model=128, n_layers=4, n_heads=4)
    return sum(p.numel() for p in model.parameters()), measure_activations(spec)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_formula_is_the_example_gpt(dtype: torch.dtype) -> None:
    shape = ModelShape.model_validate(SHAPE)
    psi, measured = _gpt(dtype)
    assert parameters(shape) == psi == 842_496
    at_head, in_block, _ = activation_peak(shape, 4.0 if dtype == torch.float32 else 2.0, False, False)
    assert in_block < at_head and abs(at_head - measured) <= 0.001 * measured, (measured, at_head)


def _job(tmp_path: Path, spec: dict[str, Any], name: str = "p") -> Path:
    path = tmp_path / f"{name}.yaml"
    doc = {
        "apiVersion": "zerotrain.dev/v1alpha1",
        "kind": "ZeroTrainingJob",
        "metadata": {"name": name},
        "spec": {"image": "local", "entrypoint": "zerotrain.runtime.examples.gpt:build", **spec},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


MATRIX = [
    (stage, precision, reduce, optimizer, replicas)
    for stage in range(4)
    for precision, reduce in (("fp32", "fp32"), ("bf16", "fp32"), ("bf16", "bf16"), ("fp16", "fp32"))
    for optimizer in ({"name": "adamw"}, {"name": "sgd", "momentum": 0.9}, {"name": "sgd"})
    for replicas in (1, 2, 4)
]


def test_every_caller_gets_the_same_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from zerotrain.operator.controller.admission import admit

    for i, (stage, precision, reduce, optimizer, replicas) in enumerate(MATRIX):
        spec = {
            "replicas": replicas,
            "resources": {"gpu": 1, "gpuMemory": "80Gi"},
            "zero": {"stage": stage, "precision": precision, "reduceDtype": reduce},
            "training": {"optimizer": optimizer},
            "model": {"shape": SHAPE},
            # The GPT's batch_size is the global micro-batch: microBatchSize rows on each rank, as the shape says.
            "entrypointArgs": {"batch_size": SHAPE["microBatchSize"] * replicas},
        }
        path = _job(tmp_path, spec, f"m{i}")
        assert main(["plan", "-f", str(path), "--output", "json"]) == 0
        planned = json.loads(capsys.readouterr().out)["stages"][stage]
        raw = yaml.safe_load(path.read_text())["spec"]
        verdict = admit(raw, f"m{i}")
        assert verdict.admitted and verdict.plan is not None, verdict.message
        own = memory_plan(ZeroTrainingJobSpec.model_validate(raw)).stages[stage]
        admitted = verdict.plan.stages[stage]
        assert planned["peak"]["peak"] == admitted.peak.peak == own.peak.peak  # type: ignore[union-attr]
        assert planned["modelStateBytes"] == admitted.model_state_bytes == own.model_state_bytes
        assert main(["validate", str(path)]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert f"{admitted.peak.peak / 1e6:.1f} MB at its peak" in out, out  # type: ignore[union-attr]


def test_the_peak_decides_admission_and_names_the_stage_that_fits(tmp_path: Path) -> None:
    from zerotrain.operator.controller.admission import admit

    # The quickstart's GPT at 64 sequences per rank: activations far beyond its 13 MB of model states.
    shape = {**SHAPE, "microBatchSize": 64}
    spec = {"image": "x", "entrypoint": "m:build", "replicas": 2, "resources": {"gpu": 1, "gpuMemory": "300M"}}
    spec_ckpt = {**spec, "zero": {"stage": 0, "activationCheckpointing": True}, "model": {"shape": shape}}
    assert admit(spec_ckpt, "fits").admitted
    refused = admit({**spec, "zero": {"stage": 0}, "model": {"shape": shape}}, "big")
    assert not refused.admitted and "at its peak per GPU" in refused.message, refused.message
    p = peak_input(ZeroTrainingJobSpec.model_validate({**spec, "zero": {"stage": 0}, "model": {"shape": shape}}))
    assert p is not None and p.foreach_step  # a GPU job: torch's foreach step


def test_measure_prints_the_figure_for_the_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(QUICKSTART), "--measure", "--output", "json"]) == 0
    measured = json.loads(capsys.readouterr().out)["activationBytes"]
    shape = ModelShape.model_validate(SHAPE)  # the quickstart's model, 8 sequences per rank
    at_head, _, _ = activation_peak(shape, 4.0, False, False)
    assert abs(measured - at_head) <= 0.001 * at_head


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ({"shape": {**SHAPE, "heads": 5}}, "must divide shape.hidden; use a divisor of hidden (got heads=5,"),
        ({"parameters": 7_000_000, "shape": SHAPE}, "has 842,496 parameters, but spec.model.parameters is 7,000,000"),
        ({"activationBytes": -1}, "activationBytes"),
    ],
)
def test_bad_shapes_are_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: dict[str, Any], needle: str
) -> None:
    path = _job(tmp_path, {"model": model})
    assert main(["plan", "-f", str(path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert needle in err and len(err.splitlines()) <= 2, err
    assert main(["validate", str(path)]) == 2
    assert needle in " ".join(capsys.readouterr().err.split())


MEMORY_DOC = Path(__file__).resolve().parents[2] / "docs" / "memory.md"


def test_the_figures_docs_memory_quotes_are_the_quickstarts_plan() -> None:
    """The figures docs/memory.md's prose quotes for the quickstart. (Its `$ zerotrain ...` commands, and what they
    print, are run by tests/docs/test_doc_commands.py.)"""
    spec = ZeroTrainingJobSpec.model_validate(yaml.safe_load(QUICKSTART.read_text())["spec"])
    peak = memory_plan(spec).stages[3].peak
    assert peak is not None
    text = " ".join(MEMORY_DOC.read_text().split())
    quoted = f"{peak.peak / 1e6:.1f} MB per rank at stage 3, of which {peak.model_states / 1e6:.1f} MB are model states"
    assert quoted in text and f"{peak.activations / 1e6:.1f} MB activations" in text


DATA_DEPENDENT = """
import torch
from torch import nn
from zerotrain.runtime.job.task import TrainingTask


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return y if y.sum().item() > 0 else -y  # data-dependent control flow: no fake tensor can say which


def build(rank, world_size):
    def batches():
        while True:
            yield torch.randn(4, 8)

    return TrainingTask(model=nn.Sequential(Gate()), loss=lambda out, x: out.square().mean(), batches=batches())
"""


def test_measure_names_what_fake_tensors_cannot_run_and_measures_it_for_real_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "gated.py").write_text(DATA_DEPENDENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _job(tmp_path, {"entrypoint": "gated:build"})
    assert main(["plan", "-f", str(path), "--measure"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "gated:build: the model cannot run under torch's fake tensors" in err and "--measure-real" in err, err
    assert main(["plan", "-f", str(path), "--measure-real", "--output", "json"]) == 0
    # fc's input is the batch (not counted: made before the meter), its output 4x8 fp32 and the loss's square.
    measured = json.loads(capsys.readouterr().out)["activationBytes"]
    assert 4 * 8 * 4 <= measured <= 8 * 4 * 8 * 4, measured


def test_arenas_serve_units_up_to_the_reduce_bucket_and_the_rest_are_autograds() -> None:
    # Blocks of 64 elements over a 40-element bucket: their gradients are autograd's, alive only in backward; the
    # root (32) still has its arena. What is kept for the run is bounded by the bucket, not by the model.
    got = peak_plan(_input(stage=Stage.GRADIENTS, reduce_bucket_elements=40))
    assert got.gradient_arenas == 32 * 4 and got.unsharded_gradients == 2 * 64 * 4
    everything = peak_plan(_input(stage=Stage.GRADIENTS))
    assert everything.gradient_arenas == (2 * 64 + 32) * 4 and everything.unsharded_gradients == 0
    off = peak_plan(_input(stage=Stage.GRADIENTS, contiguous_gradients=False))
    assert off.gradient_arenas == 0 and off.unsharded_gradients == (2 * 64 + 32) * 4
