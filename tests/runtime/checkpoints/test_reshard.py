"""Loading at another world size or stage reads only this rank's ranges, chunk by chunk, and trains on exactly."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
import torch
from dist_helpers import run_ranks
from tiny_models import batches, lm_loss, make_model, reference_train

from zerotrain.runtime.checkpoints import checkpoint, reshard, shard_file


def _adamw(g: list) -> torch.optim.Optimizer:
    return torch.optim.AdamW(g, lr=1e-3, weight_decay=0.1, eps=1e-6)


def _train(engine, data, rank: int) -> None:  # type: ignore[no-untyped-def]
    for step in data:
        tokens = step[0][rank]
        engine.backward(lm_loss(engine(tokens), tokens))
        engine.step()


def save_after_three(
    rank: int,
    world: int,
    root: str,
    stage: int,
    align: int | None = None,
    group: int | None = None,
    offload: dict | None = None,
) -> int:
    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.zero import partition

    if align is not None:
        partition.ALIGN = align  # 1: the layout checkpoints had before parameters were aligned

    cfg = ZeroConfig(stage=stage, unit_modules=["Block"], shard_group_size=group, offload=offload or {})
    engine = ZeroEngine(make_model(seed=0), cfg, optimizer=_adamw)
    _train(engine, batches(3, world), rank)
    checkpoint.save(engine, root)
    return sum(u.master.numel() for u in engine.units)


def resume_two_more(
    rank: int,
    world: int,
    root: str,
    stage: int,
    saved_world: int,
    group: int | None = None,
    offload: dict | None = None,
) -> dict[str, object]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    shard_file.READ_CHUNK_ELEMENTS = 50  # many small reads: the bound on what a load holds beyond its shard
    cfg = ZeroConfig(stage=stage, unit_modules=["Block"], shard_group_size=group, offload=offload or {})
    engine = ZeroEngine(make_model(seed=7), cfg, optimizer=_adamw)
    loaded = checkpoint.load(engine, root)  # the root: the newest committed checkpoint under it
    shard = sum(u.master.numel() for u in engine.units)
    _train(engine, batches(5, world)[3:], rank)
    data = batches(3, saved_world) + batches(5, world)[3:]

    def no_decay(n: str) -> bool:
        return any(fnmatch.fnmatchcase(n, p) for p in cfg.no_weight_decay)

    ref, _, _ = reference_train(make_model(seed=0), data, _adamw, no_decay, cfg.gradient_clipping)
    return {"got": engine.full_state_dict(), "ref": ref, "loaded": loaded, "shard": shard, "steps": engine.steps}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("saved_world", "saved_stage", "world", "stage"),
    [(4, 3, 3, 3), (2, 3, 4, 3), (3, 3, 1, 1)],
    ids=["4to3-stage3-uneven", "2to4-stage3", "3to1-stage3to1"],
)
def test_a_resharded_load_reads_only_its_ranges_and_trains_on_exactly(
    tmp_path: Path, saved_world: int, saved_stage: int, world: int, stage: int
) -> None:
    root = str(tmp_path / "ckpt")
    saved_shard = run_ranks(save_after_three, saved_world, root, saved_stage)[0]
    results = run_ranks(resume_two_more, world, root, stage, saved_world)
    total_file_bytes = sum(f.stat().st_size for f in Path(root).glob("*/rank-*.safetensors"))
    for r in results:
        assert r["steps"] == 3 + 2
        for name, value in r["ref"].items():
            torch.testing.assert_close(r["got"][name], value, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        loaded = r["loaded"]
        # fp32 master, Adam's two moments: 12 bytes per element this rank now holds, plus the 0-dim steps and
        # its RNG state (5 KB): never the whole checkpoint.
        assert loaded.bytes_read <= 12 * r["shard"] + 8 * 1024, (loaded.bytes_read, r["shard"])
        assert loaded.largest_read_bytes <= max(50 * 4, 5056)  # one chunk (or the RNG state)
        if world > 1:
            assert loaded.bytes_read < total_file_bytes / 2
    print(f"\n{saved_world}->{world}: saved shard {saved_shard} elements, per-rank bytes read", end=" ")
    print([r["loaded"].bytes_read for r in results], f"of {total_file_bytes} in the checkpoint")


def test_cover_cuts_a_range_into_pieces_from_the_preferred_sources() -> None:
    # Preference order: file 1 first (this rank's own), then 0, then 2 (a stage-0 copy of everything).
    sources = [reshard.Source(1, "b", 5, 10), reshard.Source(0, "a", 0, 5), reshard.Source(2, "c", 0, 12)]
    assert reshard.cover(sources, 3, 12, valid=10, what="unit u") == [
        reshard.Piece(0, "a", 3, 0, 2),
        reshard.Piece(1, "b", 0, 2, 5),
    ]  # [10, 12) is padding: left to the caller's zeros
    assert reshard.cover(sources, 3, 12, valid=11, what="unit u")[-1] == reshard.Piece(2, "c", 10, 7, 2)
    with pytest.raises(reshard.ReshardError, match="unit u: elements from 10 are in no rank file"):
        reshard.cover(sources[:2], 3, 12, valid=11, what="unit u")


def test_checkpoint_names_sort_by_step_not_by_token(tmp_path: Path) -> None:
    for name in ("step-00000010-ffffffff", "step-00000009-00000000", "step-00000100-00000001"):
        (tmp_path / name).mkdir()
        (tmp_path / name / checkpoint.COMMITTED).write_text("{}")
    assert [p.name for p in checkpoint.committed(tmp_path)] == [
        "step-00000009-00000000",
        "step-00000010-ffffffff",
        "step-00000100-00000001",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("saved_world", "world", "stage"), [(2, 2, 3), (2, 3, 1)], ids=["2to2-stage3", "2to3-stage1"])
def test_a_checkpoint_from_before_aligned_offsets_loads_and_trains_on_exactly(
    tmp_path: Path, saved_world: int, world: int, stage: int
) -> None:
    root = str(tmp_path / "ckpt")
    run_ranks(save_after_three, saved_world, root, 3, 1)
    marker = checkpoint.read_marker(checkpoint.latest(root))  # type: ignore[arg-type]
    offsets = [p[2] for u in marker["model"] for p in u["params"]]
    assert any(o % 16 for o in offsets), offsets  # saved packed back to back, as before alignment
    for r in run_ranks(resume_two_more, world, root, stage, saved_world):
        assert r["steps"] == 3 + 2
        for name, value in r["ref"].items():
            torch.testing.assert_close(r["got"][name], value, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
