"""spec.model.architecture: `zerotrain plan -f JOB --fill` writes it from config.json and keeps the rest of the file;
the operator plans and chooses `stage: auto` from it alone; validate, run, admission and the pods' launcher choose
one stage; a block that disagrees with the config, `stage: auto` without a block, and a family the plan does not
count are refused (or said) naming the fix."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml

from zerotrain.cli import main
from zerotrain.errors import ConfigError
from zerotrain.hf_config import architecture
from zerotrain.spec import ZeroTrainingJobSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-tiny"
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokens")
    sources = [str(p) for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:12]]
    argv = ["data", "prepare", *sources, "--tokenizer", str(EXAMPLE / "tokenizer.json"), "--out", str(out)]
    assert main([*argv, "--val-fraction", "0.5"]) == 0
    return out


def manifest(tmp_path: Path, data: Path, spec: dict[str, Any] | None = None, **args: Any) -> Path:
    """The llama-tiny example's manifest, its paths absolute, as its text (comments included) with `spec` merged."""
    text = (EXAMPLE / "job.yaml").read_text().split("\n  model:\n")[0] + "\n"  # the example's block left out
    text = text.replace("config: examples/llama-tiny", f"config: {EXAMPLE}")
    text = text.replace("runs/llama-tiny-data/train.bin", str(data / "train.bin"))
    text = text.replace("runs/llama-tiny-data/val.bin", str(data / "val.bin"))
    path = tmp_path / "job.yaml"
    if spec or args:
        doc = yaml.safe_load(text)
        doc["spec"]["entrypointArgs"].update(args)
        for key, value in (spec or {}).items():
            doc["spec"][key] = value if not isinstance(value, dict) else {**doc["spec"].get(key, {}), **value}
        text = yaml.safe_dump(doc, sort_keys=False)
    path.write_text(text)
    return path


def said(capsys: pytest.CaptureFixture[str]) -> str:
    out = capsys.readouterr()
    return " ".join((out.out + out.err).split())


def test_fill_writes_the_block_from_the_config_and_keeps_every_line_of_the_file(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = manifest(tmp_path, data)
    before = path.read_text()
    assert main(["plan", "-f", str(path), "--fill"]) == 0
    assert "wrote spec.model.architecture (llama, 4 layers, hidden 128, vocabulary 2048)" in said(capsys)
    after = path.read_text()
    assert after.startswith(before.rstrip("\n").rsplit("\n", 1)[0])  # comments, order and quoting kept
    block = yaml.safe_load(after)["spec"]["model"]["architecture"]
    expected = architecture(json.loads((EXAMPLE / "config.json").read_text()))
    assert expected is not None and block == expected.model_dump(by_alias=True, exclude_defaults=True, mode="json")
    assert main(["plan", "-f", str(path), "--fill"]) == 0
    assert "is up to date" in said(capsys) and path.read_text() == after


def test_the_operator_plans_the_block_alone_and_reads_no_file(tmp_path: Path, data: Path) -> None:
    from zerotrain.operator.controller.admission import admit

    path = manifest(tmp_path, data)
    assert main(["plan", "-f", str(path), "--fill"]) == 0
    spec = yaml.safe_load(path.read_text())["spec"]
    spec["entrypointArgs"]["config"] = "/models/llama-tiny"  # a path only the pods have
    spec["resources"] = {"gpu": 2, "gpuMemory": "16Gi"}
    verdict = admit(spec, "llama-tiny")
    assert verdict.admitted and verdict.plan is not None, verdict.message
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(EXAMPLE))
    assert verdict.plan.parameters == sum(p.numel() for p in model.parameters())
    assert all(stage.peak is not None and stage.peak.activations > 0 for stage in verdict.plan.stages)


def _stage_of_validate(path: Path, capsys: pytest.CaptureFixture[str]) -> int:
    assert main(["validate", str(path)]) == 0
    text = said(capsys)
    return int(text.split("is valid: stage ", 1)[1].split(",", 1)[0])


def test_validate_run_admission_and_the_launcher_choose_one_stage(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerotrain.commands import runtime_calls as rt
    from zerotrain.commands.run import local_stage
    from zerotrain.manifest import parse_job
    from zerotrain.operator.controller.admission import admit

    chosen = []
    # Two ranks of the tiny Llama with a small micro-batch: its model states set the peak, so the two limits (each
    # rank's share, the 402 MB process in it) leave room for different stages.
    for memory in ("509Mi", "520Mi"):
        spec = {"zero": {"stage": "auto"}, "resources": {"memory": memory}, "nprocPerNode": 1, "replicas": 2}
        path = manifest(tmp_path, data, spec, batch_size=2, seq_len=32)
        assert main(["plan", "-f", str(path), "--fill"]) == 0
        capsys.readouterr()
        validated = _stage_of_validate(path, capsys)
        raw = yaml.safe_load(path.read_text())
        verdict = admit(raw["spec"], "llama-tiny")
        assert verdict.admitted and verdict.spec is not None, verdict.message
        job, _ = local_stage(parse_job(raw, source=str(path)), nproc=2)
        assert validated == verdict.spec.zero.fixed_stage.value == job.spec.zero.fixed_stage.value, memory
        # The pods run the spec admission wrote, its stage concrete; their launcher's checks accept it as it is.
        rt.preflight(ZeroTrainingJobSpec.model_validate(verdict.spec.to_wire()))
        chosen.append(validated)
    assert chosen[0] > chosen[1], chosen  # a choice was compared, not a constant


def test_a_block_that_disagrees_with_the_config_is_refused_naming_both_values_and_the_fix(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerotrain.commands import runtime_calls as rt

    path = manifest(tmp_path, data)
    assert main(["plan", "-f", str(path), "--fill"]) == 0
    capsys.readouterr()
    path.write_text(path.read_text().replace("hidden: 128", "hidden: 256"))
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1, out
    text = " ".join(out.err.split())
    assert "spec.model.architecture.hidden: the manifest says 256, but" in text, text
    assert f"{EXAMPLE}/config.json says 128" in text and "zerotrain plan -f JOB --fill" in text, text
    # The pods' launcher refuses it the same way before any rank starts.
    spec = ZeroTrainingJobSpec.model_validate(yaml.safe_load(path.read_text())["spec"])
    with pytest.raises(ConfigError, match=r"spec.model.architecture.hidden: the manifest says 256"):
        rt.preflight(spec)


def test_auto_without_the_block_is_refused_naming_fill(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {"zero": {"stage": "auto"}, "resources": {"memory": "4Gi"}, "model": {"parameters": 1_250_000}}
    assert main(["validate", str(manifest(tmp_path, data, spec))]) == 2
    text = said(capsys)
    assert "spec.zero.stage: auto plans a Hugging Face model from spec.model.architecture" in text, text
    assert "zerotrain plan -f JOB --fill" in text
    plain = {"zero": {"stage": 3}}
    assert main(["validate", str(manifest(tmp_path, data, plain))]) == 0
    assert "model.architecture: not in the manifest" in said(capsys)  # the operator could not plan it


def test_a_family_the_plan_does_not_count_is_said_and_never_planned_with_another(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    phi = {"model_type": "phi", "vocab_size": 2048, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 256}  # fmt: skip
    config = tmp_path / "phi"
    config.mkdir()
    (config / "config.json").write_text(json.dumps(phi))
    path = manifest(tmp_path, data, {"zero": {"stage": 3}}, config=str(config))
    assert main(["validate", str(path)]) == 0
    text = said(capsys)
    assert "model_type 'phi' is not one the plan counts" in text, text
    assert "zerotrain plan -f JOB --measure" in text and "spec.model.activationBytes" in text
    assert main(["plan", "-f", str(path), "--fill"]) == 2
    assert "is not one the plan counts" in said(capsys)
    auto = manifest(tmp_path, data, {"zero": {"stage": "auto"}, "resources": {"memory": "4Gi"},
                                     "model": {"parameters": 10**6}}, config=str(config))  # fmt: skip
    assert main(["validate", str(auto)]) == 2
    assert "spec.model.activationBytes from `zerotrain plan -f JOB --measure`" in said(capsys)
