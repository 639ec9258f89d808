"""A manifest's relative paths as the `zerotrain` command reads them: beside the manifest first, then in the
working directory, so `zerotrain run /elsewhere/ft.yaml` reads what `cd /elsewhere && zerotrain run ft.yaml` reads.

Entry-point modules are already looked for beside the manifest (`runtime.job.task.add_entrypoint_dirs`); this
does the same for the files a job names: the built-in entry points' file arguments, spec.model.pretrained.path and
spec.data.path. Each relative path that exists in one of the two places becomes that absolute path before the job
is checked or started, so the checks, the ranks and the checkpoint (which records the pretrained path an export
reads its config from) all see one absolute path. A relative path found in neither place is refused, naming both.

Paths on a claim (claimName set) are the pods' mount paths and stay as written, as do the files under them. The
pod's launcher reads its manifest from a ConfigMap, so none of this applies there: a pod's paths are its own.
spec.checkpoint.path is where the run writes, and stays relative to the working directory, as any command's output.
"""

from __future__ import annotations

import glob
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zerotrain.errors import UserError
from zerotrain.hf_config import HF_ENTRYPOINT
from zerotrain.lora_config import GPT_ENTRYPOINT
from zerotrain.spec import ZeroTrainingJob

PATH_ARGS: dict[str, tuple[str, ...]] = {HF_ENTRYPOINT: ("config", "train", "eval"), GPT_ENTRYPOINT: ("text_dir",)}
"""The built-in entry points' arguments that name files or directories (train and eval may be globs)."""


def resolve(
    spec: Mapping[str, Any], manifest: str | Path, cwd: Path | None = None, strict: bool = True
) -> dict[str, Any]:
    """`spec` (a manifest's raw spec mapping) with its relative paths made absolute (see the module). Not `strict`
    (`validate --no-import`, which checks only what the manifest carries): a path found nowhere stays as written."""
    where = (Path(manifest).resolve().parent, (cwd or Path.cwd()).resolve(), strict)
    out = dict(spec)
    claimed = _claimed_roots(spec)
    args = spec.get("entrypointArgs")
    if isinstance(args, Mapping):
        keys = PATH_ARGS.get(str(spec.get("entrypoint")), ())
        out["entrypointArgs"] = {
            k: _resolve_value(v, f"spec.entrypointArgs.{k}", where, claimed) if k in keys else v
            for k, v in args.items()
        }
    model = spec.get("model")
    if isinstance(model, Mapping) and isinstance(model.get("pretrained"), Mapping):
        out["model"] = {**model, "pretrained": _resolve_field(model["pretrained"], "spec.model.pretrained", where)}
    if isinstance(spec.get("data"), Mapping):
        out["data"] = _resolve_field(spec["data"], "spec.data", where)
    return out


def _claimed_roots(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """Mount paths of claims: paths under them exist in the pods, not here."""
    roots = []
    for section in (spec.get("data"), (spec.get("model") or {}).get("pretrained")):
        if isinstance(section, Mapping) and section.get("claimName") and isinstance(section.get("path"), str):
            roots.append(section["path"])
    return tuple(roots)


def _resolve_field(section: Mapping[str, Any], field: str, where: tuple[Path, Path, bool]) -> dict[str, Any]:
    if section.get("claimName") or not isinstance(section.get("path"), str):
        return dict(section)
    return {**section, "path": _resolve_one(section["path"], f"{field}.path", where)}


def _resolve_value(value: object, field: str, where: tuple[Path, Path, bool], claimed: tuple[str, ...]) -> object:
    if isinstance(value, str):
        on_claim = any(value == r or value.startswith(r.rstrip("/") + "/") for r in claimed)
        return value if on_claim else _resolve_one(value, field, where)
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return [_resolve_value(v, f"{field}[{i}]", where, claimed) for i, v in enumerate(value)]
    return value  # inline (a config's fields) or a type the entry point refuses itself


def _resolve_one(value: str, field: str, where: tuple[Path, Path, bool]) -> str:
    path = Path(value).expanduser()
    if path.is_absolute() or not value:
        return value
    for base in where[:2]:
        candidate = base / path
        if (glob.has_magic(value) and glob.glob(str(candidate))) or candidate.exists():
            return str(candidate)
    if not where[2]:
        return value
    places = (
        f"in the manifest's directory {where[0]}"
        if where[0] == where[1]
        else f"beside the manifest (in {where[0]}) nor in the working directory ({where[1]})"
    )
    found = "found nothing" if where[0] == where[1] else "found it neither"
    return _refuse(field, value, f"{found} {places}")


def _refuse(field: str, value: str, said: str) -> str:
    raise UserError(
        f"{field}: got {value!r}, but {said}; give a path that exists, relative to the manifest or absolute"
    )


def load_document(manifest: str | Path, strict: bool = True) -> dict[str, Any]:
    """The manifest's single ZeroTrainingJob document with its spec's relative paths resolved (unvalidated)."""
    from zerotrain.manifest import load_job_document

    doc = load_job_document(manifest)
    spec = doc.get("spec")
    return {**doc, "spec": resolve(spec, manifest, strict=strict)} if isinstance(spec, Mapping) else doc


def load_job(manifest: str | Path, strict: bool = True) -> ZeroTrainingJob:
    """`manifest.load_job` for the `zerotrain` command: its relative paths resolved (see the module); not `strict`
    where the command reads none of the job's files but perhaps its config (`plan -f`)."""
    from zerotrain.manifest import parse_job

    return parse_job(load_document(manifest, strict), source=str(manifest))
