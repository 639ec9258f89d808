"""Checkpoint export and inspection: safetensors and DCP load into a fresh model (and FSDP2) exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_helpers import run_ranks
from safetensors import safe_open
from safetensors.torch import load_file
from tiny_models import batches, lm_loss, make_model

from zerotrain.cli import main
from zerotrain.runtime.checkpoints import checkpoint


def _adamw(g: list) -> torch.optim.Optimizer:
    return torch.optim.AdamW(g, lr=1e-2, weight_decay=0.1, eps=1e-6)


def train_and_save(rank: int, world: int, root: str) -> dict[str, Any]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    model = make_model(seed=0, tied=True)
    model.norm_f.weight.requires_grad_(False)  # a frozen parameter: exported, no optimizer state
    engine = ZeroEngine(model, ZeroConfig(stage=3, unit_modules=["Block"]), optimizer=_adamw)
    for step in batches(3, world):
        tokens = step[0][rank]
        engine.backward(lm_loss(engine(tokens), tokens))
        engine.step()
    checkpoint.save(engine, root)
    return engine.full_state_dict()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    root = tmp_path_factory.mktemp("export") / "ckpt"
    full = run_ranks(train_and_save, 2, str(root))[0]
    return root, full


def test_safetensors_export_loads_into_the_original_module_exactly(
    saved: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, full = saved
    out = tmp_path / "model.safetensors"
    assert main(["checkpoint", "export", str(root), "--out", str(out)]) == 0
    with safe_open(str(out), "pt") as f:
        aliases = json.loads(f.metadata()["aliases"])
    assert aliases == {"head.weight": "embed.weight"}  # the tied weight once, its other name recorded
    model = make_model(seed=9, tied=True)
    result = model.load_state_dict(load_file(out), strict=False)
    assert result.missing_keys == ["head.weight"] and not result.unexpected_keys
    got = dict(model.named_parameters(remove_duplicate=False))
    assert got.keys() == full.keys()
    for name, value in full.items():
        assert torch.equal(got[name].detach(), value), name

    # An existing file is kept unless --force.
    assert main(["checkpoint", "export", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out) in " ".join(err.split()) and "--force" in err
    assert main(["checkpoint", "export", str(root), "--out", str(out), "--force"]) == 0


def test_dcp_export_loads_into_a_plain_model_with_the_optimizer_state(
    saved: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    import torch.distributed.checkpoint as dcp

    root, full = saved
    out = tmp_path / "dcp"
    assert main(["checkpoint", "export", str(root), "--format", "dcp", "--optimizer", "--out", str(out)]) == 0
    model = make_model(seed=9, tied=True)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(out), no_dist=True)
    for name, value in model.named_parameters(remove_duplicate=False):
        assert torch.equal(value.detach(), full[name]), name
    meta = dcp.FileSystemReader(str(out)).read_metadata().state_dict_metadata
    assert "optim.state.embed.weight.exp_avg_sq" in meta and "optim.state.blocks.0.up.weight.step" in meta
    assert not any(k.startswith("optim.state.norm_f.weight.") for k in meta)  # frozen: no state
    assert meta["optim.state.blocks.1.down.weight.exp_avg"].size == torch.Size([10, 21])


def load_into_fsdp2(rank: int, world: int, path: str) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.distributed.init_process_group("gloo")
    model = make_model(seed=9, tied=True)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}


@pytest.mark.slow
def test_dcp_export_loads_into_an_fsdp2_model_on_three_ranks(
    saved: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    root, full = saved
    out = tmp_path / "dcp"
    assert main(["checkpoint", "export", str(root), "--format", "dcp", "--out", str(out)]) == 0
    for got in run_ranks(load_into_fsdp2, 3, str(out)):
        assert got.keys() == full.keys()
        for name, value in full.items():
            assert torch.equal(got[name], value), name


def test_inspect_reports_complete_interrupted_and_corrupt_checkpoints(
    saved: tuple[Path, dict[str, torch.Tensor]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line
    root, _ = saved
    copy = tmp_path / "ckpt"
    (good,) = list(root.iterdir())
    (copy / good.name).mkdir(parents=True)
    for f in good.iterdir():
        (copy / good.name / f.name).write_bytes(f.read_bytes())
    (copy / "step-00000004-0badcafe").mkdir()  # a save cut short

    assert main(["checkpoint", "inspect", str(copy)]) == 0
    table = capsys.readouterr().out
    assert good.name in table and "yes (verified)" in table and "no COMMITTED marker" in table

    victim = copy / good.name / "rank-00001.safetensors"
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert main(["checkpoint", "inspect", str(copy), "--output", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["complete"] for r in rows] == [False, False]
    assert rows[0]["problem"] == "rank-00001.safetensors is missing or does not match its SHA-256"
    assert rows[0]["step"] == 3 and rows[0]["world_size"] == 2 and rows[0]["stage"] == 3
    assert rows[0]["parameters"] == sum(v.numel() for k, v in _unique(saved[1]).items())
    assert set(rows[0]["bytes_per_rank"]) == {"rank-00000.safetensors", "rank-00001.safetensors"}


def _unique(full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in full.items() if k != "head.weight"}


def test_export_of_a_directory_that_is_not_a_checkpoint_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoint", "export", str(tmp_path), "--out", str(tmp_path / "m.safetensors")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert str(tmp_path) in err and "neither a committed checkpoint" in err
    assert not (tmp_path / "m.safetensors").exists()


def test_adapter_exports_of_a_job_without_lora_are_refused_and_leave_nothing(
    saved: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = saved
    capsys.readouterr()
    assert main(["checkpoint", "export", str(root), "--format", "peft", "--out", str(tmp_path / "a")]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "--format: got 'peft'" in error and "is of a job without spec.model.lora" in error
    args = ["checkpoint", "export", str(root), "--format", "huggingface", "--merge", "--out", str(tmp_path / "m")]
    assert main(args) == 2
    assert "--merge: got True" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "a").exists() and not (tmp_path / "m").exists()
