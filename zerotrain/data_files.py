"""The files `zerotrain data prepare` writes and the runtime reads: one contract, torch-free.

DIR/meta.json says what the other files hold: `format` (text, or the records' chat or prompt-completion), the token
id `dtype`, the vocabulary, counts, and the digest of the tokenizer that made them (a model checks it against its
own). Text is DIR/train.bin and DIR/val.bin, token ids one document after another. Records add, per split, a mask
(one byte a token: 1 where the loss counts it) and an index (int64: where each record starts, and the end).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

META_FILE = "meta.json"
RECORD_FORMATS = ("chat", "prompt-completion")
"""The formats whose files hold records."""
PAIR_FORMAT = "preference"
"""The format whose records are preference pairs (records 2k and 2k + 1: pair k's chosen and rejected answers)."""
SUFFIXES = {"tokens": ".bin", "mask": ".mask", "index": ".idx"}
"""A record split's files, by what they hold: DIR/train.bin, DIR/train.mask, DIR/train.idx."""
NUMPY_DTYPES = {"uint16": "<u2", "uint32": "<u4"}
"""Token id dtypes, little-endian on every machine; the vocabulary decides between them."""
DTYPE_LIMITS = {"uint16": 2**16, "uint32": 2**32}
"""Token ids each dtype can hold."""


def digest_of(*parts: bytes) -> str:
    """A short SHA-256 of `parts`, as meta.json records digests."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()[:16]


def tokenizer_digest(tokenizer_json: Path) -> str:
    """The digest of a tokenizer.json: what the data records of the tokenizer that made them."""
    return digest_of(tokenizer_json.read_bytes())
