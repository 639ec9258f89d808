"""The built-in Hugging Face entry point (`zerotrain.runtime.models.huggingface:build`): Llama (untied embeddings,
RoPE, RMSNorm, grouped-query attention), GPT-2 (tied embeddings, learned positions) and Mixtral (a mixture of experts
whose router leaves experts without tokens), each built partitioned by the entry point from token files and trained
through the engine at stages 0-3 on two gloo ranks (3 steps of 2 accumulated micro-batches, the global gradient norm
clipped to 0.5, below every step's norm), match single-process torch AdamW on the concatenated global batch; the loss,
the units, the data and the refusals.

Tolerances are DDP's: parameters rtol 1e-5 with atol 1e-6, losses and gradient norms rtol 1e-5. The two ranks sum
their halves' gradients in another order than one process summing the whole batch, a difference of fp32 rounding
(~1e-7 relative); Adam's update is invariant to the gradient's scale, so a few steps at lr 1e-3 keep parameters within
~1e-9 of each other, except where a gradient element is near zero and its relative rounding is large: there the
absolute 1e-6 applies, and AdamW's eps is 1e-6 (as in test_stages) so that lr/eps does not amplify it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dist_helpers import run_ranks

from zerotrain.runtime.job.task import ConfigError

pytest.importorskip("transformers")

ENTRY = "zerotrain.runtime.models.huggingface:build"
STEPS = 3
ACCUM = 2
LR, WEIGHT_DECAY, EPS, CLIP = 1e-3, 0.1, 1e-6, 0.5
VOCAB = 96

LLAMA = {
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 72,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
GPT2 = {
    "model_type": "gpt2",
    "vocab_size": VOCAB,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 64,
    # Dropout would draw other masks on a rank's half than on the whole batch.
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
EXPERTS = 8
# Top-2 of 8 experts over one row of 8 tokens per rank: each expert misses a rank's micro-batch with probability
# (6/8)^8 ≈ 0.1, so some layer of some micro-batch leaves experts without tokens (asserted below).
MIXTRAL = {
    "model_type": "mixtral",
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": EXPERTS,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 64,
}


def _tokens(path: Path, count: int = 4096) -> str:
    """A uint16 token file of random ids below VOCAB."""
    rng = np.random.default_rng(7)
    rng.integers(0, VOCAB, count, dtype=np.uint16).astype("<u2").tofile(path)
    return str(path)


def _adamw(groups: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY, eps=EPS)


def _record_routing(model: torch.nn.Module) -> list[list[int]]:
    """The experts each router call sent tokens to, in call order (layer by layer, micro-batch by micro-batch)."""
    calls: list[list[int]] = []
    for module in model.modules():
        if type(module).__name__.endswith("TopKRouter"):
            module.register_forward_hook(lambda _m, _i, out: calls.append(sorted(out[2].unique().tolist())))
    return calls


def train_stages(rank: int, world: int, args: dict[str, Any], stages: list[int]) -> list[dict[str, Any]]:
    """Each stage from a fresh partitioned build of the entry point: STEPS steps of ACCUM micro-batches."""
    import torch.distributed as dist

    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.job.model_start import start_task

    dist.init_process_group("gloo")
    out = []
    for stage in stages:
        torch.manual_seed(0)
        start = start_task(ENTRY, rank=rank, world_size=world, args=args)
        task = start.task
        routing = _record_routing(task.model)
        config = ZeroConfig(
            stage=stage,
            unit_modules=task.unit_modules,
            gradient_accumulation_steps=ACCUM,
            gradient_clipping=CLIP,
        )
        engine = ZeroEngine(task.model, config, _adamw, init=start.source, device=torch.device("cpu"))
        losses, norms = [], []
        for _ in range(STEPS * ACCUM):
            batch = next(task.batches)
            engine.backward(task.loss(engine(task.inputs(batch)), batch))
            result = engine.step(report_grad_norm=True)
            if result.applied:
                losses.append(result.loss)
                norms.append(result.grad_norm)
        out.append(
            {
                "state": engine.full_state_dict(),
                "losses": losses,
                "norms": norms,
                "routing": routing,
                "units": [u.name for u in engine.units],
                "notes": start.notes,
                "torch_init": _transformers_keeps_torch_init(),
            }
        )
    return out


def _transformers_keeps_torch_init() -> bool:
    """Whether transformers' own references to torch.nn.init's functions are torch's, not the recording wrappers of
    a construction (a rank imports transformers first when it imports the entry point, before the construction):
    a later construction in the process would otherwise call an earlier one's wrappers."""
    import importlib

    try:
        kept = importlib.import_module("transformers.initialization").TORCH_INIT_FUNCTIONS
    except (ImportError, AttributeError):  # transformers 4.x keeps none
        return True
    return all(f is getattr(torch.nn.init, name, f) for name, f in kept.items())


def reference(args: dict[str, Any]) -> dict[str, Any]:
    """One process, an ordinary build from the same seed, torch AdamW on the whole global micro-batches."""
    from zerotrain.runtime.models.huggingface import build

    torch.manual_seed(0)
    task = build(rank=0, world_size=1, **args)
    model = task.model
    opt = _adamw(model.parameters())
    losses, norms = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for _ in range(ACCUM):
            batch = next(task.batches)
            loss = task.loss(model(task.inputs(batch)), batch) / ACCUM
            loss.backward()
            total += loss.item()
        params = [p for p in model.parameters() if p.grad is not None]
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, CLIP)))
        losses.append(total)
        opt.step()
    state = {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
    return {"state": state, "losses": losses, "norms": norms}


def _check_parity(got: dict[str, Any], ref: dict[str, Any]) -> None:
    assert set(ref["state"]) <= set(got["state"])
    for name, value in ref["state"].items():
        torch.testing.assert_close(got["state"][name], value, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    for key in ("losses", "norms"):
        torch.testing.assert_close(
            torch.tensor(got[key], dtype=torch.float64), torch.tensor(ref[key], dtype=torch.float64), rtol=1e-5, atol=0
        )


def _run(args: dict[str, Any], label: str, layers: int) -> list[list[dict[str, Any]]]:
    ref = reference(args)
    assert min(ref["norms"]) > CLIP  # clipping acts in every step
    per_rank = run_ranks(train_stages, 2, args, [0, 1, 2, 3], timeout=240)
    for results in per_rank:
        for stage, got in enumerate(results):
            assert got["notes"] == [], got["notes"]  # built partitioned
            assert got["torch_init"]
            # One unit per decoder layer (_no_split_modules) and the root.
            assert len(got["units"]) == layers + 1, got["units"]
            try:
                _check_parity(got, ref)
            except AssertionError as e:
                raise AssertionError(f"{label} stage {stage}: {e}") from None
    return per_rank


@pytest.mark.slow
def test_llama_from_a_config_directory_matches_adamw_at_every_stage(tmp_path: Path) -> None:
    from transformers import AutoConfig

    fields = {k: v for k, v in LLAMA.items() if k != "model_type"}
    AutoConfig.for_model("llama", **fields).save_pretrained(tmp_path / "llama")
    args = {"config": str(tmp_path / "llama"), "train": _tokens(tmp_path / "train.bin"), "seq_len": 16, "batch_size": 4}
    _run(args, "llama", 2)


@pytest.mark.slow
def test_gpt2_with_tied_embeddings_matches_adamw_at_every_stage(tmp_path: Path) -> None:
    args = {"config": GPT2, "train": _tokens(tmp_path / "train.bin"), "seq_len": 16, "batch_size": 4}
    for results in _run(args, "gpt2", 2):
        # The head is the embedding: one parameter, updated once, under both names.
        for got in results:
            assert torch.equal(got["state"]["lm_head.weight"], got["state"]["transformer.wte.weight"])


@pytest.mark.slow
def test_mixtral_matches_adamw_at_every_stage_with_experts_left_without_tokens(tmp_path: Path) -> None:
    args = {"config": MIXTRAL, "train": _tokens(tmp_path / "train.bin"), "seq_len": 8, "batch_size": 2}
    rank0, rank1 = _run(args, "mixtral", 2)
    for stage in range(4):
        calls = list(zip(rank0[stage]["routing"], rank1[stage]["routing"], strict=True))
        assert len(calls) == STEPS * ACCUM * 2  # one router call per layer and micro-batch
        # An expert without tokens on one rank while the other rank's tokens use it: its gradient reaches the
        # reduction from one rank only, and the reduced shard still equals the global batch's.
        assert any(len(a) < EXPERTS or len(b) < EXPERTS for a, b in calls)
        assert any(set(a) != set(b) for a, b in calls)


# ---------------------------------------------------------------- one process: the loss, the units, the refusals


def test_the_loss_is_fp32_cross_entropy_of_the_next_token_over_the_targets_not_ignored() -> None:
    from zerotrain.runtime.models.huggingface import IGNORE_INDEX, model_inputs, next_token_loss

    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 11, (3, 8), generator=g)
    batch[0, 3] = batch[2, 1] = IGNORE_INDEX
    batch[1, 5:] = IGNORE_INDEX  # a padded tail
    logits = torch.randn(3, 7, 11, generator=g).to(torch.bfloat16).requires_grad_()
    got = next_token_loss(SimpleNamespace(logits=logits), batch)
    targets = batch[:, 1:].reshape(-1)
    want = F.cross_entropy(logits.float().reshape(-1, 11), targets, ignore_index=IGNORE_INDEX)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    # The mean is over the 21 - 5 targets kept; position i is scored against token i + 1.
    kept = targets != IGNORE_INDEX
    assert int(kept.sum()) == 16
    picked = -torch.log_softmax(logits.float().reshape(-1, 11), -1)[kept, targets[kept]]
    torch.testing.assert_close(got, picked.mean(), rtol=1e-6, atol=0)
    # An ignored position is still fed to the model (as token 0: it has no embedding), the inputs one shorter.
    inputs = model_inputs(batch)
    assert inputs.shape == (3, 7) and int(inputs.min()) >= 0 and torch.equal(inputs[0, :3], batch[0, :3])

    # Nothing to predict: 0 with zero gradients, not the NaN of 0/0 that would spread through the reduction.
    none = torch.full((2, 5), IGNORE_INDEX)
    loss = next_token_loss(SimpleNamespace(logits=logits[:2, :4]), none)
    loss.backward()
    assert float(loss.detach()) == 0.0 and logits.grad is not None and torch.isfinite(logits.grad).all()


@pytest.mark.parametrize(
    ("config", "units"),
    [(LLAMA, ["LlamaDecoderLayer"]), (GPT2, ["GPT2Block"]), (MIXTRAL, ["MixtralDecoderLayer"])],
)
def test_the_units_are_the_classes_transformers_never_splits(config: dict[str, Any], units: list[str]) -> None:
    from zerotrain.runtime.models.huggingface import build

    task = build(0, 1, config=config, seq_len=16)
    assert task.unit_modules == units == sorted(task.model._no_split_modules)
    assert sum(type(m).__name__ in units for m in task.model.modules()) == 2


def test_the_model_is_fp32_whatever_the_configs_dtype_and_keeps_no_cache() -> None:
    from zerotrain.runtime.models.huggingface import build

    task = build(0, 1, config={**LLAMA, "torch_dtype": "bfloat16"}, seq_len=16)
    assert {p.dtype for p in task.model.parameters()} == {torch.float32}
    out = task.model(torch.zeros(1, 4, dtype=torch.long))
    assert getattr(out, "past_key_values", None) is None


def test_data_from_token_files_split_across_ranks_and_evaluation_repeats(tmp_path: Path) -> None:
    from zerotrain.runtime.models.huggingface import build

    files = {"train": _tokens(tmp_path / "train.bin"), "eval": _tokens(tmp_path / "val.bin", 2000)}
    torch.manual_seed(3)
    whole = build(0, 1, config=GPT2, seq_len=16, batch_size=4, **files)
    torch.manual_seed(3)
    half = build(1, 2, config=GPT2, seq_len=16, batch_size=4, **files)
    assert (half.tokens_per_batch, half.samples_per_batch) == (2 * 16, 2)
    assert torch.equal(next(half.batches), next(whole.batches)[2:])  # rank 1's rows of the same global batch
    assert half.eval_batches is not None and whole.eval_batches is not None
    first = list(half.eval_batches())
    again = list(half.eval_batches())
    assert len(first) == len(again) == 2000 // 17 // 4
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert torch.equal(first[0], next(whole.eval_batches())[2:])


def _refusal(**kw: Any) -> str:
    from zerotrain.runtime.models.huggingface import build

    with pytest.raises(ConfigError) as info:
        build(0, 1, **{"config": LLAMA, "seq_len": 16, **kw})
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_configs_and_classes_transformers_lacks_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    message = _refusal(config=str(tmp_path / "empty"))
    assert f"spec.entrypointArgs.config: got '{tmp_path / 'empty'}', which has no config.json" in message
    assert "model_type 'lama'" in _refusal(config={**LLAMA, "model_type": "lama"})
    assert "did you mean llama" in _refusal(config={**LLAMA, "model_type": "lama"})
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"model_type": "not-a-model"}')
    assert "model_type 'not-a-model', which transformers" in _refusal(config=str(tmp_path / "bad"))
    message = _refusal(model_class="LlamaForCausalLm")
    assert "spec.entrypointArgs.model_class: got 'LlamaForCausalLm'" in message and "LlamaForCausalLM" in message
    assert "takes a GPT2Config" in _refusal(model_class="GPT2LMHeadModel")
    assert "not a causal language model" in _refusal(model_class="LlamaModel")
    assert "seq_len: got 65, beyond the config's max_position_embeddings 64" in _refusal(seq_len=65)


def test_without_train_files_the_model_builds_but_drawing_a_batch_is_refused() -> None:
    from zerotrain.runtime.models.huggingface import build

    task = build(0, 1, config=LLAMA, seq_len=16)
    with pytest.raises(ConfigError, match=r"spec.entrypointArgs.train: not set"):
        next(task.batches)


def test_without_transformers_the_fix_is_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from zerotrain.runtime.models import huggingface

    monkeypatch.setitem(sys.modules, "transformers", None)  # an import of it raises ImportError
    assert huggingface._import_transformers() is None
    monkeypatch.setattr(huggingface, "TRANSFORMERS", None)
    assert "pip install zerotrain[hf]" in _refusal()
