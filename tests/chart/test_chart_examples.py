"""examples/*.yaml are what `kubectl apply` accepts: ZeroTrainingJobs against the CRD's own schema (with the API
server's strict field validation: unknown fields refused) and the operator's admission (spec model, name, memory
plan), anything else against the Kubernetes schemas."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_util import ROOT, Obj

import zerotrain
from zerotrain.manifest import parse_job
from zerotrain.operator.controller.admission import admit
from zerotrain.spec import API_VERSION, KIND

EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))
CRD = yaml.safe_load((ROOT / "crds" / "zerotrainingjobs.zerotrain.dev.yaml").read_text())
RUNTIME_IMAGE = yaml.safe_load((ROOT / "charts" / "zerotrain-operator" / "values.yaml").read_text())["runtimeImage"]


def _closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed, as strict field validation treats it."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        listed = "properties" in schema and "additionalProperties" not in schema
        if listed and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def _crd_validator() -> jsonschema.Draft4Validator:
    (version,) = [v for v in CRD["spec"]["versions"] if v["name"] == API_VERSION.split("/")[1]]
    # OpenAPI v3.0 schemas use draft-4 semantics (boolean exclusiveMinimum); `nullable` is honoured below.
    schema = _closed(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    return jsonschema.Draft4Validator(schema)


def _docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _crd_errors(doc: Obj) -> list[str]:
    validator = _crd_validator()
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(_drop_nulls(doc))]


def _drop_nulls(node: Any) -> Any:
    """The API server treats null as absent for `nullable` fields; drop them before draft-4 validation."""
    if isinstance(node, dict):
        return {k: _drop_nulls(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_drop_nulls(v) for v in node]
    return node


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.yaml", "gpu-7b.yaml", "gpu-70b.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted(path: Path) -> None:
    docs = _docs(path)
    assert any(d.get("kind") == KIND for d in docs), f"{path.name} holds no {KIND}"
    for doc in docs:
        assert doc["metadata"]["name"], f"{path.name}: every object needs metadata.name"
        assert "namespace" not in doc["metadata"], f"{path.name}: leave the namespace to `kubectl -n`"
        if doc["kind"] == KIND:
            assert doc["apiVersion"] == API_VERSION
            errors = _crd_errors(doc)
            assert not errors, f"{path.name}: the CRD's schema refuses {errors}"
            parse_job(doc, source=path.name)  # the spec models (and the CEL rules' pydantic twins)
            verdict = admit(doc["spec"], doc["metadata"]["name"])  # what the operator decides, memory plan included
            assert verdict.admitted, f"{path.name}: the operator refuses it: {verdict.reason}: {verdict.message}"
        else:
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_the_chart_runtime_image(path: Path) -> None:
    """The released runtime image of this version, optionally a CUDA build (tag suffix -cuNNN) or the one with
    transformers (-hf, Dockerfile.runtime's EXTRAS=hf), for every example
    whose entry point ships in it (a custom job's code is in the user's own image, built FROM it)."""
    release = f"{RUNTIME_IMAGE['repository']}:{zerotrain.__version__}"
    for doc in _docs(path):
        if doc["kind"] == KIND and doc["spec"]["entrypoint"].startswith("zerotrain."):
            image = doc["spec"]["image"]
            variant = image.startswith(release + "-cu") or image == release + "-hf"
            assert image == release or variant, f"{path.name}: image {image}, want {release}"


def test_crd_validation_refuses_what_the_api_server_would() -> None:
    """The emulation above is strict: unknown fields, wrong types and out-of-range values fail."""
    good = next(d for d in _docs(ROOT / "examples" / "quickstart.yaml") if d["kind"] == KIND)
    assert not _crd_errors(good)
    for path, value in [
        (("spec", "replicaz"), 2),
        (("spec", "replicas"), 0),
        (("spec", "zero", "stage"), 4),
        (("spec", "resources", "cpu"), "lots"),
        (("spec", "training", "steps"), "ten"),
    ]:
        bad = copy.deepcopy(good)
        node = bad
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
        assert _crd_errors(bad), f"{'.'.join(path)}={value!r} was accepted"


@pytest.mark.parametrize("name", ["gpu-7b.yaml", "gpu-70b.yaml"])
def test_gpu_example_declares_the_parameters_of_its_model(name: str) -> None:
    """model.parameters feeds the admission memory plan: it must be the model's real Ψ (counted on the meta device,
    no memory allocated)."""
    torch = pytest.importorskip("torch")
    from zerotrain.runtime.examples.gpt import GPT

    job = next(d for d in _docs(ROOT / "examples" / name) if d["kind"] == KIND)
    args = job["spec"]["entrypointArgs"]
    with torch.device("meta"):
        model = GPT(
            seq_len=args["seq_len"], d_model=args["d_model"], n_layers=args["n_layers"], n_heads=args["n_heads"]
        )
    assert sum(p.numel() for p in model.parameters()) == job["spec"]["model"]["parameters"]
