"""A LoRA job through `zerotrain run`: its checkpoints hold what trains (the size of the adapters and their optimizer
state, not of the model) and refer to the base by digest; a resume is bit-exact, a resume at another world size
continues, a base changed since is refused before any rank starts, naming both digests; and its exports load in
peft (`--format peft`, no missing keys, the engine's logits) and transformers (`--merge`, in the dtype written)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from budget import budget
from test_run_resume import run

pytest.importorskip("peft")

VOCAB = 96
LLAMA = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def base_model(path: Path, seed: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**LLAMA)).save_pretrained(path)
    return path


def lora_job(tmp_path: Path, base: Path, steps: int) -> Path:
    np.random.default_rng(5).integers(0, VOCAB, 20_000, dtype=np.uint16).astype("<u2").tofile(tmp_path / "train.bin")
    doc = {
        "apiVersion": "zerotrain.dev/v1alpha1",
        "kind": "ZeroTrainingJob",
        "metadata": {"name": "lora"},
        "spec": {
            "entrypoint": "zerotrain.runtime.models.huggingface:build",
            "entrypointArgs": {
                "config": str(base),
                "train": str(tmp_path / "train.bin"),
                "seq_len": 16,
                "batch_size": 4,
            },
            "nprocPerNode": 2,
            "zero": {"stage": 3},
            "model": {"pretrained": {"path": str(base)}, "lora": {"rank": 4, "alpha": 8, "targetModules": TARGETS}},
            "training": {"steps": steps, "optimizer": {"lr": 0.01}},
            "checkpoint": {"intervalSteps": 2, "keepLast": 5},
        },
    }
    path = tmp_path / f"lora-{steps}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def by_step(root: Path) -> dict[int, Path]:
    return {int(p.parent.name.split("-")[1]): p.parent for p in root.glob("step-*/COMMITTED")}


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """The command in this process: an export needs no ranks, and seven interpreters starting torch cost more than
    the exports themselves."""
    from zerotrain.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return subprocess.CompletedProcess(["zerotrain", *argv], code, out.getvalue(), err.getvalue())


def adapters(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


@pytest.mark.slow
@pytest.mark.timeout(600)  # four runs and two exports: 173 s in CI once, over 300 s under the whole suite's load
def test_a_lora_job_saves_its_adapters_resumes_exactly_and_exports_for_peft_and_transformers(tmp_path: Path) -> None:
    base = base_model(tmp_path / "base", seed=1)
    ck = tmp_path / "ck"
    whole, _ = run(tmp_path, lora_job(tmp_path, base, 4), "whole", ck)
    saved = by_step(ck)
    assert sorted(saved) == [2, 4]
    marker = json.loads((saved[4] / "COMMITTED").read_text())
    assert marker["origin"]["base"]["path"] == str(base) and len(marker["origin"]["base"]["digest"]) == 16

    # The checkpoint is the adapters, their fp32 masters and Adam moments (and each rank's own state): no tensor of
    # the frozen units, which the base holds.
    adapter_elements = 2 * sum(4 * (i + o) for i, o in layer_shapes())  # rank 4, two layers
    frozen = {i for i, unit in enumerate(marker["model"]) if unit["unit"].endswith("/frozen")}
    held = model_state_bytes(saved[4], frozen)
    assert 12 * adapter_elements <= held <= 1.1 * 12 * adapter_elements, (held, adapter_elements)

    # Resume at step 2: steps 3 and 4 again, bit for bit.
    again = tmp_path / "again"
    shutil.copytree(saved[2], again / saved[2].name)
    resumed, output = run(tmp_path, lora_job(tmp_path, base, 4), "resumed", again)
    assert "the frozen parameters from" in output
    assert resumed["losses"] == whole["losses"][2:]
    assert_same_adapters(export_peft(again, tmp_path / "peft-again"), export_peft(ck, tmp_path / "peft"))

    # At another world size: one rank takes both halves of every global batch.
    one = tmp_path / "one"
    shutil.copytree(saved[2], one / saved[2].name)
    single, _ = run(tmp_path, lora_job(tmp_path, base, 4), "single", one, "--nproc", "1")
    assert single["losses"] == pytest.approx(whole["losses"][2:], rel=1e-5)

    check_exports(tmp_path, ck, base)
    check_base_changed(tmp_path, ck, base)


def model_state_bytes(checkpoint: Path, frozen: set[int]) -> int:
    """Bytes of masters and optimizer state in a checkpoint's rank files; none may be a frozen unit's."""
    from safetensors.torch import load_file

    total = 0
    for f in checkpoint.glob("rank-*.safetensors"):
        for name, t in load_file(str(f)).items():
            if name.startswith("master."):
                assert int(name.split(".")[1]) not in frozen, name
            if name.startswith(("master.", "optim.")):
                total += t.numel() * t.element_size()
    return total


def layer_shapes() -> list[tuple[int, int]]:
    h, i, kv = LLAMA["hidden_size"], LLAMA["intermediate_size"], 16
    return [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]


def export_peft(ck: Path, out: Path) -> Path:
    proc = cli("checkpoint", "export", str(ck), "--format", "peft", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def assert_same_adapters(a: Path, b: Path) -> None:
    x, y = adapters(a), adapters(b)
    assert sorted(x) == sorted(y)
    assert all(torch.equal(x[k], y[k]) for k in x)


def check_exports(tmp_path: Path, ck: Path, base: Path) -> None:
    """The adapters load in peft with no key missing and give the engine's logits; merged, transformers loads them
    in the dtype the export wrote."""
    import peft
    from transformers import AutoModelForCausalLM

    from zerotrain.lora_config import LoraSpec
    from zerotrain.runtime.models.lora import apply

    out = tmp_path / "peft"
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["task_type"]) == (4, 8, "CAUSAL_LM")
    assert sorted(config["target_modules"]) == sorted(TARGETS)
    assert all(k.startswith("base_model.model.model.layers.") and ".default" not in k for k in adapters(out))

    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("peft").addHandler(handler)
    with _no_missing_keys(messages):
        tuned = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(out))
    with torch.no_grad():
        peft_logits = tuned(tokens).logits

    # The engine's model: the base with the runtime's adapters, every tensor as the checkpoint holds it.
    whole = tmp_path / "whole.safetensors"
    assert cli("checkpoint", "export", str(ck), "--out", str(whole)).returncode == 0
    from safetensors.torch import load_file

    engine = apply(AutoModelForCausalLM.from_pretrained(base), LoraSpec(rank=4, alpha=8, target_modules=TARGETS))
    engine.load_state_dict(load_file(str(whole)))
    with torch.no_grad():
        engine_logits = engine(tokens).logits
    torch.testing.assert_close(peft_logits, engine_logits, rtol=1e-5, atol=1e-5)

    merged = tmp_path / "merged"
    proc = cli("checkpoint", "export", str(ck), "--format", "huggingface", "--merge", "--out", str(merged))
    assert proc.returncode == 0, proc.stderr
    with torch.no_grad():
        merged_logits = AutoModelForCausalLM.from_pretrained(merged)(tokens).logits
    torch.testing.assert_close(merged_logits, engine_logits, rtol=1e-5, atol=1e-5)

    half = tmp_path / "merged-bf16"
    proc = cli(
        "checkpoint", "export", str(ck), "--format", "huggingface", "--merge", "--dtype", "bf16", "--out", str(half)
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    assert AutoModelForCausalLM.from_pretrained(half).dtype == torch.bfloat16

    proc = cli("checkpoint", "export", str(ck), "--format", "huggingface", "--out", str(tmp_path / "unmerged"))
    assert proc.returncode == 2 and "add --merge" in proc.stderr
    assert not (tmp_path / "unmerged").exists()


class _no_missing_keys:
    """peft only warns about adapter keys it did not find: none may be missing."""

    def __init__(self, messages: list[str]) -> None:
        self.messages = messages

    def __enter__(self) -> None:
        import warnings

        self.caught = warnings.catch_warnings(record=True)
        self.warned: Any = self.caught.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc: object) -> None:
        self.caught.__exit__(*exc)
        said = [str(w.message) for w in self.warned] + self.messages
        assert not [m for m in said if "missing" in m.lower()], said


def check_base_changed(tmp_path: Path, ck: Path, base: Path) -> None:
    """Another base at the same path: refused before any rank starts, naming both digests."""
    recorded = json.loads((max(by_step(ck).values()) / "COMMITTED").read_text())["origin"]["base"]["digest"]
    shutil.rmtree(base)
    base_model(base, seed=2)
    job = lora_job(tmp_path, base, 6)
    proc = subprocess.run(
        [sys.executable, "-m", "zerotrain.cli", "run", str(job), "--no-metrics", "--checkpoint-dir", str(ck)],
        capture_output=True,
        text=True,
        timeout=budget(240),
        cwd=tmp_path,
    )
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "spec.model.pretrained.path: got" in said and f"digest {recorded}" in said and "logs:" not in proc.stdout
    export = cli("checkpoint", "export", str(ck), "--format", "huggingface", "--merge", "--out", str(tmp_path / "x"))
    assert export.returncode == 2 and recorded in export.stderr
