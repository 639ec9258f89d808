"""Every fenced block of README.md and docs/*.md is of a kind these tests check, and each is checked:

- ```yaml: a whole ZeroTrainingJob passes `zerotrain validate` and runs 2 steps with `zerotrain run` (a GPU job
  validates; its run is skipped, saying why). A fragment (`spec:` with some fields, fields indented as under
  `spec:`, or a job's head with `spec: ...`) is laid onto examples/quickstart.yaml, and that manifest must validate.
  Chart values would be rendered with the chart. Any other YAML fails until it is given a check here.
- ```python: parses; its imports import; `engine.<name>` (and the names bound from its methods' results) exist
  on `ZeroEngine`, and keyword arguments are ones the callee takes.
- ```sh / ```bash / ```console: their commands, in test_doc_commands.py.
- ``` (none) and ```text: output samples (a run's tables, a checkpoint's layout): nothing to execute.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from doc_run import Ran, classify, cli, gpu_count, ranks, render, scratch_dir, validate
from md_extract import CONSOLE_LANGS, SHELL_LANGS, Block, blocks, doc_files

OUTPUT_LANGS = {"", "text"}
YAML_LANGS = {"yaml", "yml"}
KNOWN_LANGS = OUTPUT_LANGS | YAML_LANGS | SHELL_LANGS | CONSOLE_LANGS | {"python"}

ALL_BLOCKS = [b for f in doc_files() for b in blocks(f)]
YAML_BLOCKS = [b for b in ALL_BLOCKS if b.lang in YAML_LANGS]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "python"]


def where(b: Block) -> str:
    return b.where


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("doc-blocks")


def test_the_docs_have_blocks_of_every_checked_kind() -> None:
    assert YAML_BLOCKS and PYTHON_BLOCKS and len(ALL_BLOCKS) > 20


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=where)
def test_every_block_is_of_a_kind_that_is_checked(block: Block) -> None:
    assert block.lang in KNOWN_LANGS, (
        f"{block.where}: a ```{block.lang} block; tests/docs checks {sorted(KNOWN_LANGS)}: use one of those, or "
        "teach tests/docs/test_doc_blocks.py to check this kind"
    )


def _failed(what: str, ran: Ran) -> str:
    return f"{what}: `{' '.join(ran.argv)}` exited {ran.returncode}\n{ran.tail()}"


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=where)
def test_yaml_block_is_valid(block: Block, scratch: Path) -> None:
    kind = classify(block)
    assert kind.kind != "unknown", (
        f"{block.where}: this YAML is neither a ZeroTrainingJob, a fragment of one (`spec:` ..., fields indented "
        f"as under `spec:`, or `spec: ...`) nor chart values; tests/docs cannot check it:\n{block.text}"
    )
    if kind.kind == "helm-values":
        from doc_run import HelmCommand, chart_util

        objects = render(HelmCommand("install", "zerotrain-operator", chart_util.CHART_DIR, values=kind.values or {}))
        assert any(o["kind"] == "Deployment" for o in objects), f"{block.where}: the chart renders no Deployment"
        return
    assert kind.manifest is not None
    own_entrypoint = kind.kind != "manifest" and "entrypoint:" in block.text  # merged into the quickstart's args
    ran = validate(kind.manifest, scratch, no_import=own_entrypoint)
    assert ran.returncode == 0, _failed(f"{block.where} ({kind.kind})", ran)
    assert "is valid" in ran.stdout, ran.output


FULL_MANIFESTS = [b for b in YAML_BLOCKS if classify(b).kind == "manifest"]


@pytest.mark.slow
@pytest.mark.parametrize("block", FULL_MANIFESTS, ids=where)
def test_manifest_runs_two_steps(block: Block, scratch: Path) -> None:
    """`zerotrain run FILE --steps 2 --no-metrics --nproc min(ranks, 2)` exits 0."""
    manifest = yaml.safe_load(block.text)
    if gpus := gpu_count(manifest):
        params = (manifest["spec"].get("model") or {}).get("parameters")
        pytest.skip(
            f"{block.where}: spec.resources.gpu is {gpus}: sized for GPUs ({params or 'unknown'} parameters); "
            "`zerotrain run` would train it on CPU, building the whole model in every rank's host memory, which "
            "this machine cannot; it is validated above"
        )
    d = scratch_dir(scratch, f"run-{block.path.stem}-{block.line}", [])
    (d / "job.yaml").write_text(block.text)
    nproc = min(ranks(manifest), 2)
    ran = cli(["run", "job.yaml", "--steps", "2", "--no-metrics", "--nproc", str(nproc), "--log-dir", "logs"], d)
    assert ran.returncode == 0, _failed(block.where, ran)


# ---------------------------------------------------------------------------------------------------------------
# Python blocks


def _annotations(obj: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(obj)
    except Exception:  # an annotation only a type checker can resolve
        return {}


def _has(cls: type, name: str) -> bool:
    if hasattr(cls, name):
        return True
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    return name in getattr(cls, "model_fields", {}) or name in _annotations(cls)


def _keywords_taken(fn: Any) -> set[str] | None:
    """The keyword names `fn` takes; None when it takes any (**kwargs) or cannot be inspected."""
    fields = getattr(fn, "model_fields", None)
    if isinstance(fn, type) and fields is not None:  # a pydantic model: its fields by name and by alias
        if fn.model_config.get("extra") == "allow":  # type: ignore[attr-defined]
            return None
        return set(fields) | {f.alias for f in fields.values() if f.alias}
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=where)
def test_python_block_names_what_exists(block: Block) -> None:
    tree = ast.parse(block.text, filename=block.where)
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):  # a submodule, which the import itself loads
                    importlib.import_module(f"{node.module}.{alias.name}")
                assert hasattr(module, alias.name), f"{block.where}: {node.module} has no {alias.name}"
                names[alias.asname or alias.name] = getattr(module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name] = importlib.import_module(alias.name)
    from zerotrain.runtime import ZeroEngine

    # What the blocks call the engine; then the names bound from calls whose result type is known.
    types: dict[str, type] = {"engine": ZeroEngine}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1:
            target, func = node.targets[0], node.value.func
            if not isinstance(target, ast.Name):
                continue
            if isinstance(func, ast.Name) and isinstance(names.get(func.id), type):
                types[target.id] = names[func.id]
            elif isinstance(func, ast.Name) and callable(names.get(func.id)):  # a function: what it returns
                returned = _annotations(names[func.id]).get("return")
                if isinstance(returned, type):
                    types[target.id] = returned
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                owner = types.get(func.value.id) or names.get(func.value.id)  # a type's method, a module's function
                returned = _annotations(getattr(owner, func.attr, None)).get("return") if owner is not None else None
                if isinstance(returned, type):
                    types[target.id] = returned
    checked = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in types:
            cls = types[node.value.id]
            assert _has(cls, node.attr), (
                f"{block.where}: {node.value.id}.{node.attr}: {cls.__name__} has no {node.attr}"
            )
            checked += 1
        if isinstance(node, ast.Call) and node.keywords:
            fn: Any = None
            if isinstance(node.func, ast.Name):
                fn = names.get(node.func.id)
            elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
                owner = types.get(node.func.value.id) or names.get(node.func.value.id)
                fn = getattr(owner, node.func.attr, None) if owner is not None else None
            taken = _keywords_taken(fn) if fn is not None else None
            for kw in node.keywords:
                if taken is not None and kw.arg is not None:
                    assert kw.arg in taken, f"{block.where}: {ast.unparse(node.func)}() takes no {kw.arg}="
                    checked += 1
    assert checked, f"{block.where}: nothing in this block could be checked against the code"


def test_a_block_run_as_a_manifest_is_checked_by_validate(scratch: Path) -> None:
    """The validate helper refuses what the CLI refuses (so a passing yaml test means the CLI accepted it)."""
    bad = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml").read_text())
    bad["spec"]["replicas"] = 0
    ran = validate(bad, scratch)
    assert ran.returncode == 2 and "spec.replicas" in ran.output, ran.output
    assert cli(["validate", "--help"], scratch).returncode == 0
