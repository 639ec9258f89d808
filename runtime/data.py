"""The data helpers' first home, kept so entry points written against it still import: its names now come from
`zerotrain.runtime` (`from zerotrain.runtime import rank_rows`)."""

from __future__ import annotations

import warnings

from zerotrain.runtime.job.data import TextBatches, rank_rows, read_text_corpus

__all__ = ["TextBatches", "rank_rows", "read_text_corpus"]

warnings.warn(
    "zerotrain.runtime.data is deprecated: import rank_rows (and the token-file batches) from zerotrain.runtime",
    DeprecationWarning,
    stacklevel=2,
)
