"""LoRA (`spec.model.lora`): adapters added by peft inside the partitioned construction, trained over the frozen,
sharded base at stages 0-3 on two gloo ranks, equal single-process `peft` + torch AdamW on the same global batches
over 20 steps (losses and adapter weights within 1e-5), for a Hugging Face Llama (with `lm_head` in modulesToSave,
which peft trains as a copy and the runtime in place) and the built-in GPT; and the refusals, before any rank starts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from zerotrain.lora_config import LoraSpec
from zerotrain.runtime.job.task import ConfigError

peft = pytest.importorskip("peft")
from dist_helpers import run_ranks  # noqa: E402
from tiny_models import TINY_DECODER  # noqa: E402

STEPS = 20
ACCUM = 2
TOLERANCE = 1e-5
HF = "zerotrain.runtime.models.huggingface:build"
GPT = "zerotrain.runtime.examples.gpt:build"
VOCAB = 96
LLAMA = {"model_type": "llama", **TINY_DECODER, "vocab_size": VOCAB, "tie_word_embeddings": False}
LLAMA_LORA = LoraSpec(
    rank=4,
    alpha=8,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    modules_to_save=["lm_head"],
)
GPT_ARGS = {"seq_len": 16, "batch_size": 4, "d_model": 32, "n_layers": 2, "n_heads": 4, "max_bytes": 20_000}
GPT_LORA = LoraSpec(rank=4, alpha=16, target_modules=["qkv", "proj", "fc_in", "fc_out"])


def tokens(path: Path) -> str:
    np.random.default_rng(3).integers(0, VOCAB, 8192, dtype=np.uint16).astype("<u2").tofile(path)
    return str(path)


def adamw(groups: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.1, eps=1e-6)


def train(rank: int, world: int, entry: str, args: dict[str, Any], lora: LoraSpec) -> dict[str, Any]:
    import torch.distributed as dist

    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.job.model_start import start_task

    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    for stage in range(4):
        torch.manual_seed(0)
        start = start_task(entry, rank=rank, world_size=world, args=args, lora=lora)
        task = start.task
        config = ZeroConfig(stage=stage, unit_modules=task.unit_modules, gradient_accumulation_steps=ACCUM)
        engine = ZeroEngine(task.model, config, adamw, init=start.source, device=torch.device("cpu"))
        losses = []
        for _ in range(STEPS * ACCUM):
            batch = next(task.batches)
            engine.backward(task.loss(engine(task.inputs(batch)), batch))
            result = engine.step()
            if result.applied:
                losses.append(result.loss)
        state = engine.full_state_dict()
        trained = {n for n, p in task.model.named_parameters() if p.requires_grad}
        out[stage] = {"losses": losses, "trained": {n: state[n] for n in trained}, "units": len(engine.units)}
        del engine
    if rank == 0:
        out["reference"] = reference(entry, args, lora)
    return out


def reference(entry: str, args: dict[str, Any], lora: LoraSpec) -> dict[str, Any]:
    """One process: the entry point built whole, peft's model of it, AdamW over what peft trains."""
    from zerotrain.runtime.job.task import build_task

    torch.manual_seed(0)
    task = build_task(entry, rank=0, world_size=1, args=args)  # world 1: its micro-batches are the global ones
    config = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=lora.target_modules,
        modules_to_save=lora.modules_to_save or None,
    )
    model = peft.get_peft_model(task.model, config)
    opt = adamw([p for p in model.parameters() if p.requires_grad])
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for _ in range(ACCUM):
            batch = next(task.batches)
            loss = task.loss(model(task.inputs(batch)), batch) / ACCUM
            loss.backward()
            total += float(loss)
        losses.append(total)
        opt.step()
    trained = {
        n.removeprefix("base_model.model.").replace("modules_to_save.default.", ""): p.detach().clone()
        for n, p in model.named_parameters()
        if p.requires_grad
    }
    return {"losses": losses, "trained": trained}


def assert_equal_to_peft(out: dict[str, Any]) -> None:
    ref = out["reference"]
    for stage in range(4):
        got = out[stage]
        assert sorted(got["trained"]) == sorted(ref["trained"]), stage
        torch.testing.assert_close(got["losses"], ref["losses"], rtol=TOLERANCE, atol=TOLERANCE)
        for name, want in ref["trained"].items():
            torch.testing.assert_close(got["trained"][name], want, rtol=TOLERANCE, atol=TOLERANCE, msg=name)
    assert ref["losses"][-1] < ref["losses"][0]  # it trained


def test_llama_adapters_and_a_head_trained_in_full_equal_peft_at_every_stage(tmp_path: Path) -> None:
    args = {"config": LLAMA, "train": tokens(tmp_path / "train.bin"), "seq_len": 16, "batch_size": 4}
    out = run_ranks(train, 2, HF, args, LLAMA_LORA, timeout=300)[0]
    assert_equal_to_peft(out)
    assert out[3]["units"] == 6  # two layers and the root, each a trainable unit and its frozen twin


def test_the_built_in_gpt_with_adapters_equals_peft_at_every_stage() -> None:
    out = run_ranks(train, 2, GPT, GPT_ARGS, GPT_LORA, timeout=300)[0]
    assert_equal_to_peft(out)


def meta_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"}))


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        (
            LoraSpec(target_modules=["q_proj", "qkv"]),
            "spec.model.lora.targetModules[1]: got 'qkv', which names no module of LlamaForCausalLM; use the name",
        ),
        (LoraSpec(target_modules=["mlp"]), "targetModules[0]: got 'mlp', which names LlamaMLP module(s)"),
        (LoraSpec(target_modules=["q_proj"], modules_to_save=["score"]), "modulesToSave[0]: got 'score'"),
        (LoraSpec(target_modules=["all-linear", "q_proj"]), "all-linear already names every linear layer"),
        (LoraSpec(target_modules=["q_proj"], modules_to_save=["q_proj"]), "modulesToSave: names model.layers.0"),
    ],
)
def test_targets_that_name_nothing_are_refused_naming_the_layers_there_are(lora: LoraSpec, message: str) -> None:
    from zerotrain.runtime.models.lora import apply

    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        apply(meta_llama(), lora)
    if "targetModules[" in message or "modulesToSave[" in message:
        assert "q_proj" in str(e.value) and "down_proj" in str(e.value)  # the layers a target can name


def test_a_tied_module_to_save_is_refused() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from zerotrain.runtime.models.lora import apply

    fields = {k: v for k, v in LLAMA.items() if k not in ("model_type", "tie_word_embeddings")}
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**fields, tie_word_embeddings=True))
    with pytest.raises(ConfigError, match=r"modulesToSave\[0\]: got 'lm_head', whose lm_head.weight is tied to"):
        apply(model, LoraSpec(target_modules=["q_proj"], modules_to_save=["lm_head"]))


def test_rank_zero_is_refused_naming_the_field() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="rank"):
        LoraSpec(rank=0, target_modules=["q_proj"])


PLANNED = {
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
PLANNED_LORA = LoraSpec(rank=8, alpha=16, target_modules=LLAMA_LORA.target_modules)


def planned_spec(stage: int) -> Any:
    from zerotrain.spec import ZeroTrainingJobSpec

    return ZeroTrainingJobSpec.model_validate(
        {
            "entrypoint": HF,
            "entrypointArgs": {"config": PLANNED, "seq_len": 16, "batch_size": 2},
            "nprocPerNode": 2,
            "zero": {"stage": stage, "precision": "bf16"},
            "model": {"lora": PLANNED_LORA.to_wire()},
        }
    )


def held_model_states(rank: int, world: int, path: str) -> dict[int, int]:
    import torch.distributed as dist

    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.job.model_start import start_task

    dist.init_process_group("gloo")
    held = {}
    for stage in (1, 2, 3):
        torch.manual_seed(0)
        start = start_task(HF, rank=rank, world_size=world, args=planned_args(path), lora=PLANNED_LORA)
        config = ZeroConfig(stage=stage, unit_modules=start.task.unit_modules, precision="bf16")
        engine = ZeroEngine(start.task.model, config, adamw, init=start.source, device=torch.device("cpu"))
        batch = next(start.task.batches)
        engine.backward(start.task.loss(engine(start.task.inputs(batch)), batch))
        engine.step()  # the optimizer's state exists from its first step
        held[stage] = engine.accounting().memory_report().model_state_bytes
        del engine
    return held


def planned_args(path: str) -> dict[str, Any]:
    return {"config": PLANNED, "train": path, "seq_len": 16, "batch_size": 2}


def test_the_plan_counts_a_lora_jobs_model_states_within_two_per_cent_at_stages_1_to_3(tmp_path: Path) -> None:
    from zerotrain.plan.inputs import memory_plan

    path = tokens(tmp_path / "train.bin")
    ranks = run_ranks(held_model_states, 2, path, timeout=300)
    for stage in (1, 2, 3):
        planned = memory_plan(planned_spec(stage)).stages[stage]
        assert planned.peak is not None  # the whole peak, from the config: units as the runtime lays them out
        for held in ranks:
            assert abs(held[stage] - planned.model_state_bytes) <= 0.02 * planned.model_state_bytes, (
                stage,
                held[stage],
                planned.model_state_bytes,
            )
    # What makes it a LoRA plan: gradients and optimizer state of the adapters only.
    three = memory_plan(planned_spec(3)).stages[3]
    assert three.optimizer_bytes < three.parameter_bytes / 3


def test_all_linear_adapts_every_linear_layer_but_the_modules_trained_in_full() -> None:
    from zerotrain.runtime.models.lora import adapter_names, apply

    model = apply(meta_llama(), LoraSpec(target_modules=["all-linear"], modules_to_save=["lm_head"]))
    adapted = {n.split(".lora_")[0] for n in adapter_names(model)}
    assert len(adapted) == 2 * 7 and "lm_head" not in adapted  # q, k, v, o, gate, up, down of both layers
    trained = {n for n, p in model.named_parameters() if p.requires_grad} - set(adapter_names(model))
    assert trained == {"lm_head.weight"}
