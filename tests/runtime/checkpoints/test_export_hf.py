"""`zerotrain checkpoint export --format huggingface`: a Llama trained by zerotrain from a local pretrained directory
loads with `transformers.AutoModelForCausalLM.from_pretrained` (no missing or unexpected keys), its logits equal the
engine's; shards within the size, the index last, config and tokenizer files copied; nothing half-written."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dist_helpers import run_ranks
from tiny_models import llama_config

from zerotrain.cli import main
from zerotrain.runtime.job.task import TrainingTask

pytest.importorskip("transformers")

TOKENS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(4))


def llama_task(rank: int, world_size: int, config_dir: str) -> TrainingTask:
    """An entry point of the kind a user writes: the model from a local config, random tokens as data."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir))
    vocab = model.config.vocab_size

    def batches() -> Iterator[torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        while True:
            yield torch.randint(0, vocab, (2 * world_size, 12), generator=g).chunk(world_size)[rank]

    def loss(out: Any, batch: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.logits[:, :-1].reshape(-1, vocab), batch[:, 1:].reshape(-1))

    return TrainingTask(model=model, loss=loss, batches=batches(), unit_modules=["LlamaDecoderLayer"])


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("hf") / "llama"
    config = llama_config()
    torch.manual_seed(7)
    LlamaForCausalLM(config).save_pretrained(path, max_shard_size="20KB")
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))  # a tokenizer's file rides along
    return path


def train_two_steps(rank: int, world: int, pretrained: str, root: str) -> torch.Tensor:
    from zerotrain.runtime import ZeroEngine
    from zerotrain.runtime.job.train import RankContext, train
    from zerotrain.spec import ZeroTrainingJobSpec

    os.environ["ZEROTRAIN_PROGRESS_FILE"] = os.devnull
    os.environ["ZEROTRAIN_SUMMARY_FILE"] = os.devnull
    engines: list[ZeroEngine] = []

    def factory(*args: Any, **kwargs: Any) -> ZeroEngine:
        engines.append(ZeroEngine(*args, **kwargs))
        return engines[-1]

    spec = ZeroTrainingJobSpec.model_validate(
        {
            "image": "i",
            "entrypoint": "test_export_hf:llama_task",
            "entrypointArgs": {"config_dir": pretrained},
            "zero": {"stage": 3},
            "training": {"steps": 2, "optimizer": {"lr": 0.01}},
            "model": {"pretrained": {"path": pretrained}},
            "checkpoint": {"path": root},
        }
    )
    train(spec, RankContext(rank, world, rank), engine_factory=factory)
    engine = engines[0]
    engine.eval()
    with torch.no_grad():
        return engine(TOKENS).logits


@pytest.fixture(scope="module")
def trained(pretrained: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    root = tmp_path_factory.mktemp("trained") / "ckpt"
    logits = run_ranks(train_two_steps, 2, str(pretrained), str(root))[0]
    return root, logits


def _load(out: Path) -> tuple[Any, dict[str, Any]]:
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, local_files_only=True)
    model.eval()
    return model, info


@pytest.mark.slow
def test_transformers_loads_the_export_and_computes_the_engines_logits(
    trained: tuple[Path, torch.Tensor], pretrained: Path, tmp_path: Path
) -> None:
    root, logits = trained
    out = tmp_path / "hf"
    assert (
        main(
            [
                "checkpoint",
                "export",
                str(root),
                "--format",
                "huggingface",
                "--out",
                str(out),
                "--max-shard-size",
                "30KB",
            ]
        )
        == 0
    )
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert all((out / s).stat().st_size <= 30_000 + 4096 or len(_names(out / s)) == 1 for s in shards)
    assert index["metadata"]["total_size"] == 4 * sum(p.numel() for p in _load(out)[0].parameters())
    assert {"config.json", "generation_config.json", "tokenizer_config.json"} <= {f.name for f in out.iterdir()}
    model, info = _load(out)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    with torch.no_grad():
        assert torch.allclose(model(TOKENS).logits, logits, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(_load(pretrained)[0](TOKENS).logits, logits, atol=1e-3)  # it did train


def _names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return list(f.keys())


@pytest.mark.slow
def test_a_bf16_export_in_one_file(trained: tuple[Path, torch.Tensor], tmp_path: Path) -> None:
    from safetensors import safe_open

    root, logits = trained
    out = tmp_path / "bf16"
    assert (
        main(["checkpoint", "export", str(root), "--format", "huggingface", "--out", str(out), "--dtype", "bf16"]) == 0
    )
    assert not (out / "model.safetensors.index.json").exists()  # it fits one shard: model.safetensors, as transformers
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_slice(n).get_dtype() for n in f.keys()} == {"BF16"}  # noqa: SIM118 (safe_open has no __iter__)
    model, info = _load(out)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        assert torch.allclose(model(TOKENS).logits.float(), logits, atol=5e-2)


def test_a_non_empty_directory_is_refused_and_an_interrupted_export_leaves_no_index(
    trained: tuple[Path, torch.Tensor],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from zerotrain.runtime.checkpoints import export_hf

    root, _ = trained
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["checkpoint", "export", str(root), "--format", "huggingface", "--out", str(out)]) == 2
    assert "--out: got" in capsys.readouterr().err and (out / "notes.txt").read_text() == "mine"

    calls = []

    def dies(ck: Any, t: Any, f: Any) -> None:
        calls.append(t.name)
        if len(calls) == 5:
            raise KeyboardInterrupt  # as a Ctrl-C halfway
        original(ck, t, f)

    original = export_hf._write_tensor
    monkeypatch.setattr(export_hf, "_write_tensor", dies)
    with pytest.raises(KeyboardInterrupt):
        export_hf.export_huggingface(root, tmp_path / "cut", max_shard_bytes=30_000)
    assert not any(f.name.endswith(".safetensors") or f.name.endswith(".json") for f in (tmp_path / "cut").iterdir())
