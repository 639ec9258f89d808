"""Each cross-field rule is stated once (`zerotrain._model.Rule`) and both of its forms agree: on every case, the CEL
the API server evaluates passes exactly when pydantic's predicate does, and every rule is seen both passing and
failing."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
from pydantic import ValidationError

from zerotrain._model import Rule, SpecModel
from zerotrain.spec import ZeroTrainingJobSpec

BASE = {"image": "img", "entrypoint": "m:f"}
SHAPE = {"layers": 2, "hidden": 128, "sequenceLength": 8, "vocabulary": 256, "microBatchSize": 1}
ARCH = {
    "family": "llama",
    "layers": 2,
    "hidden": 64,
    "intermediate": 128,
    "heads": 4,
    "vocabulary": 256,
    "positions": 512,
    "tiedEmbeddings": False,
}
CASES: list[dict[str, Any]] = [
    {"model": {"architecture": ARCH}},
    {"model": {"architecture": {**ARCH, "kvHeads": 2}}},
    {"model": {"architecture": {**ARCH, "kvHeads": 3}}},
    {"model": {"architecture": {**ARCH, "experts": 4}}},
    {"model": {"architecture": {**ARCH, "family": "mixtral", "experts": 4, "expertsPerToken": 2}}},
    {"model": {"architecture": {**ARCH, "family": "mixtral", "experts": 2, "expertsPerToken": 3}}},
    {"model": {"architecture": {**ARCH, "family": "mixtral"}}},
    {"zero": {"stage": "auto"}, "model": {"architecture": ARCH}, "resources": {"memory": "8Gi"}},
    {"resources": {"gpu": 0, "gpuMemory": "80Gi"}},
    {"resources": {"gpu": 1, "gpuMemory": "80Gi"}},
    {"resources": {"gpuMemory": "80Gi"}},
    {"failurePolicy": {"permanentExitCodes": [2, 3], "retryableExitCodes": [3]}},
    {"failurePolicy": {"permanentExitCodes": [2], "retryableExitCodes": [1]}},
    {"scheduling": {"gang": "volcano", "schedulerName": "default-scheduler"}},
    {"scheduling": {"gang": "volcano", "schedulerName": "volcano"}},
    {"scheduling": {"gang": "volcano"}},
    {"scheduling": {"gang": "coscheduling", "schedulerName": "scheduler-plugins"}},
    {"zero": {"offloadActivationCheckpoints": True}},
    {"zero": {"offloadActivationCheckpoints": True, "activationCheckpointing": True}},
    {"zero": {"gradientSync": "boundary"}},
    {"zero": {"gradientSync": "boundary", "precision": "bf16"}},
    {"zero": {"gradientSync": "every_micro_batch", "precision": "bf16"}},
    {"zero": {"gradientSync": "boundary", "precision": "fp32"}},
    {"zero": {"partitionActivations": True}},
    {"zero": {"partitionActivations": False}},
    {"nprocPerNode": 4, "resources": {"gpu": 2}},
    {"nprocPerNode": 4, "resources": {"gpu": 4}},
    {"resources": {"gpu": 1}},
    {"model": {"shape": {**SHAPE, "heads": 5}}},
    {"model": {"shape": {**SHAPE, "heads": 4}}},
    {"zero": {"stage": 2}},
    {"zero": {"stage": "auto"}},
    {"zero": {"stage": "auto"}, "model": {"parameters": 1000}},
    {"zero": {"stage": "auto"}, "model": {"parameters": 1000}, "resources": {"memory": "8Gi"}},
    {"zero": {"stage": "auto"}, "model": {"shape": {**SHAPE, "heads": 4}}, "resources": {"gpu": 1, "gpuMemory": "8G"}},
    {"zero": {"stage": "auto"}, "model": {"parameters": 1000}, "resources": {"gpu": 1}},
    {"replicas": 4, "zero": {"gradientAccumulationSteps": 3}, "elastic": {"minReplicas": 2, "maxReplicas": 4}},
    {"replicas": 4, "elastic": {"minReplicas": 5, "maxReplicas": 4}, "checkpoint": {"claimName": "c"}},
    {"replicas": 4, "elastic": {"minReplicas": 1, "maxReplicas": 3}, "checkpoint": {"claimName": "c"}},
    {"replicas": 2, "elastic": {"minReplicas": 2, "maxReplicas": 2}, "checkpoint": {"claimName": "c"}},
    {"replicas": 3, "nprocPerNode": 2, "zero": {"shardGroupSize": 4}},
    {"replicas": 2, "nprocPerNode": 2, "zero": {"shardGroupSize": 4}},
    {"replicas": 3, "nprocPerNode": 4, "zero": {"shardGroupSize": 6}},
    {"replicas": 4, "nprocPerNode": 4, "zero": {"shardGroupSize": 2}},
    {"replicas": 2, "nprocPerNode": 2, "zero": {"shardGroupSize": "pod"}},
    {"zero": {"shardGroupSize": "node"}},
    {"zero": {"offload": {"optimizer": "cpu"}}},
    {"zero": {"offload": {"optimizer": "cpu"}}, "resources": {"gpu": 1}},
    {"zero": {"offload": {"optimizer": "cpu"}, "stage": 0}, "resources": {"gpu": 1}},
    {"zero": {"offload": {"optimizer": "cpu"}, "stage": "auto"}, "resources": {"gpu": 1, "gpuMemory": "80Gi"}},
    {"zero": {"offload": {"optimizer": "cpu", "parameters": "cpu"}}, "resources": {"gpu": 1}},
    {"zero": {"offload": {"optimizer": "cpu", "parameters": "cpu"}, "stage": 2}, "resources": {"gpu": 1}},
    {"zero": {"offload": {"parameters": "cpu"}}, "resources": {"gpu": 1}},
    {"model": {"pretrained": {"path": "/pretrained", "subPath": "llama"}}},
    {"model": {"pretrained": {"path": "/pretrained", "claimName": "models", "subPath": "llama"}}},
    {"model": {"pretrained": {"path": "weights", "claimName": "models"}}},
    {"model": {"pretrained": {"path": "weights"}}},
    {"data": {"path": "/data", "subPath": "tokens"}},
    {"data": {"path": "/data", "claimName": "corpora", "subPath": "tokens"}},
    {"data": {"path": "data", "claimName": "corpora"}},
    {"training": {"steps": 10, "lrSchedule": {"warmupSteps": 20}}},
    {"training": {"steps": 10, "lrSchedule": {"warmupSteps": 10}}},
    {"training": {"lrSchedule": {"warmupSteps": 101}}},
    {"training": {"lrSchedule": {"decay": "linear"}}},
    {"model": {"lora": {"targetModules": ["q_proj"]}}},
    {"entrypoint": "train.py", "model": {"lora": {"targetModules": ["q_proj"]}}},
    {"entrypoint": "train.py"},
    {
        "replicas": 2,
        "nprocPerNode": 2,
        "zero": {"shardGroupSize": 4},
        "elastic": {"minReplicas": 1, "maxReplicas": 2},
        "checkpoint": {"claimName": "c"},
    },
    {
        "replicas": 2,
        "nprocPerNode": 2,
        "zero": {"shardGroupSize": 2},
        "elastic": {"minReplicas": 1, "maxReplicas": 2},
        "checkpoint": {"claimName": "c"},
    },
    {
        "replicas": 2,
        "elastic": {"minReplicas": 2, "maxReplicas": 2},
        "checkpoint": {"claimName": "c"},
        "scheduling": {"gang": "volcano"},
    },
]


def models(root: type[SpecModel] = ZeroTrainingJobSpec, path: str = "") -> list[tuple[str, type[SpecModel]]]:
    """Every model under the spec, by its path on the wire."""
    found = [(path, root)]
    for name, info in root.model_fields.items():
        for kind in (info.annotation, *getattr(info.annotation, "__args__", ())):
            if isinstance(kind, type) and issubclass(kind, SpecModel):
                found += models(kind, f"{path}.{info.alias or name}".lstrip("."))
    return found


RULES = [(path, model, rule) for path, model in models() for rule in model.rules]


def at(doc: dict[str, Any], path: str) -> dict[str, Any] | None:
    for part in filter(None, path.split(".")):
        if part not in doc:
            return None
        doc = doc[part]
    return doc


def refused(doc: dict[str, Any]) -> str:
    try:
        ZeroTrainingJobSpec.model_validate(doc)
    except ValidationError as e:
        return str(e)
    return ""


@pytest.mark.parametrize(("path", "model", "rule"), RULES, ids=[f"{p or 'spec'}:{r.cel[:40]}" for p, _, r in RULES])
def test_each_rule_s_cel_and_predicate_agree(path: str, model: type[SpecModel], rule: Rule) -> None:
    program = celpy.Environment().program(celpy.Environment().compile(rule.cel))
    seen = set()
    for patch in CASES:
        doc = {**BASE, **patch}
        target = at(doc, path)
        if target is None:
            continue  # the API server evaluates a rule only on an object that is there
        cel_ok = bool(program.evaluate({"self": celpy.json_to_cel(target)}))
        pydantic_ok = rule.message not in refused(doc)
        assert cel_ok == pydantic_ok, (patch, rule.cel)
        seen.add(cel_ok)
    assert seen == {True, False}, f"no case makes {rule.cel!r} {'fail' if True in seen else 'pass'}"


def test_every_model_rule_is_here() -> None:
    # Resources, ModelShape, Architecture's 3, PretrainedSpec's 2, DataSpec's 2, TrainingSpec, FailurePolicy,
    # Scheduling, the spec's 10, ZeroConfig's 6, elastic
    assert len(RULES) == 29
