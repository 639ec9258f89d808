"""The plan's activations for Hugging Face models against what torch allocates: every family, three sequence
lengths, two micro-batch sizes, activation checkpointing off and on, LoRA off and on, in bf16 and fp32.

For each point the job's manifest carries `spec.model.architecture` (as `zerotrain plan -f JOB --fill` writes it),
the plan's figure is the larger of its two moments (backward's worst outside the blocks and inside them, what
`zerotrain plan -f JOB --output json` adds to the peak), and the measured figure is `zerotrain plan -f JOB
--measure-real`'s: the model built as the entry point builds it (LoRA's adapters as the runtime adds them), one
micro-batch of rank 0 of 2 ranks forward, the loss and backward on real CPU tensors, every tensor counted until it
is freed. The error is (planned - measured) / measured.

    python bench/runtime/bench_hf_plan.py                 # the whole grid, its table per family (docs/memory.md)
    python bench/runtime/bench_hf_plan.py --json out.json

tests/bench/test_bench_hf_plan.py runs a sample of the grid on every `make test` and the whole of it in the long
tier.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zerotrain.hf_config import HF_ENTRYPOINT, architecture, local_files
from zerotrain.plan.inputs import peak_input
from zerotrain.spec import ZeroTrainingJobSpec

WORLD = 2
"""Ranks of every job: the plan and the measurement are of rank 0's share of the global micro-batch."""
SEQS = (32, 64, 128)
ROWS = (1, 2)
"""Sequences per rank in a micro-batch."""
LORA_RANK = 8

# Shapes no other test uses; each family as transformers configures it (GPT-2's dropout 0.1 included).
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "vocab_size": 3000, "hidden_size": 128, "intermediate_size": 344,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 512},
    "mistral": {"model_type": "mistral", "vocab_size": 2500, "hidden_size": 96, "intermediate_size": 256,
                "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
                "max_position_embeddings": 512},
    "qwen2": {"model_type": "qwen2", "vocab_size": 4000, "hidden_size": 128, "intermediate_size": 352,
              "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
              "tie_word_embeddings": True, "max_position_embeddings": 512},
    "qwen3": {"model_type": "qwen3", "vocab_size": 3500, "hidden_size": 128, "intermediate_size": 384,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 48,
              "tie_word_embeddings": True, "max_position_embeddings": 512},
    "mixtral": {"model_type": "mixtral", "vocab_size": 2200, "hidden_size": 96, "intermediate_size": 192,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 512},
    "gpt2": {"model_type": "gpt2", "vocab_size": 3000, "n_embd": 128, "n_layer": 2, "n_head": 4, "n_positions": 512},
}  # fmt: skip
TARGETS = {
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "mixtral": ["q_proj", "k_proj", "v_proj", "o_proj"],  # its experts are not linear layers
}
GATED_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Point:
    """One job of the grid."""

    family: str
    seq: int
    rows: int
    checkpointing: bool
    lora: bool
    precision: str = "bf16"
    data: str = "tokens"
    """tokens (windows of a token file), padded or packed (instruction records)."""

    @property
    def name(self) -> str:
        parts = [self.family, f"s{self.seq}", f"b{self.rows}", self.precision]
        parts += ["ckpt"] * self.checkpointing + ["lora"] * self.lora + ([self.data] if self.data != "tokens" else [])
        return "-".join(parts)


def grid() -> list[Point]:
    """Every family × sequence length × rows × checkpointing × LoRA × precision."""
    return [
        Point(f, s, b, c, lo, p)
        for f, s, b, c, lo, p in itertools.product(FAMILIES, SEQS, ROWS, (False, True), (False, True), ("bf16", "fp32"))
    ]


def sample() -> list[Point]:
    """What `make test` runs: each family once, the combinations spread over them, and records padded and packed."""
    return [
        Point("llama", 64, 2, False, True, "bf16"),
        Point("mistral", 128, 1, True, False, "fp32"),
        Point("qwen2", 32, 2, True, True, "bf16"),
        Point("qwen3", 128, 2, False, False, "bf16"),
        Point("mixtral", 64, 1, True, False, "bf16"),
        Point("gpt2", 64, 2, False, True, "fp32"),
        Point("llama", 64, 2, False, False, "bf16", "packed"),
        Point("qwen3", 32, 2, True, True, "fp32", "padded"),
    ]


RECORDS_TOKENIZER = Path(__file__).resolve().parents[2] / "examples" / "llama-tiny" / "tokenizer.json"


def _records(root: Path) -> Path:
    """Prompt-completion records of varied lengths, prepared as `zerotrain data prepare` writes them."""
    rng = np.random.default_rng(0)
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "and",
        "then",
        "ran",
        "far",
        "away",
        "to",
        "see",
        "what",
        "was",
        "in",
        "the",
        "old",
        "house",
    ]
    lines = []
    for _ in range(200):
        prompt = " ".join(rng.choice(words, int(rng.integers(3, 14))))
        answer = " ".join(rng.choice(words, int(rng.integers(2, 10))))
        lines.append(json.dumps({"prompt": prompt, "completion": answer}))
    source = root / "records.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = root / "records"
    subprocess.run(
        [sys.executable, "-m", "zerotrain.cli", "data", "prepare", "--format", "prompt-completion", "--tokenizer",
         str(RECORDS_TOKENIZER), "--out", str(out), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    return out / "train.bin"


@contextmanager
def workspace() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="zerotrain-hf-plan-") as d:
        yield Path(d)


def spec_of(point: Point, root: Path) -> ZeroTrainingJobSpec:
    """The point's job: the family's config on disk, its data, and the architecture block --fill writes."""
    config = FAMILIES[point.family]
    model_dir = root / point.family
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config))
    args: dict[str, Any] = {"config": str(model_dir), "seq_len": point.seq, "batch_size": point.rows * WORLD}
    if point.data == "tokens":
        tokens = root / "train.bin"
        if not tokens.exists():
            np.random.default_rng(0).integers(0, 2000, 100_000).astype("<u2").tofile(tokens)
        args |= {"train": str(tokens), "token_dtype": "uint16"}
    else:
        records = root / "records" / "train.bin"
        if not records.exists():
            _records(root)
        args |= {"train": str(records), "packing": point.data == "packed", "max_truncated": 1.0}
    model: dict[str, Any] = {"architecture": architecture(config).to_wire()}  # type: ignore[union-attr]
    if point.lora:
        targets = TARGETS.get(point.family, GATED_TARGETS)
        model["lora"] = {"rank": LORA_RANK, "alpha": 16, "dropout": 0.05, "targetModules": targets}
    return ZeroTrainingJobSpec.model_validate(
        {
            "entrypoint": HF_ENTRYPOINT,
            "entrypointArgs": args,
            "nprocPerNode": WORLD,
            "zero": {"stage": 3, "precision": point.precision, "activationCheckpointing": point.checkpointing},
            "model": model,
        }
    )


def planned(spec: ZeroTrainingJobSpec) -> int:
    """The activation bytes the plan adds to the peak: the larger of its two moments."""
    p = peak_input(spec)
    assert p is not None
    return max(p.activations, p.activations_in_block or 0)


def measure(point: Point, root: Path) -> dict[str, Any]:
    """The point planned and measured."""
    from zerotrain.commands.measure import measure_activations

    spec = spec_of(point, root)
    plan = planned(spec)
    with local_files():
        real = measure_activations(spec, real=True)
    return {**asdict(point), "name": point.name, "planned": plan, "measured": real, "error": (plan - real) / real}


def table(rows: list[dict[str, Any]]) -> str:
    """Per family: the points, the error's range, and the worst under-plan."""
    out = ["| family | points | planned − measured | worst under-plan |", "|---|---|---|---|"]
    for family in FAMILIES:
        errors = [r["error"] for r in rows if r["family"] == family]
        if not errors:
            continue
        under = min(min(errors), 0.0)
        out.append(f"| {family} | {len(errors)} | {min(errors):+.2%} … {max(errors):+.2%} | {under:+.2%} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write every point's figures here")
    parser.add_argument("--sample", action="store_true", help="only the sample `make test` runs")
    args = parser.parse_args()
    rows = []
    with workspace() as root:
        for point in sample() if args.sample else grid():
            row = measure(point, root)
            rows.append(row)
            print(f"{row['name']:40s} planned {row['planned']:>11,} measured {row['measured']:>11,} "
                  f"{row['error']:+.2%}", flush=True)  # fmt: skip
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
