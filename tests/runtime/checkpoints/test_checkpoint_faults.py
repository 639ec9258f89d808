"""Checkpoints under faults: fp16-skipped steps, a rank killed mid-save, and checkpoints that must be refused."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_helpers import RankFailed, run_ranks
from tiny_models import batches, lm_loss, make_model

from zerotrain.runtime.checkpoints import checkpoint


def _adamw(g: list) -> torch.optim.Optimizer:
    return torch.optim.AdamW(g, lr=1e-3, eps=1e-6)


def _engine(seed: int = 0, stage: int = 2, model: dict[str, Any] | None = None, **kw: Any):  # type: ignore[no-untyped-def]
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(stage=stage, unit_modules=["Block"], collective_timeout_seconds=20, **kw)
    return ZeroEngine(make_model(seed=seed, **(model or {})), cfg, optimizer=_adamw)


def _train(engine, data, rank: int) -> list[bool]:  # type: ignore[no-untyped-def]
    skipped = []
    for step in data:
        tokens = step[0][rank]
        engine.backward(lm_loss(engine(tokens), tokens))
        skipped.append(bool(engine.step().overflow))
    return skipped


FP16 = {"precision": "fp16", "loss_scale": {"initial_scale": 2.0**18, "growth_interval": 3}}


def fp16_resume(rank: int, world: int, root: str) -> dict[str, Any]:
    data = batches(12, world)
    straight = _engine(**FP16)
    skipped = _train(straight, data[:6], rank)
    checkpoint.save(straight, root)
    scaler_at_save = straight._scaler.state_dict()
    skipped += _train(straight, data[6:], rank)

    resumed = _engine(seed=5, **FP16)
    checkpoint.load(resumed, root)
    loaded_scaler = resumed._scaler.state_dict()
    position = (resumed.micro_steps, resumed.steps)
    _train(resumed, data[6:], rank)
    a, b = straight.full_state_dict(), resumed.full_state_dict()
    return {
        "equal": all(torch.equal(a[n], b[n]) for n in a),
        "skipped": skipped,
        "scaler": (scaler_at_save, loaded_scaler),
        "position": position,
        "final_scales": (straight._scaler.scale, resumed._scaler.scale),
    }


@pytest.mark.slow
def test_resume_across_fp16_skipped_steps_is_bit_exact(tmp_path: Path) -> None:
    r = run_ranks(fp16_resume, 2, str(tmp_path / "ckpt"))[0]
    # 2^18 overflows fp16 at first: skipped steps before the save, and the growth counter mid-interval at it.
    assert any(r["skipped"][:6]) and not all(r["skipped"][:6])
    saved, loaded = r["scaler"]
    assert saved == loaded and saved["clean_steps"] > 0
    assert r["position"] == (6, 6 - sum(r["skipped"][:6]))  # micro-batches consumed vs updates applied
    assert r["final_scales"][0] == r["final_scales"][1]
    assert r["equal"]


def killed_mid_save(rank: int, world: int, root: str, point: str) -> None:
    from zerotrain.runtime.checkpoints import checkpoint as ck

    engine = _engine()
    data = batches(3, world)
    _train(engine, data[:2], rank)
    checkpoint.save(engine, root)
    _train(engine, data[2:], rank)
    original_write, original_commit = ck.write, ck._commit

    def write(path: Path, *a: Any) -> None:
        if rank == 1 and point == "before-file":
            os.kill(os.getpid(), signal.SIGKILL)
        original_write(path, *a)
        if rank == 1 and point == "after-file":
            os.kill(os.getpid(), signal.SIGKILL)

    def commit(*a: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)  # rank 0, with every file durable, just before the marker

    ck.write = write  # type: ignore[assignment]
    if point == "before-marker":
        ck._commit = commit  # type: ignore[assignment]
    checkpoint.save(engine, root)
    ck.write, ck._commit = original_write, original_commit


def load_newest(rank: int, world: int, root: str) -> tuple[int, int]:
    engine = _engine(seed=3)
    loaded = checkpoint.load(engine, root)
    return loaded.step, engine.steps


@pytest.mark.slow
@pytest.mark.parametrize("point", ["before-file", "after-file", "before-marker"])
def test_a_rank_killed_inside_a_save_leaves_the_previous_checkpoint_newest(tmp_path: Path, point: str) -> None:
    root = tmp_path / "ckpt"
    with pytest.raises(RankFailed):
        run_ranks(killed_mid_save, 2, str(root), point, timeout=60)
    dirs = sorted(root.iterdir())
    assert len(dirs) == 2  # the committed step-2 checkpoint and the abandoned step-3 save
    newest = checkpoint.latest(root)
    assert newest is not None and checkpoint.step_of(newest) == 2
    assert run_ranks(load_newest, 2, str(root)) == [(2, 2), (2, 2)]


def refused(rank: int, world: int, root: str, kind: str) -> dict[str, Any]:
    from zerotrain.runtime.zero.engine_errors import ZeroSetupError

    model = {"d": 12} if kind == "other-model" else {}
    engine = _engine(seed=3, model=model)
    before = {n: t.clone() for n, t in engine.full_state_dict().items()}
    target = root if kind != "not-a-checkpoint" else str(Path(root).parent)
    try:
        checkpoint.load(engine, target)
    except ZeroSetupError as e:
        after = engine.full_state_dict()
        return {"message": str(e), "unchanged": all(torch.equal(before[n], after[n]) for n in before)}
    return {"message": None, "unchanged": False}


def save_two_ranks(rank: int, world: int, root: str) -> None:
    engine = _engine()
    _train(engine, batches(1, world), rank)
    checkpoint.save(engine, root)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One committed 2-rank checkpoint, saved once; each case damages its own copy."""
    root = tmp_path_factory.mktemp("saved") / "ckpt"
    run_ranks(save_two_ranks, 2, str(root))
    return root


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("not-a-checkpoint", "neither a committed checkpoint"),
        (
            "other-model",
            "saved from another model: parameter 'blocks.0.down.bias' has shape [10] in the checkpoint but [12] in "
            "this model",
        ),
        ("missing", "rank-00001.safetensors is missing"),
        ("truncated", "rank-00001.safetensors"),
    ],
)
def test_a_bad_checkpoint_is_refused_naming_why_and_the_engine_is_unchanged(
    tmp_path: Path, saved: Path, kind: str, says: str
) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(saved, root)
    victim = next(root.glob("*/rank-00001.safetensors"))
    if kind == "missing":
        victim.unlink()
    if kind == "truncated":
        victim.write_bytes(victim.read_bytes()[:-100])
    results = run_ranks(refused, 2, str(root), kind)
    for r in results:
        assert r["unchanged"]
        assert r["message"] is not None and str(root.parent if kind == "not-a-checkpoint" else root) in r["message"]
    assert says in results[1]["message"], results[1]["message"]
