"""Reading ZeroTrainingJob manifests from YAML, with errors a user can act on."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from zerotrain.errors import UserError, describe_validation_error
from zerotrain.spec import KIND, ZeroTrainingJob, ZeroTrainingJobSpec


def parse_job(doc: Any, source: str = "manifest") -> ZeroTrainingJob:
    """Validate one manifest document; UserError names every bad field, its value and the fix."""
    if not isinstance(doc, dict):
        raise UserError(f"{source}: expected a {KIND} mapping, got {type(doc).__name__}")
    try:
        return ZeroTrainingJob.model_validate(doc)
    except ValidationError as e:
        raise UserError(f"{source} is invalid:\n{describe_validation_error(e, model=ZeroTrainingJob)}") from None


def parse_spec(spec: Any, source: str = "spec") -> ZeroTrainingJobSpec:
    """Validate a bare `spec` (as the operator receives it); field paths start with `spec.`."""
    try:
        return ZeroTrainingJobSpec.model_validate(spec)
    except ValidationError as e:
        raise UserError(describe_validation_error(e, prefix="spec", model=ZeroTrainingJobSpec)) from None


def load_job(path: str | Path) -> ZeroTrainingJob:
    """Read and validate the single ZeroTrainingJob in a YAML file."""
    return parse_job(load_job_document(path), source=str(path))


def load_job_document(path: str | Path) -> dict[str, Any]:
    """The single ZeroTrainingJob document of a YAML file, as written (not yet validated)."""
    p = Path(path)
    try:
        docs = [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
    except OSError as e:
        raise UserError(f"{p}: cannot read manifest ({e.strerror}); check the path") from None
    except yaml.YAMLError as e:
        raise UserError(f"{p}: not valid YAML: {e}") from None
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(jobs) == 1:
        return jobs[0]
    if not jobs:
        kinds = [str(d.get("kind")) for d in docs if isinstance(d, dict)]
        close = difflib.get_close_matches(KIND, kinds, n=1, cutoff=0.8)
        if close:  # a misspelt kind, not another resource
            raise UserError(f"{p}: kind: got {close[0]!r}; did you mean {KIND!r}? set kind: {KIND}")
        found = f"kinds {', '.join(map(repr, kinds))}" if kinds else "no mapping"
        raise UserError(f"{p}: kind: no {KIND} document (found {found}); set kind: {KIND} in the job's document")
    raise UserError(f"{p}: expected exactly one {KIND} document, found {len(jobs)}; put one job per file")
