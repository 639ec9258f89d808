"""A checkpoint's reference to the frozen base it was trained on, instead of the base itself.

A model with frozen parameters that come from `spec.model.pretrained` (a LoRA job's base) trains only the rest, so
its checkpoints hold only the rest: a frozen unit every parameter of which the pretrained weights hold is left out
of every rank file (its saved range is empty), and the marker's `origin` records the base instead: its path, a
digest of it (`zerotrain.weights_layout.digest`: its index, headers, sizes and samples of its bytes) and which
stored tensor each left-out parameter is. A LoRA job's checkpoint is then the size of its adapters and their
optimizer state. Resuming reads the base again (the ranks do, as they start) and refuses a base whose digest is
not the recorded one, naming both; an export reads the left-out parameters from it. Frozen parameters the weights
do not hold (initialised by the model) are saved as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerotrain.runtime.zero.engine_state import ShardLayout
from zerotrain.runtime.zero.partition import ParamClass

ORIGIN_KEY = "base"
"""The key of the base reference in a checkpoint marker's `origin`."""


@dataclass(frozen=True)
class BaseReference:
    """The frozen base a checkpoint leaves out."""

    path: str
    """Where the weights were read from (spec.model.pretrained.path)."""
    digest: str
    """`zerotrain.weights_layout.digest` of them."""
    names: dict[str, str]
    """Each frozen parameter the weights hold -> the stored tensor it was read from."""

    def record(self) -> dict[str, Any]:
        return {"path": self.path, "digest": self.digest, "names": self.names}

    @classmethod
    def of(cls, origin: Mapping[str, Any] | None) -> BaseReference | None:
        """The reference a marker's (or a run's) origin holds, if any."""
        held = (origin or {}).get(ORIGIN_KEY)
        if not isinstance(held, dict):
            return None
        return cls(str(held["path"]), str(held["digest"]), dict(held["names"]))


def left_out(layout: ShardLayout | list[dict[str, Any]], origin: Mapping[str, Any] | None) -> set[int]:
    """The units a checkpoint with this origin leaves out: frozen, and every parameter of them in the base. `layout`
    is the engine's, or a marker's model record."""
    base = BaseReference.of(origin)
    if base is None:
        return set()
    units = layout.model_record() if isinstance(layout, ShardLayout) else layout
    return {
        i
        for i, unit in enumerate(units)
        if unit["params"] and all(p[3] == ParamClass.FROZEN and p[0] in base.names for p in unit["params"])
    }


def mismatch(saved: Mapping[str, Any] | None, current: Mapping[str, Any] | None, where: str) -> str | None:
    """Why a checkpoint (its marker's origin `saved`) cannot resume a run whose base is `current`, or None: the base
    it left out must be the one the run reads, byte for byte as far as the digest tells."""
    before, now = BaseReference.of(saved), BaseReference.of(current)
    if before is None:
        return None
    if now is None:
        return (
            f"spec.model.pretrained: checkpoint {where} holds no frozen base (it refers to {before.path}, digest "
            f"{before.digest}), and this run reads none; set spec.model.pretrained.path to that base"
        )
    if now.digest != before.digest:
        return (
            f"spec.model.pretrained.path: got {now.path!r}, digest {now.digest}, but checkpoint {where} was trained on "
            f"{before.path}, digest {before.digest}; point path at the base it was trained on, or train afresh in "
            "another checkpoint directory"
        )
    return None


def check_resume(root: str | None, pretrained: str | None) -> str | None:
    """Before any rank starts: why the newest checkpoint under `root` cannot resume with the base at `pretrained`
    (None when it can, or there is none): the ranks refuse it too, as they start."""
    from zerotrain.runtime.checkpoints import checkpoint
    from zerotrain.weights_layout import digest

    newest = checkpoint.latest(root) if root else None
    if newest is None:
        return None
    saved = checkpoint.read_marker(newest).get("origin")
    before = BaseReference.of(saved)
    if before is None:
        return None
    current = None
    if pretrained is not None and Path(pretrained).exists():
        current = {ORIGIN_KEY: BaseReference(pretrained, digest(pretrained), {}).record()}
    return mismatch(saved, current, str(newest))
