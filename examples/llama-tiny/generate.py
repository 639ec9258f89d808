"""Generate a few tokens with `transformers` from a zerotrain export in Hugging Face format:

    python examples/llama-tiny/generate.py runs/llama-tiny-hf "def "

The export directory holds config.json and the tokenizer (`checkpoint export --copy-from examples/llama-tiny`) beside
model.safetensors, so `from_pretrained` reads it as it would any Hugging Face model.
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast


def main(model_dir: str, prompt: str, new_tokens: int = 40) -> str:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return str(tokenizer.decode(out[0]))


if __name__ == "__main__":
    print(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "def "))
