"""Exact match of a model's greedy completions on records (`prompt`, `completion`), with or without adapters:

    python3 examples/sft-lora/evaluate.py runs/llama-tiny-hf runs/sft-lora/test.jsonl
    python3 examples/sft-lora/evaluate.py runs/llama-tiny-hf runs/sft-lora/test.jsonl --adapter runs/sft-lora-adapter

The base loads with transformers' `from_pretrained`, the adapters with peft's `PeftModel.from_pretrained`, as anyone
would load a zerotrain export; each prompt is completed greedily up to the end-of-text token (or 12 tokens), and a
completion counts when it is the record's, spaces at either end aside.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

BATCH = 64


def exact_match(model_dir: str, records: str, adapter: str | None = None) -> tuple[int, int]:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    eos = tokenizer.eos_token_id
    # Left padding keeps every prompt's last token at the end, where greedy decoding continues from; the attention
    # mask (and the positions generate derives from it) leaves the padding out.
    tokenizer.pad_token_id, tokenizer.padding_side = eos, "left"
    lines = [json.loads(line) for line in Path(records).read_text().splitlines()]
    right = 0
    for start in range(0, len(lines), BATCH):
        batch = lines[start : start + BATCH]
        ids = tokenizer([r["prompt"] for r in batch], add_special_tokens=False, padding=True, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=eos)
        said = tokenizer.batch_decode(out[:, ids.input_ids.shape[1] :], skip_special_tokens=True)
        right += sum(s.strip() == r["completion"].strip() for s, r in zip(said, batch, strict=True))
    return right, len(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a Hugging Face model directory (the base)")
    parser.add_argument("records", help="JSON Lines of prompt and completion")
    parser.add_argument("--adapter", help="a peft adapter directory (zerotrain checkpoint export --format peft)")
    args = parser.parse_args()
    right, total = exact_match(args.model, args.records, args.adapter)
    print(f"exact match: {right / total:.1%} ({right}/{total}){' with the adapters' if args.adapter else ''}")
