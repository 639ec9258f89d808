"""Frozen parameters (a LoRA job's base) hold their weights only, sharded as the stage shards parameters.

A model whose base is frozen and whose small adapters train: at every stage the adapters equal single-process AdamW
over them and the base does not move; only the adapters hold gradients, fp32 masters and optimizer state (the base
is its compute-dtype weights, 1/N of them at stage 3); the adapters' state is spread over the ranks like any
unit's, not piled on rank 0; and stage 3 frees each block's frozen weights once backward is done with it, instead
of keeping every block gathered until backward ends.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dist_helpers import run_ranks
from tiny_models import Block, TinyLM, batches, lm_loss
from torch import nn

from zerotrain.runtime.zero.partition import FROZEN_SUFFIX, ROOT_UNIT, build_units

STEPS = 4
RANK = 2
BLOCKS = 6
D = 16


class AdaptedBlock(Block):
    """A block whose `up` projection has a low-rank trainable update beside its frozen weight."""

    def __init__(self, d: int) -> None:
        super().__init__(d)
        self.lora_a = nn.Linear(d, RANK, bias=False)
        self.lora_b = nn.Linear(RANK, 2 * d + 1, bias=False)
        nn.init.normal_(self.lora_b.weight, std=0.1)  # not zero: both adapters get gradients from the first step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.gelu(self.up(h) + self.lora_b(self.lora_a(h))))


class AdaptedLM(TinyLM):
    def __init__(self) -> None:
        super().__init__(d=D, blocks=BLOCKS)
        self.blocks = nn.ModuleList(AdaptedBlock(D) for _ in range(BLOCKS))
        for name, p in self.named_parameters():
            p.requires_grad_("lora_" in name)


def model() -> AdaptedLM:
    torch.manual_seed(0)
    return AdaptedLM()


def optimizer(groups: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.1, eps=1e-6)


def test_a_module_with_frozen_and_trainable_parameters_becomes_two_units() -> None:
    units = build_units(model(), ["AdaptedBlock"], [], world_size=2)
    names = [u.name for u in units]
    assert names[:2] == ["blocks.0", "blocks.0" + FROZEN_SUFFIX]
    assert names[-1] == ROOT_UNIT + FROZEN_SUFFIX and ROOT_UNIT not in names  # embedding, norm and head: frozen
    assert [s.name for s in units[0].slots] == ["blocks.0.lora_a.weight", "blocks.0.lora_b.weight"]
    assert all(u.frozen == u.name.endswith(FROZEN_SUFFIX) for u in units)
    assert units[0].module is units[1].module  # the twins share their module (gathered and freed with it)


def exact(rank: int, world: int, stage: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    config = ZeroConfig(stage=stage, unit_modules=["AdaptedBlock"], **(extra or {}))
    engine = ZeroEngine(model(), config, optimizer=optimizer)
    data = batches(STEPS, world, per_rank=2, seq=9, vocab=13)
    for step in data:
        tokens = step[0][rank]
        engine.backward(lm_loss(engine(tokens), tokens))
        engine.step()
    return {"params": engine.full_state_dict(), "reference": reference(data) if rank == 0 else None}


def reference(data: list) -> dict[str, torch.Tensor]:
    m = model()
    opt = optimizer([{"params": [p for p in m.parameters() if p.requires_grad]}])
    for step in data:
        opt.zero_grad()
        tokens = torch.cat(step[0])
        lm_loss(m(tokens), tokens).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def test_adapters_train_as_one_process_does_and_the_base_stays_at_every_stage() -> None:
    start = dict(model().named_parameters())
    for stage in range(4):
        ranks = run_ranks(exact, 2, stage)
        for name, want in ranks[0]["reference"].items():
            torch.testing.assert_close(ranks[0]["params"][name], want, rtol=1e-5, atol=1e-6, msg=f"{stage} {name}")
            if "lora_" not in name:
                assert torch.equal(ranks[0]["params"][name], start[name].detach()), (stage, name)


@pytest.mark.parametrize(
    ("world", "extra"),
    [
        (2, {"activation_checkpointing": True}),  # recomputed in backward: the twins gathered once for both
        (4, {"shard_group_size": 2}),  # hybrid: only the adapters' gradients cross between groups
        (2, {"prefetch_units": 2, "param_persistence_elements": 256}),  # small twins stay gathered
    ],
    ids=["checkpointing", "hybrid", "prefetch-and-persistence"],
)
def test_stage_3_with_frozen_twins_under_the_other_options(world: int, extra: dict[str, Any]) -> None:
    ranks = run_ranks(exact, world, 3, extra)
    for name, want in ranks[0]["reference"].items():
        torch.testing.assert_close(ranks[0]["params"][name], want, rtol=1e-5, atol=1e-6, msg=name)


def held(rank: int, world: int, stage: int) -> dict[str, Any]:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    config = ZeroConfig(stage=stage, unit_modules=["AdaptedBlock"], precision="bf16")
    engine = ZeroEngine(model(), config, optimizer=optimizer)
    for step in batches(STEPS, world, per_rank=2, seq=9, vocab=13):
        tokens = step[0][rank]
        engine.backward(lm_loss(engine(tokens), tokens))
        engine.step()
    trainable = [u for u in engine.units if not u.layout.frozen]
    frozen = [u for u in engine.units if u.layout.frozen]
    return {
        "report": engine.accounting().memory_report().model_dump(),
        "trainable": sum(u.master.numel() for u in trainable),
        "frozen": sum(u.master.numel() for u in frozen),
        "frozen_dtypes": {u.master.dtype for u in frozen},
        "frozen_grads": sum(u.grad_shard.numel() for u in frozen),
        "gathered_peak": engine.accounting().held.gathered_peak,
        "pair": max(
            sum(v.layout.padded for v in engine.units if v.layout.module is u.layout.module)
            for u in engine.units
            if u.layout.module is not None
        ),
        "root": sum(u.layout.padded for u in engine.units if u.layout.module is None),
    }


def test_only_the_adapters_hold_masters_gradients_and_optimizer_state_spread_over_the_ranks() -> None:
    for stage in (1, 3):
        ranks = run_ranks(held, 2, stage)
        for r in ranks:
            report = r["report"]
            assert r["frozen_dtypes"] == {torch.bfloat16} and r["frozen_grads"] == 0, stage
            # The fp32 master and AdamW's two moments, of this rank's adapter elements only (and the steps' scalars).
            assert report["optimizer_bytes"] <= 12 * r["trainable"] + 64 * 2 * BLOCKS, (stage, report)
            assert r["frozen"] > 8 * r["trainable"]  # what a frozen-counting engine would hold 12 bytes of
            if stage == 3:
                assert report["parameter_bytes"] == 2 * (r["frozen"] + r["trainable"]), report
                assert report["gradient_bytes"] == 4 * r["trainable"], report
        # Each rank holds half of the adapters' masters, not rank 0 all of them.
        assert ranks[0]["trainable"] == ranks[1]["trainable"], stage


def test_stage_3_frees_a_blocks_frozen_weights_when_its_backward_is_done() -> None:
    r = run_ranks(held, 2, 3)[0]
    # The root, and the running block, the one prefetched and the one whose backward just ended (a block is its
    # trainable unit and its frozen twin: at most `pair` elements), bf16; keeping frozen blocks gathered to the end
    # of backward would hold all six.
    window = 2 * (r["root"] + 3 * r["pair"])
    assert r["gathered_peak"] <= window, (r["gathered_peak"], window)
