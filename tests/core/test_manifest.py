"""Manifest validation: one clear message naming the field, the value and the fix; exit status 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from zerotrain.cli import main
from zerotrain.errors import UserError
from zerotrain.manifest import parse_spec

GOOD: dict[str, Any] = {
    "apiVersion": "zerotrain.dev/v1alpha1",
    "kind": "ZeroTrainingJob",
    "metadata": {"name": "tiny"},
    "spec": {
        "image": "ghcr.io/zerotrain/runtime:0.1.0",
        "entrypoint": "zerotrain.runtime.examples.gpt:build",
        "replicas": 2,
        "zero": {"stage": 3, "unitModules": ["Block"]},
    },
}


def write(tmp_path: Path, spec_patch: dict[str, Any]) -> Path:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    doc["spec"].update(spec_patch)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_valid_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(write(tmp_path, {}))]) == 0
    assert "is valid: stage 3, 2 pod(s) × 1 rank(s) = 2 ranks" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("patch", "needles"),
    [
        ({"replicaz": 2}, ["spec.replicaz", "unknown field", "did you mean 'replicas'"]),
        ({"zero": {"stage": 4}}, ["spec.zero.stage", "got 4", "0, 1, 2, 3 or 'auto'", "set it to one of those"]),
        ({"replicas": 0}, ["spec.replicas", "got 0", "set it to at least 1"]),
        ({"entrypoint": "not a thing"}, ["spec.entrypoint", "'not a thing'", "package.module:function"]),
        ({"resources": {"gpuMemory": "80Gi"}}, ["spec.resources", "gpuMemory is set but gpu is 0", "drop gpuMemory"]),
        ({"zero": {"precision": "fp8"}}, ["spec.zero.precision", "'fp8'", "'fp32', 'bf16' or 'fp16'"]),
    ],
)
def test_bad_manifest_is_refused_with_field_value_and_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], patch: dict[str, Any], needles: list[str]
) -> None:
    assert main(["validate", str(write(tmp_path, patch))]) == 2
    err = " ".join(capsys.readouterr().err.split())
    for needle in needles:
        assert needle in err, err


def test_missing_file_and_wrong_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read manifest" in capsys.readouterr().err
    other = tmp_path / "pod.yaml"
    other.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n")
    assert main(["validate", str(other)]) == 2
    assert "kind: no ZeroTrainingJob document (found kinds 'Pod')" in capsys.readouterr().err
    other.write_text(yaml.safe_dump({**GOOD, "kind": "ZeroTrainingJobs"}))
    assert main(["validate", str(other)]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "kind: got 'ZeroTrainingJobs'; did you mean 'ZeroTrainingJob'? set kind: ZeroTrainingJob" in said


def test_parse_spec_paths_start_at_spec() -> None:
    with pytest.raises(UserError, match=r"spec\.failurePolicy: .*both permanent and retryable"):
        parse_spec({**GOOD["spec"], "failurePolicy": {"permanentExitCodes": [2, 3], "retryableExitCodes": [3]}})


def test_plan_reads_the_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(
        tmp_path,
        {
            "replicas": 8,
            "nprocPerNode": 8,
            "resources": {"gpu": 8, "gpuMemory": "32G"},
            "model": {"parameters": 7_500_000_000},
            "zero": {"precision": "bf16"},
        },
    )
    assert main(["plan", "-f", str(path), "--output", "json"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    # The seed's 7.5B / 64-GPU example in bf16: K = 12 (fp32 master + Adam), stage 2 keeps 2Ψ of weights.
    assert out["dataParallel"] == 64 and out["recommendedStage"] == 2 and out["optimizerMultiplier"] == 12


def test_the_7b_fp32_job_gets_one_number_from_plan_and_admission(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # fp32 AdamW at stage 2 on 2 x 80Gi: 4Ψ of weights + (4 + 8)Ψ/2 of fp32 gradients and Adam state = 70 GB, what
    # the runtime holds (runtime/zero/memory.py applies the same planner.element_bytes).
    from zerotrain.operator.controller.admission import admit

    spec = {
        "replicas": 2,
        "resources": {"gpu": 1, "gpuMemory": "80Gi"},
        "model": {"parameters": 7_000_000_000},
        "zero": {"stage": 2},
    }
    assert main(["plan", "-f", str(write(tmp_path, spec)), "--output", "json"]) == 0
    planned = yaml.safe_load(capsys.readouterr().out)["stages"][2]["modelStateBytes"]
    verdict = admit({**GOOD["spec"], **spec}, "p7b")
    assert planned == verdict.plan.stages[2].model_state_bytes == 70_000_000_000  # type: ignore[union-attr]


def test_validate_runs_the_operators_admission(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from zerotrain.operator.controller.admission import admit

    spec = {"replicas": 2, "resources": {"gpu": 1}, "model": {"parameters": 7_000_000_000}, "zero": {"stage": 2}}
    path = write(tmp_path, spec)
    # Ψ of 7e9 is the plan's, not the built-in GPT's: the entry point is left unimported.
    assert main(["validate", str(path), "--no-import"]) == 0  # no GPU memory known: it says what is missing
    assert "no GPU memory to check it against: set resources.gpuMemory or pass --gpu-memory" in capsys.readouterr().out
    # With the operator's default GPU memory: refused as the operator refuses it, with its message.
    assert main(["validate", str(path), "--gpu-memory", "80Gi", "--no-import"]) == 2
    refused = admit({**GOOD["spec"], **spec}, "tiny", default_gpu_memory="80Gi")
    assert refused.message and refused.message in " ".join(capsys.readouterr().err.split())
    assert main(["validate", str(path), "--gpu-memory", "141Gi", "--no-import"]) == 0
    assert "70.0 GB of model states per GPU at stage 2" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("manifest", "flags", "needles"),
    [
        (
            "quickstart.yaml",
            ["--gpu-memory", "1MB"],
            ["--gpu-memory 1MB: not applied: this job's ranks train on the CPU"],
        ),
        (
            "quickstart.yaml",
            [],
            ["per rank at its peak at stage 3", "at its training peak at stage 3 per rank", "2Gi holds it"],
        ),
        ("custom/job.yaml", [], ["of model states (spec.model.shape adds the rest)", "no resources.memory set"]),
    ],
)
def test_the_memory_line_checks_cpu_ranks_against_their_share_and_names_what_is_missing(
    capsys: pytest.CaptureFixture[str], manifest: str, flags: list[str], needles: list[str]
) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples"
    assert main(["validate", str(examples / manifest), *flags]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "not checked" not in said
    for needle in needles:
        assert needle in said, said
