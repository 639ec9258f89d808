"""`zerotrain plan -f JOB --fill`: write spec.model.architecture into the manifest from the model's config.json.

The operator plans a job from its manifest alone (it reads no file a job names), so a Hugging Face job carries its
model's architecture there: the family and the numbers its layers are made of. This reads the entry point's config
(the directory in entrypointArgs.config, or the fields inline) as the pods will, and writes the block into the
manifest in place, keeping everything else as it was (comments, order, quoting, the other documents of the file).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.text import Text
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from zerotrain import hf_config
from zerotrain.architecture import Architecture
from zerotrain.errors import UserError
from zerotrain.local_paths import load_document

COMMENT = (
    "What the plan counts the model from, written from its config.json by `zerotrain plan -f JOB --fill`: the\n"
    "operator plans the job (and chooses stage: auto) from it alone; the pods refuse it if the config differs."
)


def _yaml() -> YAML:
    y = YAML()
    y.preserve_quotes = True
    y.width = 4096  # never fold a long line the user wrote
    y.indent(mapping=2, sequence=4, offset=2)
    return y


def _job_document(documents: list[Any], path: str) -> CommentedMap:
    for doc in documents:
        if isinstance(doc, CommentedMap) and doc.get("kind") == "ZeroTrainingJob":
            return doc
    raise UserError(f"{path}: holds no ZeroTrainingJob document; --fill writes into a job's manifest")


def fill_command(path: str) -> int:
    """Write (or rewrite) the block; exit 0, or UserError naming what stops it."""
    # Unvalidated: the block is what a manifest may still lack to be valid (stage: auto needs it).
    spec = load_document(path, strict=False).get("spec") or {}
    entrypoint = spec.get("entrypoint") if isinstance(spec, dict) else None
    if entrypoint != hf_config.HF_ENTRYPOINT:
        raise UserError(
            f"{path}: --fill reads the config of the built-in Hugging Face entry point ({hf_config.HF_ENTRYPOINT}), "
            f"and spec.entrypoint is {entrypoint}; give your own model spec.model.parameters, or spec.model.shape "
            "and `--measure`'s spec.model.activationBytes"
        )
    args = spec.get("entrypointArgs")
    source = args.get("config") if isinstance(args, dict) else None
    with hf_config.local_files():
        try:
            config = hf_config.read_config(source)
        except ValueError as e:
            raise UserError(f"{path}: {e}") from None
    if config is None:
        raise UserError(
            f"{path}: {hf_config.FIELD}: got {source!r}, which holds no {hf_config.CONFIG_FILE} here; run --fill where "
            "the model's config is (save_pretrained's directory), or give the config's fields inline"
        )
    found = hf_config.architecture(config)
    if found is None:
        raise UserError(
            f"{path}: {hf_config.FIELD}: model_type {config.get('model_type')!r} is not one the plan counts "
            f"({', '.join(hf_config.FAMILIES)}); measure its activations with `zerotrain plan -f {path} --measure` "
            "into spec.model.activationBytes and give spec.model.parameters"
        )
    y = _yaml()
    file = Path(path)
    documents = list(y.load_all(file.read_text()))
    job = _job_document(documents, path)
    model = job["spec"].setdefault("model", CommentedMap())
    # The fields that differ from their defaults: the block stays as short as the model allows.
    block = found.model_dump(by_alias=True, exclude_defaults=True, mode="json")
    before = model.get("architecture")
    if _same(before, found):
        Console().print(Text(f"{path}: spec.model.architecture is up to date with {_where(source)}"), soft_wrap=True)
        return 0
    model["architecture"] = CommentedMap(block)
    if before is None:
        model.yaml_set_comment_before_after_key("architecture", before=COMMENT, indent=4)
    out = io.StringIO()
    y.dump_all(documents, out)
    file.write_text(out.getvalue())
    verb = "rewrote" if before is not None else "wrote"
    what = f"{found.family.value}, {found.layers} layers, hidden {found.hidden}, vocabulary {found.vocabulary}"
    Console().print(
        Text(
            f"{path}: {verb} spec.model.architecture ({what}) from {_where(source)}; the operator plans the job, and "
            "chooses stage: auto, from the manifest alone; the pods check it against the config they load"
        ),
        soft_wrap=True,
    )
    return 0


def _same(before: object, found: Architecture) -> bool:
    try:
        return Architecture.model_validate(before) == found
    except ValidationError:
        return False


def _where(source: object) -> str:
    return "the inline config" if isinstance(source, dict) else f"{source}/{hf_config.CONFIG_FILE}"
