"""Instruction records (`zerotrain data prepare --format prompt-completion|chat`) as the runtime batches them: the
answers' tokens counted and nothing else, padded or packed rows, packed records kept apart by the model, the same
global batches at any world size, refusals before the model is built; and training on them equals one process's
mean over every counted token of the global batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tiny_models import TINY_DECODER
from tokenizers import Tokenizer, models, pre_tokenizers

from zerotrain.cli import main
from zerotrain.runtime.job.record_data import RecordBatches, RecordFiles, Rows
from zerotrain.runtime.job.task import ConfigError

pytest.importorskip("transformers")

WORDS = ["<eos>", "[UNK]", "what", "is", "plus", "=", *[str(i) for i in range(20)], "reverse", ":", "a", "b", "c"]
VOCAB = 64
LLAMA = {"model_type": "llama", **TINY_DECODER, "vocab_size": VOCAB}


def tokenizer(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    t = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    return directory / "tokenizer.json"


def arithmetic(path: Path, n: int, seed: int = 0) -> Path:
    """Prompt-completion records of uneven lengths: "what is a plus b =" → "c", some with a longer prompt."""
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for _ in range(n):
            a, b = (int(x) for x in rng.integers(0, 10, 2))
            prompt = " ".join(["what is"] * int(rng.integers(1, 4))) + f" {a} plus {b} ="
            f.write(json.dumps({"prompt": prompt, "completion": f"{a + b}" if a + b < 20 else "19"}) + "\n")
    return path


def prepare(tmp_path: Path, n: int = 40, *extra: str) -> Path:
    tok = tokenizer(tmp_path / "tok")
    records = arithmetic(tmp_path / "records.jsonl", n)
    out = tmp_path / "data"
    args = ["data", "prepare", str(records), "--format", "prompt-completion", "--tokenizer", str(tok)]
    assert main([*args, "--out", str(out), "--val-fraction", "0.25", *extra]) == 0
    return out


def test_a_padded_row_counts_the_completion_and_its_end(tmp_path: Path) -> None:
    out = prepare(tmp_path)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format"] == "prompt-completion" and meta["records"] == {"train": 30, "val": 10}
    files = RecordFiles(str(out / "train.bin"), "train")
    ids, mask = files.record(0, 100)
    words = [WORDS[i] for i in ids]
    assert words[-1] == "<eos>" and words[-3] == "="  # prompt ... =, then the answer and the end
    assert mask.tolist() == [False] * (len(ids) - 2) + [True, True]
    batches = RecordBatches(files, Rows(seq_len=16, batch_size=4, rank=0, world_size=1))
    row = batches.global_batch(0)
    first = batches.plan.row(0)[0]
    ids, mask = files.record(first, 17)
    labels = row["labels"][0].tolist()
    counted = [i for i, x in enumerate(labels) if x != -100]
    # Label i predicts token i+1: the answer and <eos>, at the positions just before them.
    assert [labels[i] for i in counted] == ids[mask].tolist() and counted == [len(ids) - 3, len(ids) - 2]
    assert row["position_ids"][0].tolist() == list(range(16))


def test_packed_rows_keep_records_whole_apart_and_positioned_from_zero(tmp_path: Path) -> None:
    files = RecordFiles(str(prepare(tmp_path) / "train.bin"), "train")
    batches = RecordBatches(files, Rows(16, 4, 0, 1, packing=True))
    for k in range(3):
        batch = batches.global_batch(k)
        for j, row in enumerate(range(k * 4, k * 4 + 4)):
            records = batches.plan.row(row)
            positions = batch["position_ids"][j].tolist()
            starts = [i for i, p in enumerate(positions) if p == 0]
            assert len(starts) >= len(records)  # each record from 0 (then the padding, from 0 too)
            labels = batch["labels"][j].tolist()
            for s in starts[1:]:
                assert labels[s - 1] == -100  # no label crosses into the next record
    assert sum(len(batches.plan.row(j)) for j in range(len(batches.plan.epochs[0]))) == len(files)


def test_the_global_batch_is_the_same_at_every_world_size(tmp_path: Path) -> None:
    files = RecordFiles(str(prepare(tmp_path) / "train.bin"), "train")
    for packing in (False, True):
        whole = RecordBatches(files, Rows(16, 4, 0, 1, packing), seed=3)
        halves = [RecordBatches(files, Rows(16, 4, r, 2, packing), seed=3) for r in range(2)]
        for k in range(12):  # past an epoch: a new permutation
            got = [h.global_batch(k, h.rows) for h in halves]
            for key in ("input_ids", "labels", "position_ids"):
                assert torch.equal(torch.cat([g[key] for g in got]), whole.global_batch(k)[key])


def test_the_model_keeps_packed_records_apart(tmp_path: Path) -> None:
    """A packed row's logits are each record's own, as if it ran alone (Llama and GPT-2)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    files = RecordFiles(str(prepare(tmp_path) / "train.bin"), "train")
    batches = RecordBatches(files, Rows(24, 1, 0, 1, packing=True))
    row = next(j for j in range(10) if len(batches.plan.row(j)) >= 2)
    batch = batches.global_batch(row)
    torch.manual_seed(0)
    # Without a key/value cache, as the runtime builds them: transformers reads packed rows from the positions then.
    llama = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"}, use_cache=False))
    gpt2 = GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False, eos_token_id=0)
    )
    for model in (llama.eval(), gpt2.eval()):
        with torch.no_grad():
            packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
            cursor = 0
            for r in batches.plan.row(row):
                ids, _ = files.record(r, 25)
                alone = model(input_ids=torch.from_numpy(ids)[None, : len(ids)]).logits[0]
                torch.testing.assert_close(
                    packed[cursor : cursor + len(ids)], alone[: 24 - cursor], rtol=1e-5, atol=1e-5
                )
                cursor += len(ids)


def test_records_cut_beyond_max_truncated_are_refused_naming_seq_len(tmp_path: Path) -> None:
    from zerotrain.runtime.models.huggingface import build

    out = prepare(tmp_path)
    args = {"config": LLAMA, "train": str(out / "train.bin"), "batch_size": 2}
    with pytest.raises(ConfigError, match=r"entrypointArgs.seq_len: got 4, but 30 of 30 records of train \(100.0%\)"):
        build(0, 1, seq_len=4, **args)
    task = build(0, 1, seq_len=4, max_truncated=1.0, **args)  # allowed: every answer is cut away, though
    assert task.loss(type("O", (), {"logits": torch.zeros(2, 4, VOCAB)})(), next(task.batches)).count == 0
    np.arange(100, dtype="<u2").tofile(tmp_path / "tokens.bin")
    with pytest.raises(ConfigError, match=r"entrypointArgs\.packing: set, but the data are token files"):
        build(0, 1, config=LLAMA, train=str(tmp_path / "tokens.bin"), seq_len=8, batch_size=2, packing=True)


def test_data_prepared_with_another_tokenizer_than_the_models_is_refused(tmp_path: Path) -> None:
    from zerotrain.runtime.models.huggingface import build

    out = prepare(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA))
    t = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "other": 1}, unk_token="[UNK]"))
    t.save(str(model / "tokenizer.json"))
    with pytest.raises(
        ConfigError, match=r"entrypointArgs.train: prepared with the tokenizer .* \(digest [0-9a-f]{16}\)"
    ):
        build(0, 1, config=str(model), train=str(out / "train.bin"), seq_len=16, batch_size=2)
    tokenizer(model)  # the very tokenizer the data were prepared with
    build(0, 1, config=str(model), train=str(out / "train.bin"), seq_len=16, batch_size=2)


def losses(rank: int, world: int, out: str, steps: int, accumulation: int) -> list[float]:
    from zerotrain.runtime.job.train import RankContext, train
    from zerotrain.spec import ZeroTrainingJobSpec

    spec = ZeroTrainingJobSpec.model_validate(
        {
            "entrypoint": "zerotrain.runtime.models.huggingface:build",
            "entrypointArgs": {"config": LLAMA, "train": out, "seq_len": 16, "batch_size": 4, "packing": True},
            "nprocPerNode": world,
            "zero": {"stage": 2, "gradientAccumulationSteps": accumulation},
            "training": {"steps": steps, "optimizer": {"lr": 0.01, "eps": 1e-6}},
            "metrics": {"enabled": False},
        }
    )
    return train(spec, RankContext(rank, world, rank)).losses


def reference(out: str, steps: int, accumulation: int) -> list[float]:
    """One process, the global batch of each step: transformers' model, Σ loss over every counted token / count."""
    from zerotrain.runtime.models.huggingface import build

    torch.manual_seed(0)
    task = build(0, 1, config=LLAMA, train=out, seq_len=16, batch_size=4, packing=True)
    opt = torch.optim.AdamW(task.model.parameters(), lr=0.01, eps=1e-6, weight_decay=0.0)  # the spec's defaults
    seen = []
    for _ in range(steps):
        opt.zero_grad()
        parts = [task.loss(task.model(**task.inputs(b)), b) for b in (next(task.batches) for _ in range(accumulation))]
        loss = sum(p.total for p in parts) / sum(int(p.count) for p in parts)
        loss.backward()
        opt.step()
        seen.append(float(loss.detach()))
    return seen


@pytest.mark.slow
def test_training_on_records_equals_one_process_mean_over_every_counted_token(tmp_path: Path) -> None:
    from dist_helpers import run_ranks

    out = str(prepare(tmp_path, 80) / "train.bin")
    got = run_ranks(losses, 2, out, 10, 2, timeout=240)
    assert got[0] == got[1]
    want = run_ranks(_reference_in_a_rank, 1, out, 10, 2)[0]
    torch.testing.assert_close(got[0], want, rtol=1e-6, atol=1e-6)


def _reference_in_a_rank(rank: int, world: int, out: str, steps: int, accumulation: int) -> Any:
    return reference(out, steps, accumulation)  # one thread, as the ranks


def test_too_few_held_out_records_are_refused_saying_why_in_records(tmp_path: Path) -> None:
    from zerotrain.runtime.job.evaluation import too_few
    from zerotrain.runtime.job.record_data import EvalRecordBatches

    out = prepare(tmp_path, 44)  # every fourth record held out: 11
    held = EvalRecordBatches(RecordFiles(str(out / "val.bin"), "eval"), Rows(24, 16, 0, 2))
    assert len(held) == 0
    message = str(too_few(1, len(held), held))
    assert "got 1, but the task's evaluation data holds only 0 micro-batches per rank" in message, message
    assert "its 11 held-out records make 11 rows (one a row: seq_len 24), 0 full global micro-batch(es) of " in message
    assert "entrypointArgs.batch_size 16 (8 rows on each of 2 ranks)" in message and "drop spec.training" in message
