"""Everything the `zerotrain` command calls in the runtime, in one narrow module.

The command's own modules import this one at the top and call `runtime_calls.<name>`; each name loads its runtime
module on first use, so `zerotrain --help`, `plan` and `validate --no-import` never import torch. The names are
typed for mypy through the imports below, which only a type checker reads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

# name → (module, its name there)
_HOMES: dict[str, tuple[str, str]] = {
    "StoredTensors": ("zerotrain.runtime.checkpoints.export", "StoredTensors"),
    "base_needed": ("zerotrain.runtime.checkpoints.export", "base_needed"),
    "export_dcp": ("zerotrain.runtime.checkpoints.export", "export_dcp"),
    "export_safetensors": ("zerotrain.runtime.checkpoints.export", "export_safetensors"),
    "inspect_checkpoints": ("zerotrain.runtime.checkpoints.export", "inspect"),
    "export_huggingface": ("zerotrain.runtime.checkpoints.export_hf", "export_huggingface"),
    "export_peft": ("zerotrain.runtime.checkpoints.export_lora", "export_peft"),
    "open_weights": ("zerotrain.runtime.construction.weight_files", "open_weights"),
    "check_entrypoint": ("zerotrain.runtime.job.entry_check", "check_entrypoint"),
    "Outcome": ("zerotrain.runtime.job.launch", "Outcome"),
    "launch": ("zerotrain.runtime.job.launch", "launch"),
    "local_plan": ("zerotrain.runtime.job.launch", "local_plan"),
    "preflight": ("zerotrain.runtime.job.launch", "preflight"),
    "scoped_environ": ("zerotrain.runtime.job.launch", "scoped_environ"),
    "read_ports": ("zerotrain.runtime.job.metrics_endpoint", "read_ports"),
    "match_on_meta": ("zerotrain.runtime.job.model_start", "match_on_meta"),
    "forks": ("zerotrain.runtime.job.rank_fork", "forks"),
    "rank_preload": ("zerotrain.runtime.job.rank_fork", "preload_for"),
    "start_rank_server": ("zerotrain.runtime.job.rank_fork", "start_server"),
    "LossSum": ("zerotrain.runtime.job.task", "LossSum"),
    "build_task": ("zerotrain.runtime.job.task", "build_task"),
    "call_model": ("zerotrain.runtime.job.task", "call_model"),
    "is_script": ("zerotrain.runtime.job.task", "is_script"),
    "describe_hf": ("zerotrain.runtime.models.huggingface", "describe"),
    "add_adapters": ("zerotrain.runtime.models.lora", "apply"),
    "apply_checkpointing": ("zerotrain.runtime.zero.activations", "apply_checkpointing"),
    "ZeroSetupError": ("zerotrain.runtime.zero.engine_errors", "ZeroSetupError"),
    "LiveBytes": ("zerotrain.runtime.zero.live_bytes", "LiveBytes"),
    "DTYPES": ("zerotrain.runtime.zero.precision", "DTYPES"),
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home[0]), home[1])
    globals()[name] = value  # loaded once
    return value
