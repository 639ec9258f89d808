"""zerotrain.runtime: the torch.distributed ZeRO runtime.

`config` is importable without torch; the engine is loaded on first use so the operator never pays
for (or needs) torch.
"""

from __future__ import annotations

from typing import Any

from zerotrain.runtime.config import Precision, Stage, ZeroConfig

__all__ = ["Precision", "Stage", "ZeroConfig", "ZeroEngine"]


def __getattr__(name: str) -> Any:
    if name == "ZeroEngine":
        from zerotrain.runtime.engine import ZeroEngine

        return ZeroEngine
    raise AttributeError(f"module 'zerotrain.runtime' has no attribute {name!r}")
