"""ZeRO-R constant-size buffers: one persistent pool serves every chunked collective; its bytes do not grow with
depth and nothing is allocated for communication after the first step."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from dist_helpers import run_ranks
from torch import nn

from zerotrain.runtime.zero.engine_errors import ZeroSetupError
from zerotrain.runtime.zero.partition import ALIGN, align_up

WIDTH, BUCKET = 24, 100  # a block's shard (~300 elements) is several buckets


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def buffers(rank: int, world: int, depth: int, stage: int, precision: str) -> dict[str, Any]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    torch.manual_seed(0)
    model = nn.Sequential(*(Block() for _ in range(depth)))
    cfg = ZeroConfig(
        stage=stage,
        unit_modules=["Block"],
        precision=precision,
        reduce_bucket_elements=BUCKET,
        allgather_bucket_elements=BUCKET,
    )
    engine = ZeroEngine(model, cfg, optimizer=lambda g: torch.optim.AdamW(g, lr=1e-3))
    allocations = []
    for step in range(3):
        x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(step))
        engine.backward(engine(x).float().square().mean())
        engine.step()
        allocations.append(engine.comm.stats.buffer_allocations)
    return {"peak": engine.accounting().memory_report().comm_buffer_peak_bytes, "allocations": allocations}


def buffers_at_depths(
    rank: int, world: int, depths: tuple[int, ...], stage: int, precision: str
) -> list[dict[str, Any]]:
    # One engine after another in one spawn of the ranks (each engine has its own buffers and counters).
    return [buffers(rank, world, depth, stage, precision) for depth in depths]


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "precision"), [(0, "bf16"), (1, "fp32"), (2, "bf16"), (3, "fp32")])
def test_buffer_bytes_stay_flat_with_depth_and_nothing_is_allocated_after_the_first_step(
    stage: int, precision: str
) -> None:
    peaks = {}
    depths = (2, 4, 8, 16)
    for depth, result in zip(depths, run_ranks(buffers_at_depths, 2, depths, stage, precision)[0], strict=True):
        first, *later = result["allocations"]
        assert first > 0 and all(n == first for n in later), result  # nothing new after step 1
        peaks[depth] = result["peak"]
    assert len(set(peaks.values())) == 1, peaks
    # At most two buffers per dtype of a chunk's bucket and output, whatever the depth.
    assert peaks[16] <= 2 * 2 * (BUCKET + BUCKET // 2) * 4, peaks


def test_a_bucket_smaller_than_the_world_size_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    cfg = ZeroConfig(stage=2, reduce_bucket_elements=3)
    with pytest.raises(ZeroSetupError, match=r"zero.reduceBucketElements: got 3; .*4 ranks.*use at least 4"):
        ZeroEngine(nn.Linear(8, 8), cfg, optimizer=lambda g: torch.optim.SGD(g, lr=0.1))


def gradient_storages(rank: int, world: int, stage: int, contiguous: bool, bucket: int = 50_000_000) -> dict[str, Any]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), *(Block() for _ in range(4)))
    cfg = ZeroConfig(
        stage=stage,
        unit_modules=["Block"],
        contiguous_gradients=contiguous,
        gradient_accumulation_steps=2,
        reduce_bucket_elements=bucket,
    )
    seen: list[set[int]] = []
    for p in model.parameters():  # before the engine's own hooks, which reduce and drop the gradient
        p.register_post_accumulate_grad_hook(lambda q: seen[-1].add(q.grad.untyped_storage()._cdata))
    engine = ZeroEngine(model, cfg, optimizer=lambda g: torch.optim.AdamW(g, lr=1e-3))
    for step in range(3):
        seen.append(set())
        for micro in range(2):
            x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(10 * step + micro))
            engine.backward(engine(x).square().mean())
        engine.step()
    return {
        "seen": seen,
        "arena_bytes": engine.accounting().memory_report().gradient_arena_bytes,
        "grad_bytes": engine.accounting().memory_report().gradient_bytes,
    }


def small_bucket() -> int:
    """One element short of a Block's flat buffer (weight, bias at the next multiple of 16, 2 aligned shards)."""
    return align_up(align_up(WIDTH * WIDTH, ALIGN) + WIDTH, 2 * ALIGN) - 1


def gradient_storage_cases(
    rank: int, world: int, stage: int, cases: tuple[tuple[bool, int | None], ...]
) -> list[dict[str, Any]]:
    """`gradient_storages` per (contiguous, bucket) in one spawn of the ranks; bucket -1 is `small_bucket()`."""
    out = []
    for contiguous, bucket in cases:
        size = {None: 50_000_000, -1: small_bucket()}.get(bucket, bucket)
        assert size is not None
        out.append(gradient_storages(rank, world, stage, contiguous, size))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_contiguous_gradients_land_in_reused_arenas_and_allocate_nothing_after_the_first_step(stage: int) -> None:
    on, off, small = run_ranks(gradient_storage_cases, 2, stage, ((True, None), (False, None), (True, -1)))[0]
    # On: every gradient, every micro-batch, lives in one of the arenas made at construction (2 + the root's).
    assert len(set().union(*on["seen"])) <= 3, on
    assert on["seen"][1] <= on["seen"][0] and on["seen"][2] <= on["seen"][0]
    # One Block's flat buffer: weight, then the bias at the next multiple of 16, then 2 equal aligned shards.
    block = align_up(align_up(WIDTH * WIDTH, ALIGN) + WIDTH, 2 * ALIGN) * 4
    root = block
    assert on["arena_bytes"] == 2 * block + root
    # Off: autograd allocates fresh gradients every micro-batch; no arenas are held.
    assert off["arena_bytes"] == 0
    assert len(set().union(*off["seen"])) > 3
    # Between steps the same gradient bytes are held either way (the fp32 shards).
    assert on["grad_bytes"] == off["grad_bytes"]
    # Units larger than the reduce bucket get no arena: what is kept for the run is bounded by the configuration,
    # and their gradients are autograd's, as without contiguous gradients.
    assert small["arena_bytes"] == 0
    assert len(set().union(*small["seen"])) > 3
