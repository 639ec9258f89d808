"""Sharded checkpoints on real gloo ranks: resuming reproduces uninterrupted training bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_helpers import run_ranks
from tiny_models import batches, lm_loss, make_model
from zerotrain.runtime import checkpoint


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
    saved = straight.save_checkpoint(root)
    _train(straight, data[3:], rank)
    expected = straight.full_state_dict()

    resumed = ZeroEngine(make_model(seed=7), cfg, optimizer=opt)  # other weights: the load must replace them
    latest = checkpoint.latest(root)
    assert latest is not None and str(latest) == saved
    resumed.load_checkpoint(latest)
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
        assert files == ["COMMITTED", "rank-00000.pt", "rank-00001.pt"]
    assert checkpoint.latest(root) == root / "step-00000003"
