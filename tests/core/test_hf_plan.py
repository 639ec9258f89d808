"""Planning a Hugging Face model from its config, without torch: Ψ, one decoder layer's and the root's parameters
equal what transformers builds for every family counted (llama, mistral, qwen2, mixtral, gpt2; tied weights once),
and `zerotrain plan -f` on a manifest of the built-in entry point prints the whole peak with no parameters typed. A
config only the pods can read derives nothing, as in the operator, and specs that state their model plan as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from zerotrain.architecture import block_parameters, parameters, root_parameters
from zerotrain.cli import main
from zerotrain.hf_config import HF_ENTRYPOINT, architecture, local_files, read_config
from zerotrain.plan.activations import hf_activations
from zerotrain.plan.inputs import declared_parameters, memory_plan, peak_input
from zerotrain.plan.peak import padded_elements
from zerotrain.spec import ZeroTrainingJobSpec

transformers = pytest.importorskip("transformers")

SMALL = {"vocab_size": 100, "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 6}
CONFIGS = {
    "llama untied, biases": {
        "model_type": "llama",
        **SMALL,
        "intermediate_size": 80,
        "num_key_value_heads": 2,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "llama tied, head_dim": {
        "model_type": "llama",
        **SMALL,
        "intermediate_size": 80,
        "head_dim": 16,
        "tie_word_embeddings": True,
    },
    # num_key_value_heads left to mistral's default, 8: as many as the heads here.
    "mistral": {"model_type": "mistral", **SMALL, "num_attention_heads": 8, "intermediate_size": 96},
    "qwen2 tied": {
        "model_type": "qwen2",
        **SMALL,
        "intermediate_size": 64,
        "num_key_value_heads": 3,
        "tie_word_embeddings": True,
    },
    "qwen3 head_dim, biases": {
        "model_type": "qwen3",
        **SMALL,
        "intermediate_size": 64,
        "num_key_value_heads": 3,
        "head_dim": 12,
        "attention_bias": True,
    },
    "mixtral": {
        "model_type": "mixtral",
        **SMALL,
        "intermediate_size": 40,
        "num_key_value_heads": 2,
        "num_local_experts": 5,
        "num_experts_per_tok": 2,
    },
    "gpt2": {"model_type": "gpt2", "vocab_size": 100, "n_embd": 48, "n_layer": 3, "n_head": 6, "n_positions": 80},
    "gpt2 untied, n_inner": {
        "model_type": "gpt2",
        "vocab_size": 100,
        "hidden_size": 48,
        "num_hidden_layers": 2,
        "n_head": 4,
        "n_inner": 70,
        "tie_word_embeddings": False,
    },
}


def _built(config: dict[str, Any]) -> Any:
    fields = {k: v for k, v in config.items() if k != "model_type"}
    return transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(config["model_type"], **fields)
    )


def _layers(model: Any) -> Any:
    return model.model.layers if hasattr(model, "model") else model.transformer.h


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_count_is_the_transformers_models(name: str, tmp_path: Path) -> None:
    config = CONFIGS[name]
    model = _built(config)
    total = sum(p.numel() for p in model.parameters())  # each tied parameter once
    layers = _layers(model)
    block = sum(p.numel() for p in layers[0].parameters())
    # The inline fields (the rest transformers' defaults) and config.json as save_pretrained writes it count alike.
    model.config.save_pretrained(tmp_path)
    assert read_config(str(tmp_path)) is None  # outside local_files, as in the operator
    with local_files():
        saved = read_config(str(tmp_path))
    assert saved is not None
    for fields in (config, saved):
        a = architecture(fields)
        assert a is not None
        assert parameters(a) == total
        assert (a.layers, block_parameters(a), root_parameters(a)) == (len(layers), block, total - len(layers) * block)
        text = model.config.get_text_config()
        assert (a.hidden, a.heads, a.vocabulary) == (text.hidden_size, text.num_attention_heads, text.vocab_size)


def _manifest(tmp_path: Path, args: dict[str, Any], model: dict[str, Any] | None = None) -> Path:
    path = tmp_path / "hf.yaml"
    spec = {
        "image": "local",
        "entrypoint": HF_ENTRYPOINT,
        "entrypointArgs": args,
        "replicas": 2,
        "resources": {"gpu": 1, "gpuMemory": "80Gi"},
        "zero": {"stage": 3, "precision": "bf16"},
        "model": model or {},
    }
    doc = {"apiVersion": "zerotrain.dev/v1alpha1", "kind": "ZeroTrainingJob", "metadata": {"name": "hf"}, "spec": spec}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_plan_f_prints_the_whole_peak_from_the_config_with_no_parameters_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = CONFIGS["llama untied, biases"]
    model = _built(config)
    model.config.save_pretrained(tmp_path / "llama")
    total = sum(p.numel() for p in model.parameters())
    args = {"config": str(tmp_path / "llama"), "train": "data/train.bin", "seq_len": 32, "batch_size": 4}
    path = _manifest(tmp_path, args)

    assert main(["plan", "-f", str(path), "--output", "json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["parameters"] == total
    assert all(stage["peak"] is not None for stage in planned["stages"])
    assert main(["plan", "-f", str(path)]) == 0
    assert "whole peak per rank" in capsys.readouterr().out

    # The units are the model's exactly: each decoder layer, and the root (embedding, final norm, untied head).
    spec = ZeroTrainingJobSpec.model_validate(yaml.safe_load(path.read_text())["spec"])
    assert peak_input(spec) is None  # as the operator plans it: it reads no file a job names
    with local_files():
        pi = peak_input(spec)
    assert pi is not None
    block = sum(p.numel() for p in _layers(model)[0].parameters())
    assert pi.blocks == [padded_elements(block, 2)] * 3
    assert pi.root == padded_elements(total - 3 * block, 2)
    # Activations: the Llama family's own forward for 32 tokens × this rank's 2 of the 4 rows, in bf16
    # (tests/core/test_hf_activations.py holds them to what torch allocates).
    a = architecture(config)
    assert a is not None
    with local_files():
        assert (pi.activations, pi.activations_in_block) == hf_activations(spec, a)[:2]


def test_a_config_only_the_pods_can_read_derives_nothing_and_stated_models_plan_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerotrain.operator.controller.admission import plan_for

    def spec(args: dict[str, Any], model: dict[str, Any] | None = None) -> ZeroTrainingJobSpec:
        raw = yaml.safe_load(_manifest(tmp_path, args, model).read_text())["spec"]
        return ZeroTrainingJobSpec.model_validate(raw)

    # The operator cannot read a directory mounted in the pods: no Ψ, no plan, no failure.
    unseen = spec({"config": "/models/llama-3-8b"})
    assert declared_parameters(unseen) is None and peak_input(unseen) is None
    assert plan_for(unseen, None) is None
    assert main(["plan", "-f", str(tmp_path / "hf.yaml")]) == 2
    assert "the model's size is not known: write spec.model.architecture with" in capsys.readouterr().err

    # An inline config is readable anywhere: the operator plans it (whole peak included).
    inline = spec({"config": CONFIGS["mixtral"], "seq_len": 16})
    verdict = plan_for(inline, None)
    assert verdict is not None and verdict[0].parameters == sum(
        p.numel() for p in _built(CONFIGS["mixtral"]).parameters()
    )
    assert all(s.peak is not None for s in verdict[0].stages)

    # A counted field that is not a count is refused, naming it.
    with pytest.raises(ValueError, match=r"spec.entrypointArgs.config.hidden_size: got 'big'; it must be a positive"):
        declared_parameters(spec({"config": {**CONFIGS["mixtral"], "hidden_size": "big"}}))
    # A model_class other than a causal LM has other parameters: nothing is derived.
    assert declared_parameters(spec({"config": CONFIGS["mixtral"], "model_class": "MixtralModel"})) is None
    # A stated count or shape wins, as for any entry point.
    stated = spec({"config": CONFIGS["mixtral"]}, {"parameters": 1234})
    assert declared_parameters(stated) == 1234 and peak_input(stated) is None
    shape = {"layers": 2, "hidden": 32, "heads": 4, "sequenceLength": 16, "vocabulary": 96, "microBatchSize": 1}
    shaped = spec({"config": CONFIGS["mixtral"]}, {"shape": shape})
    assert memory_plan(shaped).parameters == declared_parameters(shaped) != verdict[0].parameters


def test_the_plan_imports_neither_torch_nor_transformers() -> None:
    import subprocess
    import sys

    code = (
        "import sys, zerotrain.hf_config, zerotrain.plan.inputs; "
        "assert not {'torch', 'transformers'} & set(sys.modules), sorted({'torch', 'transformers'} & set(sys.modules))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_operator_reads_no_config_a_job_names_and_the_cli_reads_the_user_s_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerotrain.operator.controller.admission import admit

    # A directory the operator's own filesystem happens to hold: a job naming it must learn nothing of it.
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "config.json").write_text("not json: a secret")
    path = _manifest(tmp_path, {"config": str(tmp_path / "probe"), "train": "data/train.bin"})
    spec = yaml.safe_load(path.read_text())["spec"]
    verdict = admit(spec, "hf")
    assert verdict.admitted and "secret" not in verdict.message, verdict.message
    assert main(["plan", "-f", str(path)]) == 2  # the user's own file, read by the command
    assert "is not valid JSON" in capsys.readouterr().err
