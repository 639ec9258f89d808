"""A manifest's relative paths, as the `zerotrain` command reads them: beside the manifest first, then the working
directory; claim paths as written; neither found is refused naming both places."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from zerotrain.cli import main
from zerotrain.errors import UserError
from zerotrain.hf_config import HF_ENTRYPOINT
from zerotrain.local_paths import resolve

ROOT = Path(__file__).resolve().parents[2]


def hf_spec(**args: object) -> dict[str, object]:
    return {"entrypoint": HF_ENTRYPOINT, "entrypointArgs": {"seq_len": 32, **args}}


def test_beside_the_manifest_first_then_the_working_directory(tmp_path: Path) -> None:
    job, cwd = tmp_path / "job", tmp_path / "cwd"
    for d in (job / "model", job / "data", cwd / "model", cwd / "other"):
        d.mkdir(parents=True)
    (job / "data" / "a.bin").touch()
    (cwd / "other" / "b.bin").touch()
    spec = {
        **hf_spec(config="model", train="data/*.bin", eval=["other/b.bin"]),
        "model": {"pretrained": {"path": "model"}},
    }
    out = resolve(spec, job / "job.yaml", cwd)
    args = out["entrypointArgs"]
    assert args["config"] == str(job / "model") and args["train"] == str(job / "data" / "*.bin")
    assert args["eval"] == [str(cwd / "other" / "b.bin")] and args["seq_len"] == 32
    assert out["model"]["pretrained"]["path"] == str(job / "model")
    assert spec["entrypointArgs"]["config"] == "model"  # the manifest as written is left alone


def test_claims_absolute_paths_and_inline_configs_stay_as_written(tmp_path: Path) -> None:
    spec = {
        **hf_spec(config={"model_type": "llama"}, train="/data/train.bin", eval="/etc/x"),
        "data": {"path": "/data", "claimName": "corpus"},
        "model": {"pretrained": {"path": "weights", "claimName": "w"}},
    }
    assert resolve(spec, tmp_path / "job.yaml", tmp_path) == spec


def test_a_path_found_nowhere_is_refused_naming_both_places(tmp_path: Path) -> None:
    job, cwd = tmp_path / "job", tmp_path / "cwd"
    job.mkdir()
    cwd.mkdir()
    with pytest.raises(UserError) as e:
        resolve(hf_spec(config="tiny-qwen2"), job / "ft.yaml", cwd)
    said = str(e.value)
    assert resolve(hf_spec(config="tiny-qwen2"), job / "ft.yaml", cwd, strict=False)["entrypointArgs"]["config"] == (
        "tiny-qwen2"  # validate --no-import: only what the manifest carries
    )
    assert said.startswith("spec.entrypointArgs.config: got 'tiny-qwen2', but found it neither beside the manifest")
    assert str(job) in said and str(cwd) in said and "relative to the manifest or absolute" in said


def test_validate_reads_a_job_s_files_beside_it_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "elsewhere"
    shutil.copytree(ROOT / "examples" / "llama-tiny", job / "tiny-llama")
    doc = yaml.safe_load((ROOT / "examples" / "llama-tiny" / "job.yaml").read_text())
    doc["spec"]["entrypointArgs"] = {"config": "tiny-llama", "seq_len": 128, "batch_size": 16}
    del doc["spec"]["training"]["evaluation"]
    (job / "ft.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)
    assert main(["validate", str(job / "ft.yaml")]) == 0, capsys.readouterr().err
    assert "is valid" in capsys.readouterr().out
