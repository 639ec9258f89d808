"""Bytes of activations autograd keeps for backward, measured from the tensors it saves.

During the engine's forward a `saved_tensors_hooks` pair sees every tensor autograd saves (for a
checkpointed unit only its inputs: the checkpoint's own hooks take the rest). Storages are counted
once (by storage identity); parameter storages (the model's own flat buffers, gathered or not, and the
shards) are left out, since they are counted as parameters. Nothing is copied: `pack` returns the tensor itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class SavedActivations:
    """The activation bytes the last forward saved for backward."""

    def __init__(self) -> None:
        self.last_bytes = 0
        self.peak_bytes = 0
        self._seen: set[int] = set()
        self._exclude: set[int] = set()

    @contextmanager
    def measure(self, parameter_storages: set[int]) -> Iterator[None]:
        self._seen, self._exclude, self.last_bytes = set(), parameter_storages, 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            self.observe(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self.peak_bytes = max(self.peak_bytes, self.last_bytes)

    def observe(self, t: torch.Tensor) -> None:
        """Count a tensor saved for backward (once per storage; parameters never). Also called by the activation
        offload, whose own hooks take the checkpointed inputs before the measuring hook would see them."""
        st = t.untyped_storage()
        key = st._cdata
        if key not in self._seen and key not in self._exclude and not isinstance(t, torch.nn.Parameter):
            self._seen.add(key)
            self.last_bytes += st.nbytes()
