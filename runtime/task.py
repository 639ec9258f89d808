"""The entry-point contract's first home, kept so entry points written against it still import: its names now
come from `zerotrain.runtime` (`from zerotrain.runtime import TrainingTask, ConfigError`)."""

from __future__ import annotations

import warnings

from zerotrain.runtime.job.task import ConfigError, TrainingTask

__all__ = ["ConfigError", "TrainingTask"]

warnings.warn(
    "zerotrain.runtime.task is deprecated: import TrainingTask and ConfigError from zerotrain.runtime",
    DeprecationWarning,
    stacklevel=2,
)
