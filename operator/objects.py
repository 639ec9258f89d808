"""The two shapes every operator module passes around, named once."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]
"""An API object as the server sends it (decoded JSON): a job, a pod, a Service, a ConfigMap, an Event."""

Key = tuple[str, str]
"""(namespace, name) of a job: what the cache indexes by and a pass is for."""
