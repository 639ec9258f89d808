"""One preflight everywhere: every refusal `zerotrain validate` makes, `zerotrain run` makes too, before any rank
starts: exit 2, the same message, once, and no rank's log directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from zerotrain.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
ARGS = QUICKSTART["spec"]["entrypointArgs"]
SHAPE = QUICKSTART["spec"]["model"]["shape"]

# (what is wrong, the spec's patch, a phrase of the refusal)
REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("a field's value", {"zero": {"stage": 5}}, "spec.zero.stage"),
    ("memory below the process", {"resources": {"memory": "300Mi"}}, "no more than the 360.0 MB a rank process holds"),
    ("memory below the plan", {"resources": {"memory": "460Mi"}}, "set resources.memory to at least 489Mi"),
    ("an entry point that is not there", {"entrypoint": "no_such_module:build"}, "cannot be imported"),
    ("entrypointArgs it does not take", {"entrypointArgs": {**ARGS, "layers": 4}}, "does not accept them"),
    ("a wrong Ψ", {"model": {"parameters": 900_000}}, "spec.model.parameters: got 900,000"),
    ("units the model lacks", {"zero": {"stage": 3, "unitModules": ["Blocks"]}}, "zero.unitModules[0]: got 'Blocks'"),
    (
        "a shape that is not the data's",
        {"model": {"parameters": 842496, "shape": {**SHAPE, "microBatchSize": 16}}},
        "spec.model.shape.microBatchSize: got 16",
    ),
    (
        "evaluation without evaluation data",
        {"training": {**QUICKSTART["spec"]["training"], "evaluation": {"everySteps": 100, "batches": 2}}},
        "spec.training.evaluation: set, but",
    ),
    (
        "more evaluation batches than the data holds",
        {
            "entrypointArgs": {**ARGS, "eval_bytes": 20_000},
            "training": {**QUICKSTART["spec"]["training"], "evaluation": {"everySteps": 100, "batches": 50}},
        },
        "spec.training.evaluation.batches: got 50",
    ),
    ("a path found nowhere", {"entrypointArgs": {**ARGS, "text_dir": "no-such-dir"}}, "found it neither beside"),
    (
        "stage auto in a share the process fills",
        {"zero": {"stage": "auto"}, "resources": {"memory": "420Mi"}},
        "with 20% headroom, 450.0 MB; set resources.memory to at least 489Mi",
    ),
]


@pytest.mark.parametrize(("patch", "phrase"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_run_refuses_what_validate_refuses_once_before_any_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], patch: dict[str, Any], phrase: str
) -> None:
    doc = yaml.safe_load(yaml.safe_dump(QUICKSTART))
    doc["spec"].update(patch)
    (tmp_path / "job").mkdir()
    path = tmp_path / "job" / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 2
    refused = " ".join(capsys.readouterr().err.split())
    assert phrase in refused, refused
    message = refused.split(": ", 1)[1] if refused.startswith(f"error: {path}") else refused
    logs = tmp_path / "logs"
    assert main(["run", str(path), "--no-metrics", "--log-dir", str(logs)]) == 2
    said = capsys.readouterr()
    text = " ".join(said.err.split())
    assert text.count(phrase) == 1, text
    assert message.removeprefix("error: ")[-80:] in text, (message, text)  # the same refusal's words
    assert "logs:" not in said.out and not logs.exists(), said.out
    assert "Traceback" not in said.err
