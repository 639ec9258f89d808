"""How examples/llama-tiny/tokenizer.json was made: a byte-level BPE of 2,048 tokens trained on the Python standard
library's own top-level sources (no download). Run again to remake it (the standard library of another Python
version gives a slightly different vocabulary; the committed file is the one the example uses).

    python examples/llama-tiny/train_tokenizer.py examples/llama-tiny
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 2048
EOS = "<|endoftext|>"


def main(out: Path) -> None:
    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train([str(p) for p in sources], trainer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "bos_token": EOS, "model_max_length": 256}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"{tokenizer.get_vocab_size()} tokens from {len(sources)} files into {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent))
