"""Live tensor bytes on CPU, exactly: every storage an operator returns is counted until it is freed.

The CPU allocator keeps no statistics and RSS under glibc hides frees, so the planner's whole-peak prediction is
checked against this instead: a `TorchDispatchMode` sees every tensor any operator (factories, views, collectives'
outputs, autograd's own ops) hands back, counts its storage once (by the storage's identity) and stops counting it
when the storage is freed (a weak-reference finalizer). A storage resized in place (`UntypedStorage.resize_`, how
the runtime frees and re-allocates stage 3's gathered buffers without the tensors changing) is counted at its new
size: the mode wraps `resize_` while it is active. Entered before the model is built, it sees everything the
run allocates; `phase(name)` keeps the peak of each phase apart (forward, backward, step). Storages of `held`
tensors (a model's parameters, which the runtime counts in its own categories) are never counted, nor are views of
them. `bench/runtime/bench_plan.py` checks the plan with it; `zerotrain plan --measure` counts activations with it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """Bytes of tensor storages alive now, the peak since entering, and the peak per named phase."""

    def __init__(self, held: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._held = {t.untyped_storage()._cdata for t in held}
        self.live = 0
        self.peak = 0
        self.phase_peaks: dict[str, int] = {}
        self._phase: str | None = None
        self._sizes: dict[int, int] = {}
        self._resize: Any = None

    def track(self, t: torch.Tensor) -> None:
        if t.device.type == "meta":
            return
        self._storage(t.untyped_storage())

    def _storage(self, st: torch.UntypedStorage) -> None:
        key, n = st._cdata, st.nbytes()
        if key in self._sizes or key in self._held or n == 0:
            return
        self._sizes[key] = n
        self.live += n
        self._raise_peak()
        weakref.finalize(st, self._gone, key)

    def _gone(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def _resized(self, st: torch.UntypedStorage) -> None:
        key = st._cdata
        if key not in self._sizes:
            self._storage(st)
            return  # (a held storage stays uncounted)
        self.live += st.nbytes() - self._sizes[key]
        self._sizes[key] = st.nbytes()
        self._raise_peak()

    def __enter__(self) -> LiveBytes:
        resize = self._resize = torch.UntypedStorage.resize_
        tracker = self

        def counted(st: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
            out = resize(st, size)
            tracker._resized(st)
            return out

        # torch types `resize_` on its storage base class; this wrapper is for UntypedStorage, where it is installed.
        torch.UntypedStorage.resize_ = counted  # type: ignore[method-assign,assignment]
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]

    def _raise_peak(self) -> None:
        self.peak = max(self.peak, self.live)
        if self._phase is not None:
            self.phase_peaks[self._phase] = max(self.phase_peaks.get(self._phase, 0), self.live)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Attribute the peak reached inside the block to `name` (the live bytes on entry count too)."""
        before, self._phase = self._phase, name
        self._raise_peak()
        try:
            yield
        finally:
            self._phase = before

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out
