"""Model buffers (BatchNorm's running statistics and counter): trained as DDP trains them, and kept everywhere a
model's state goes: full_state_dict, checkpoints (also at another world size), exports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dist_helpers import run_ranks
from safetensors.torch import load_file
from tiny_models import ConvNet, image_batches

from zerotrain.cli import main
from zerotrain.runtime.checkpoints import checkpoint

BUFFERS = [
    "bn0.running_mean",
    "bn0.running_var",
    "bn0.num_batches_tracked",
    *(f"blocks.{i}.bn.{b}" for i in range(2) for b in ("running_mean", "running_var", "num_batches_tracked")),
]
PROBE = torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(5))


def _adamw(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.1)


def _engine(stage: int, broadcast: bool = True) -> Any:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    torch.manual_seed(0)
    config = ZeroConfig(stage=stage, unit_modules=["ConvBlock"], broadcast_buffers=broadcast)
    return ZeroEngine(ConvNet(), config, optimizer=_adamw)


def _train(engine: Any, rank: int, world: int, steps: int) -> list[float]:
    losses = []
    for step in image_batches(steps, world):
        x, y = step[rank]
        engine.backward(F.cross_entropy(engine(x), y))
        losses.append(engine.step().loss)
    return losses


def against_ddp(rank: int, world: int, stage: int) -> dict[str, Any]:
    """The engine and DDP (broadcast_buffers=True) side by side in the same ranks, on the same batches."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    engine = _engine(stage)  # forms the process group
    torch.manual_seed(0)
    ddp = DDP(ConvNet())
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=0.1)
    losses, ddp_losses = _train(engine, rank, world, 3), []
    for step in image_batches(3, world):
        x, y = step[rank]
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        ddp_losses.append(mean.item() / world)
    live = {n: b.clone() for n, b in engine.module.named_buffers()}
    return {
        "losses": losses,
        "ddp_losses": ddp_losses,
        "full": engine.full_state_dict(),
        "ddp": {k: v.clone() for k, v in ddp.module.state_dict().items()},
        "live": live,
    }


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_buffers_train_as_under_ddp_and_full_state_dict_holds_rank_0s(stage: int) -> None:
    ranks = run_ranks(against_ddp, 2, stage)
    for r, got in enumerate(ranks):
        assert got["losses"] == pytest.approx(got["ddp_losses"], rel=1e-5)
        # Each rank's live statistics: rank 0's broadcast before each forward, then updated by its own batch.
        for name in BUFFERS:
            assert torch.allclose(got["live"][name].float(), got["ddp"][name].float(), rtol=1e-5, atol=1e-6), (r, name)
        assert "scale" not in got["full"]  # non-persistent: left out, as state_dict leaves it out
        assert set(got["full"]) == set(got["ddp"])
        for name in BUFFERS:  # rank 0's values on every rank
            assert torch.equal(got["full"][name], ranks[0]["live"][name]), (r, name)
    assert not torch.equal(ranks[0]["live"]["bn0.running_mean"], ranks[1]["live"]["bn0.running_mean"])
    fresh = ConvNet()
    fresh.load_state_dict(ranks[0]["full"], strict=True)


def save_then_probe(rank: int, world: int, root: str, stage: int, broadcast: bool) -> dict[str, Any]:
    engine = _engine(stage, broadcast)
    _train(engine, rank, world, 2)
    checkpoint.save(engine, root)
    engine.eval()
    with torch.no_grad():
        out = engine(PROBE)
    return {"out": out, "live": {n: b.clone() for n, b in engine.module.named_buffers()}}


def load_then_probe(rank: int, world: int, root: str, stage: int, broadcast: bool) -> dict[str, Any]:
    engine = _engine(stage, broadcast)
    checkpoint.load(engine, root)
    live = {n: b.clone() for n, b in engine.module.named_buffers()}
    engine.eval()
    with torch.no_grad():
        out = engine(PROBE)
    return {"out": out, "live": live}


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "load_stage", "load_world"), [(1, 1, 2), (2, 2, 2), (3, 3, 2), (3, 1, 3)])
def test_a_resumed_engine_evaluates_exactly_as_the_one_that_saved(
    tmp_path: Path, stage: int, load_stage: int, load_world: int
) -> None:
    root = str(tmp_path / "ckpt")
    saved = run_ranks(save_then_probe, 2, root, stage, True)
    loaded = run_ranks(load_then_probe, load_world, root, load_stage, True)
    for got in loaded:
        assert torch.equal(got["out"], saved[0]["out"])
        for name in BUFFERS:
            assert torch.equal(got["live"][name], saved[0]["live"][name]), name


@pytest.mark.slow
def test_per_rank_buffers_are_saved_and_restored_per_rank(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    saved = run_ranks(save_then_probe, 2, root, 3, False)
    assert not torch.equal(saved[0]["out"], saved[1]["out"])  # each rank evaluates with its own statistics
    loaded = run_ranks(load_then_probe, 3, root, 3, False)
    for r in range(2):
        assert torch.equal(loaded[r]["out"], saved[r]["out"])
    # A rank the checkpoint has no file of starts from rank 0's statistics.
    assert torch.equal(loaded[2]["out"], saved[0]["out"])


@pytest.mark.slow
def test_exports_carry_the_buffers(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    root = str(tmp_path / "ckpt")
    saved = run_ranks(save_then_probe, 2, root, 2, True)
    out = tmp_path / "model.safetensors"
    assert main(["checkpoint", "export", root, "--out", str(out)]) == 0
    model = ConvNet()
    model.load_state_dict(load_file(out), strict=True)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(PROBE), saved[0]["out"])
    assert load_file(out)["bn0.num_batches_tracked"].dtype == torch.int64
    dcp_out = tmp_path / "dcp"
    assert main(["checkpoint", "export", root, "--format", "dcp", "--out", str(dcp_out)]) == 0
    fresh = ConvNet()
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=str(dcp_out), no_dist=True)
    fresh.load_state_dict(state["model"], strict=True)
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh(PROBE), saved[0]["out"])
