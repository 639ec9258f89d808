"""zerotrain.runtime: the torch.distributed ZeRO runtime.

`ZeroConfig` (with `Stage` and `Precision`) lives in the torch-free core (`zerotrain.zero_config`) and is
re-exported here; the engine is loaded on first use.
"""

from __future__ import annotations

import warnings
from typing import Any

from zerotrain.zero_config import Precision, Stage, ZeroConfig

# torch's CPU wheel does not depend on numpy and warns at import when it is absent; the runtime never
# hands tensors to numpy, so the warning (printed once per rank) is only noise.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

__all__ = ["Precision", "Stage", "ZeroConfig", "ZeroEngine"]


def __getattr__(name: str) -> Any:
    if name == "ZeroEngine":
        from zerotrain.runtime.zero.engine import ZeroEngine

        return ZeroEngine
    raise AttributeError(f"module 'zerotrain.runtime' has no attribute {name!r}")
