"""Sharded checkpoints on real gloo ranks: resuming reproduces uninterrupted training bit for bit."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
import torch
from dist_helpers import run_ranks
from tiny_models import batches, lm_loss, make_model, reference_train

from zerotrain.runtime.checkpoints import checkpoint


def _train(engine, data, rank: int) -> None:  # type: ignore[no-untyped-def]
    for step in data:
        tokens = step[0][rank]
        engine.backward(lm_loss(engine(tokens), tokens))
        engine.step()


def resume(rank: int, world: int, root: str, stage: int) -> tuple[bool, list[str]]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(stage=stage, unit_modules=["Block"])
    data = batches(5, world)

    def opt(g: list) -> torch.optim.Optimizer:
        return torch.optim.AdamW(g, lr=1e-2)

    straight = ZeroEngine(make_model(seed=0), cfg, optimizer=opt)
    _train(straight, data[:3], rank)
    saved = checkpoint.save(straight, root)
    _train(straight, data[3:], rank)
    expected = straight.full_state_dict()

    resumed = ZeroEngine(make_model(seed=7), cfg, optimizer=opt)  # other weights: the load must replace them
    latest = checkpoint.latest(root)
    assert latest is not None and latest == saved
    checkpoint.load(resumed, latest)
    assert resumed.steps == 3
    _train(resumed, data[3:], rank)
    got = resumed.full_state_dict()
    return all(torch.equal(got[n], expected[n]) for n in expected), sorted(p.name for p in Path(saved).iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 3])
def test_resume_from_a_sharded_checkpoint_matches_uninterrupted_training(tmp_path: Path, stage: int) -> None:
    root = tmp_path / "ckpt"
    (root / "step-00000009").mkdir(parents=True)  # a save that crashed before its commit marker
    results = run_ranks(resume, 2, str(root), stage)
    for identical, files in results:
        assert identical
        assert files == ["COMMITTED", "rank-00000.safetensors", "rank-00001.safetensors"]
    latest = checkpoint.latest(root)
    assert latest is not None and latest.name.startswith("step-00000003-")


def _adamw(g: list) -> torch.optim.Optimizer:
    return torch.optim.AdamW(g, lr=1e-3, weight_decay=0.1, eps=1e-6)


def save_after_three(rank: int, world: int, root: str) -> None:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    engine = ZeroEngine(make_model(seed=0), ZeroConfig(stage=3, unit_modules=["Block"]), optimizer=_adamw)
    _train(engine, batches(3, world), rank)
    checkpoint.save(engine, root)


def resume_two_more(rank: int, world: int, root: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    cfg = ZeroConfig(stage=2, unit_modules=["Block"])
    engine = ZeroEngine(make_model(seed=7), cfg, optimizer=_adamw)
    path = checkpoint.latest(root)
    assert path is not None
    checkpoint.load(engine, path)
    _train(engine, batches(5, world)[3:], rank)
    # The same run in one process (here, at the same thread count): steps 1-3 on the 2-rank global
    # batches, steps 4-5 on the 4-rank ones.
    data = batches(3, 2) + batches(5, 4)[3:]

    def no_decay(n: str) -> bool:
        return any(fnmatch.fnmatchcase(n, p) for p in cfg.no_weight_decay)

    ref, _, _ = reference_train(make_model(seed=0), data, _adamw, no_decay, cfg.gradient_clipping)
    return engine.full_state_dict(), ref


@pytest.mark.slow
def test_a_checkpoint_from_two_ranks_in_stage_3_resumes_on_four_ranks_in_stage_2(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    run_ranks(save_after_three, 2, root)
    got, ref = run_ranks(resume_two_more, 4, root)[0]
    for name, value in ref.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
