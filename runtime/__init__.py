"""zerotrain.runtime: the torch.distributed ZeRO runtime, and its public API.

What an entry point and a user of the engine import, from here and nowhere deeper (the subpackages `job`, `zero`,
`checkpoints`, `construction` and `models` are internal and move as the code does):

- the entry-point contract: `TrainingTask` (what `spec.entrypoint` returns), `LossSum` (a loss given as a sum over
  counted tokens, weighed alike across ranks and accumulation), `ConfigError` (a configuration the job cannot run:
  exit status 2, reported as the job's InvalidConfig condition);
- data helpers: `rank_rows` (this rank's rows of a global micro-batch), `TokenFiles`, `TokenBatches` and
  `EvalTokenBatches` (token files from `zerotrain data prepare`);
- the engine: `ZeroEngine`, `ZeroConfig`, `Stage`, `Precision`, and `EngineState` with its `ShardLayout` (what
  `ZeroEngine.state_dict()` returns and `load_state_dict()` takes);
- checkpoints from a loop of your own: `save_checkpoint(engine, root)` and `load_checkpoint(engine, path)`
  (sharded, committed, reloadable at another world size or stage).

`ZeroConfig` (with `Stage` and `Precision`) lives in the torch-free core (`zerotrain.zero_config`); the rest is
loaded on first use, so importing this package does not import torch.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from zerotrain.zero_config import Precision, Stage, ZeroConfig

if TYPE_CHECKING:
    from zerotrain.runtime.checkpoints.checkpoint import load_checkpoint, save_checkpoint
    from zerotrain.runtime.job.data import rank_rows
    from zerotrain.runtime.job.task import ConfigError, LossSum, TrainingTask
    from zerotrain.runtime.job.token_data import EvalTokenBatches, TokenBatches, TokenFiles
    from zerotrain.runtime.zero.engine import ZeroEngine
    from zerotrain.runtime.zero.engine_state import EngineState, ShardLayout

# torch's CPU wheel does not depend on numpy and warns at import when it is absent; the runtime never
# hands tensors to numpy, so the warning (printed once per rank) is only noise.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

# The public name → the internal module defining it.
_HOMES = {
    "ConfigError": "zerotrain.runtime.job.task",
    "TrainingTask": "zerotrain.runtime.job.task",
    "LossSum": "zerotrain.runtime.job.task",
    "rank_rows": "zerotrain.runtime.job.data",
    "TokenFiles": "zerotrain.runtime.job.token_data",
    "TokenBatches": "zerotrain.runtime.job.token_data",
    "EvalTokenBatches": "zerotrain.runtime.job.token_data",
    "ZeroEngine": "zerotrain.runtime.zero.engine",
    "EngineState": "zerotrain.runtime.zero.engine_state",
    "ShardLayout": "zerotrain.runtime.zero.engine_state",
    "save_checkpoint": "zerotrain.runtime.checkpoints.checkpoint",
    "load_checkpoint": "zerotrain.runtime.checkpoints.checkpoint",
}

__all__ = [
    "ConfigError",
    "EngineState",
    "EvalTokenBatches",
    "LossSum",
    "Precision",
    "ShardLayout",
    "Stage",
    "TokenBatches",
    "TokenFiles",
    "TrainingTask",
    "ZeroConfig",
    "ZeroEngine",
    "load_checkpoint",
    "rank_rows",
    "save_checkpoint",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'zerotrain.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
