"""The engine in one process: bad input refused before any collective, and world size 1 matches AdamW."""

from __future__ import annotations

import fnmatch
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_helpers import free_port
from tiny_models import Block, batches, lm_loss, make_model, reference_train
from torch import nn

from zerotrain.runtime import ZeroConfig, ZeroEngine
from zerotrain.runtime.zero.engine_errors import ZeroSetupError

# A regression that reaches the rendezvous fails after this many seconds instead of hanging.
FAST = {"collective_timeout_seconds": 5}


def adamw(groups: list) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.1, eps=1e-6)


@pytest.fixture
def peerless_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun env for rank 0 of 2 whose peer never comes: any rendezvous or collective would block."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))


@pytest.mark.parametrize(
    ("model", "config", "optimizer", "field"),
    [
        (nn.ReLU(), ZeroConfig(**FAST), adamw, "model"),
        (make_model(), ZeroConfig(unit_modules=["Blocks"], **FAST), adamw, "zero.unitModules[0]"),
        (nn.Linear(1, 1, bias=False), ZeroConfig(**FAST), adamw, "WORLD_SIZE"),
        (make_model(), ZeroConfig(**FAST), lambda g: torch.optim.LBFGS(g), "optimizer"),
        (make_model(), ZeroConfig(**FAST), lambda g: torch.optim.AdamW(nn.Linear(1, 1).parameters()), "optimizer"),
    ],
    ids=["no-parameters", "unknown-unit-class", "more-ranks-than-parameters", "lbfgs", "ignores-groups"],
)
@pytest.mark.timeout(30)
def test_bad_input_fails_at_construction_before_any_collective(
    peerless_world: None, model: nn.Module, config: ZeroConfig, optimizer: object, field: str
) -> None:
    start = time.monotonic()
    with pytest.raises(ZeroSetupError) as err:
        ZeroEngine(model, config, optimizer=optimizer)  # type: ignore[arg-type]
    assert err.value.field == field and err.value.fix in str(err.value)
    assert not dist.is_initialized()
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_world_size_one_matches_adamw(monkeypatch: pytest.MonkeyPatch, stage: int) -> None:
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    cfg = ZeroConfig(stage=stage, unit_modules=["Block"])
    engine = ZeroEngine(make_model(tied=True), cfg, optimizer=adamw)
    data = batches(3, 1)
    for step in data:
        tokens = step[0][0]
        engine.module.zero_grad()  # a habit of torch loops; must not detach the flat gradient buffers
        engine.backward(lm_loss(engine(tokens), tokens))
        engine.step()
    assert not dist.is_initialized()

    def no_decay(n: str) -> bool:
        return any(fnmatch.fnmatchcase(n, p) for p in cfg.no_weight_decay)

    ref, _, _ = reference_train(make_model(tied=True), data, adamw, no_decay, cfg.gradient_clipping)
    got = engine.full_state_dict()
    for name, value in ref.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6)
    # One rank sends nothing; the ops are still counted (calls), so reports keep their shape.
    report = engine.accounting().comm_report()
    assert sum(op["bytes"] for op in report.values()) == 0 and report["broadcast"]["calls"] > 0


def test_activation_checkpointing_recomputes_each_unit_once_in_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    calls: list[int] = []
    original = Block.forward

    def counting(self: Block, x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return original(self, x)

    monkeypatch.setattr(Block, "forward", counting)
    tokens = batches(1, 1)[0][0][0]
    saved = {}
    for checkpointing, expected in ((False, 3), (True, 6)):
        calls.clear()
        cfg = ZeroConfig(stage=3, unit_modules=["Block"], activation_checkpointing=checkpointing)
        engine = ZeroEngine(make_model(), cfg, optimizer=adamw)
        engine.backward(lm_loss(engine(tokens), tokens))
        assert engine.step().applied
        assert len(calls) == expected
        saved[checkpointing] = engine.accounting().memory_report().activation_bytes
    # Checkpointed blocks keep only their inputs for backward (the rest is recomputed).
    assert 0 < saved[True] < saved[False] / 2, saved


def test_offloaded_activation_checkpoints_live_in_host_memory_and_train_identically(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from zerotrain.runtime.zero import activations

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    packed: list[tuple[str, bool, bool]] = []

    class Recording(activations._CountedOffload):
        def __init__(self, observe: Any, pin: bool) -> None:
            super().__init__(observe, pin)
            pack = self.pack_hook

            def recording_pack(t: torch.Tensor) -> Any:
                out = pack(t)
                packed.append((out[1].device.type, pin, out[1].is_pinned()))
                return out

            self.pack_hook = recording_pack

    monkeypatch.setattr(activations, "_CountedOffload", Recording)
    tokens = batches(1, 1)[0][0][0]
    results, counted = {}, {}
    for offload in (False, True):
        packed.clear()
        cfg = ZeroConfig(
            stage=3, unit_modules=["Block"], activation_checkpointing=True, offload_activation_checkpoints=offload
        )
        engine = ZeroEngine(make_model(), cfg, optimizer=adamw)
        engine.backward(lm_loss(engine(tokens), tokens))
        engine.step()
        results[offload] = engine.full_state_dict()
        counted[offload] = engine.accounting().memory_report().activation_bytes
        # Three checkpointed blocks each keep their input in host memory, not pinned: this model trains on the CPU
        # (pinning is for copies back to a GPU), whether or not the machine has CUDA.
        assert (len(packed) >= 3 and all(p == ("cpu", False, False) for p in packed)) if offload else packed == []
    assert all(torch.equal(results[True][n], results[False][n]) for n in results[False])
    # What the offload keeps is still counted (on CPU it is the same memory either way).
    assert counted[True] == counted[False] > 0, counted


def test_partitioned_activations_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"data parallel only .* nothing to partition"):
        ZeroConfig(partition_activations=True)


class InPlaceLM(nn.Module):
    """Residual blocks applied with `x += block(x)`, modifying each unit's output in place."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = make_model(seed=0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.inner.embed(tokens)
        for b in self.inner.blocks:
            y = b(x)
            y += x  # in place on the unit's output
            x = y
        return self.inner.head(self.inner.norm_f(x))


def test_in_place_ops_on_a_units_output_work_in_stage_3_and_match_plain_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    tokens = batches(1, 1)[0][0][0]
    reference = InPlaceLM()
    opt = adamw([{"params": list(reference.parameters())}])
    reference(tokens)  # the same graph in plain torch
    lm_loss(reference(tokens), tokens).backward()
    opt.step()
    engine = ZeroEngine(InPlaceLM(), ZeroConfig(stage=3, unit_modules=["Block"]), optimizer=adamw)
    engine.backward(lm_loss(engine(tokens), tokens))
    assert engine.step().applied
    got = engine.full_state_dict()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-5, atol=1e-6)
