"""Pretrained weights into each rank's shard: the engine's model equals the plain model given the same file, every
rank reads only its own ranges, and what does not fit is refused, naming the field, the value and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from dist_helpers import run_ranks
from safetensors.torch import load_file, save_file
from tiny_models import llama_config
from torch import nn

from zerotrain.runtime.checkpoints import checkpoint
from zerotrain.runtime.construction.weight_files import open_weights
from zerotrain.runtime.job.task import TrainingTask
from zerotrain.spec import PretrainedSpec
from zerotrain.weights_layout import WeightsError

pytest.importorskip("transformers")

TOKENS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(4))


class Wrapper(nn.Module):
    """A model of the user's own around the pretrained one: its names gain the prefix `model.`."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.model = inner

    def forward(self, tokens: torch.Tensor) -> Any:
        return self.model(tokens)


def llama(rank: int, world_size: int, tie: bool = False, wrapped: bool = False) -> TrainingTask:
    """The entry point: a Llama built from its config (its own random init), optionally inside a wrapper."""
    from transformers import LlamaForCausalLM

    model: nn.Module = LlamaForCausalLM(llama_config(tie))
    if wrapped:
        model = Wrapper(model)
    return TrainingTask(
        model=model, loss=lambda out, b: out.logits.mean(), batches=iter([]), unit_modules=["LlamaDecoderLayer"]
    )


def save_llama(path: Path, tie: bool = False, dtype: torch.dtype = torch.float32, shard: str = "20KB") -> nn.Module:
    """Weights as Hugging Face writes them (from another seed than the entry point's)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(7)
    model = LlamaForCausalLM(llama_config(tie)).to(dtype)
    model.save_pretrained(path, max_shard_size=shard)
    return model


def plain_logits(path: Path, tie: bool = False) -> torch.Tensor:
    """The plain model given the same files through load_state_dict."""
    from transformers import LlamaForCausalLM

    state: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        state |= load_file(f)
    model = LlamaForCausalLM(llama_config(tie))
    result = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    assert result.missing_keys == (["lm_head.weight"] if tie else []) and not result.unexpected_keys
    model.eval()
    with torch.no_grad():
        return model(TOKENS).logits


def pretrained_engine(rank: int, world: int, spec: dict[str, Any], stage: int, args: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.job.model_start import start_task, use_pretrained

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    start = start_task("test_pretrained:llama", rank=rank, world_size=world, args=args)
    source = use_pretrained(start, PretrainedSpec.model_validate(spec))
    config = ZeroConfig(stage=stage, unit_modules=["LlamaDecoderLayer"])
    engine = ZeroEngine(
        start.task.model, config, lambda g: torch.optim.SGD(g, lr=0.1), init=start.source, device=torch.device("cpu")
    )
    engine.eval()
    with torch.no_grad():
        logits = engine(TOKENS).logits
    stats = source.store.stats
    shard = sum(u.master_range[1] - u.master_range[0] for u in engine.units)
    return {
        "logits": logits,
        "notes": start.notes,
        "read": stats.bytes_read,
        "largest": stats.largest_read_bytes,
        "shard": shard,
    }


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_engines_model_is_the_plain_model_given_the_same_sharded_files(tmp_path: Path, stage: int) -> None:
    save_llama(tmp_path / "llama")
    want = plain_logits(tmp_path / "llama")
    for got in run_ranks(pretrained_engine, 2, {"path": str(tmp_path / "llama")}, stage, {}):
        assert torch.allclose(got["logits"], want, rtol=1e-5, atol=1e-6)
        assert any("pretrained weights from" in n and "exact names" in n for n in got["notes"])
        if stage:  # each rank read its own half of the fp32 weights, never the whole
            assert got["read"] <= 4 * got["shard"] + 64


@pytest.mark.slow
def test_bf16_weights_a_tied_head_and_a_wrapping_model(tmp_path: Path) -> None:
    save_llama(tmp_path / "bf16", tie=True, dtype=torch.bfloat16, shard="1GB")
    want = plain_logits(tmp_path / "bf16", tie=True)
    spec = {"path": str(tmp_path / "bf16")}
    for got in run_ranks(pretrained_engine, 2, spec, 3, {"tie": True, "wrapped": True}):
        assert torch.allclose(got["logits"], want, rtol=1e-5, atol=1e-6)  # bf16 values, converted exactly
        assert any("the model's names carry the prefix 'model.'" in n for n in got["notes"])


@pytest.mark.slow
def test_a_new_head_keeps_the_models_own_init_when_named(tmp_path: Path) -> None:
    from transformers import LlamaModel

    torch.manual_seed(7)
    LlamaModel(llama_config()).save_pretrained(tmp_path / "base")  # no lm_head, names without `model.`
    spec = {"path": str(tmp_path / "base"), "newParameters": ["lm_head.*"]}
    got = run_ranks(pretrained_engine, 2, spec, 3, {})[0]
    assert any("weights' names" not in n and "lm_head.weight" in n for n in got["notes"])
    with pytest.raises(WeightsError, match=r"lm_head\.weight"):
        _match(tmp_path / "base", {})


def _match(path: Path, extra: dict[str, Any], tie: bool = False) -> Any:
    from transformers import LlamaForCausalLM

    from zerotrain.runtime.construction.pretrained import match

    spec = PretrainedSpec.model_validate({"path": str(path), **extra})
    return match(LlamaForCausalLM(llama_config(tie)), open_weights(spec.path), spec)


def test_what_does_not_fit_is_refused_naming_the_field_the_value_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"spec\.model\.pretrained\.path.*does not exist"):
        open_weights(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError, match="holds no safetensors weights"):
        open_weights(tmp_path / "empty")
    save_llama(tmp_path / "sharded")
    (tmp_path / "sharded" / "model-00002-of-00006.safetensors").unlink()
    with pytest.raises(WeightsError, match=r"names model-00002-of-00006\.safetensors, which is missing"):
        open_weights(tmp_path / "sharded")

    state = {k: v for k, v in save_llama(tmp_path / "one", shard="1GB").state_dict().items()}
    bad = dict(state, **{"model.norm.weight": torch.ones(31)})
    save_file(bad, tmp_path / "shape.safetensors")
    with pytest.raises(WeightsError, match=r"model\.norm\.weight has shape \[31\] in the weights but"):
        _match(tmp_path / "shape.safetensors", {})

    renamed = {k.replace("mlp.", "ffn."): v for k, v in state.items()} | {"extra.bias": torch.zeros(2)}
    save_file(renamed, tmp_path / "names.safetensors")
    with pytest.raises(WeightsError) as e:
        _match(tmp_path / "names.safetensors", {})
    message = " ".join(str(e.value).split())
    assert "7 of the weights' are not in the model (extra.bias, model.layers.0.ffn." in message
    assert "6 of the model's tensors are not in the weights (model.layers.0.mlp." in message
    assert "newParameters" in message and "unusedKeys" in message

    save_file(dict(state, **{"model.norm.weight": torch.ones(32, dtype=torch.int32)}), tmp_path / "int.safetensors")
    with pytest.raises(WeightsError, match="stored as I32, which a parameter cannot be converted from"):
        _match(tmp_path / "int.safetensors", {})
    found = _match(tmp_path / "one", {})
    assert found.unused == [] and found.new == [] and str(found.rule) == "exact names"
    assert _match(tmp_path / "names.safetensors", {"newParameters": ["*.mlp.*"], "unusedKeys": ["*.ffn.*", "extra.*"]})


def checkpoint_of_llama(rank: int, world: int, root: str) -> None:
    from zerotrain.runtime import ZeroConfig, ZeroEngine

    torch.manual_seed(7)
    task = llama(rank, world)
    engine = ZeroEngine(
        task.model, ZeroConfig(stage=3, unit_modules=["LlamaDecoderLayer"]), lambda g: torch.optim.SGD(g, lr=0.1)
    )
    checkpoint.save(engine, root)


@pytest.mark.slow
def test_a_zerotrain_export_and_checkpoint_are_weights_too(tmp_path: Path) -> None:
    from zerotrain.cli import main

    root = tmp_path / "ckpt"
    run_ranks(checkpoint_of_llama, 2, str(root))
    assert main(["checkpoint", "export", str(root), "--out", str(tmp_path / "export.safetensors")]) == 0
    save_llama(tmp_path / "hf")  # the same seed: the same weights
    want = plain_logits(tmp_path / "hf")
    for path in (root, tmp_path / "export.safetensors"):
        for got in run_ranks(pretrained_engine, 3, {"path": str(path)}, 2, {}):
            assert torch.allclose(got["logits"], want, rtol=1e-5, atol=1e-6), path
