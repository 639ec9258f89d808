"""The training loop in-process at world size 1 with the real ZeroEngine: optimizer, accumulation, outputs."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from zerotrain.runtime.job.spec_bindings import optimizer_factory
from zerotrain.runtime.job.task import ConfigError
from zerotrain.runtime.job.train import RankContext, train
from zerotrain.spec import OptimizerName, OptimizerSpec, ZeroTrainingJobSpec

GPT_ARGS = {"seq_len": 32, "batch_size": 4, "d_model": 32, "n_layers": 2, "n_heads": 4, "max_bytes": 100_000}


def job_spec(**overrides: Any) -> ZeroTrainingJobSpec:
    doc: dict[str, Any] = {
        "image": "ghcr.io/zerotrain/runtime:0.1.0",
        "entrypoint": "zerotrain.runtime.examples.gpt:build",
        "entrypointArgs": GPT_ARGS,
        "zero": {"stage": 3},
        "training": {"steps": 12, "optimizer": {"lr": 0.003}},
    }
    for key, value in overrides.items():
        doc[key] = {**doc[key], **value} if key in ("zero", "training") else value
    return ZeroTrainingJobSpec.model_validate(doc)


@pytest.mark.parametrize(
    ("name", "cls", "extra"),
    [
        (OptimizerName.ADAMW, torch.optim.AdamW, {"weight_decay": 0.1, "betas": (0.8, 0.9)}),
        (OptimizerName.ADAM, torch.optim.Adam, {"eps": 1e-6}),
        (OptimizerName.SGD, torch.optim.SGD, {"momentum": 0.9}),
    ],
)
def test_optimizer_factory_builds_the_named_torch_optimizer(
    name: OptimizerName, cls: type[torch.optim.Optimizer], extra: dict[str, Any]
) -> None:
    spec = OptimizerSpec.model_validate({"name": name, "lr": 0.01, **extra})
    groups = [{"params": [torch.nn.Parameter(torch.zeros(3))]}, {"params": [], "weight_decay": 0.0}]
    opt = optimizer_factory(spec)(groups)
    assert type(opt) is cls
    assert opt.param_groups[0]["lr"] == 0.01
    for key, value in extra.items():
        assert opt.param_groups[0][key] == value
    assert opt.param_groups[1]["weight_decay"] == 0.0  # the engine's no-decay group keeps its override


@pytest.mark.parametrize("stage", [0, 3])
def test_loss_falls_and_rank0_writes_progress_and_summary(single_rank: Path, stage: int) -> None:
    torch.set_num_threads(1)
    spec = job_spec(zero={"stage": stage}, training={"steps": 12, "logEvery": 5})
    result = train(spec, RankContext(0, 1, 0))
    assert len(result.losses) == 12
    assert result.losses[-1] < result.losses[0] - 0.5
    progress = [json.loads(line) for line in (single_rank / "progress.jsonl").read_text().splitlines()]
    assert [r["step"] for r in progress] == [1, 5, 10, 12]  # every logEvery, plus first and last
    assert progress[-1]["loss"] == pytest.approx(result.losses[-1])
    assert all(r["tokens_per_s"] > 0 and r["grad_norm"] > 0 for r in progress)
    summary = json.loads((single_rank / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["stage"] == stage
    (rank0,) = summary["ranks"]
    memory = rank0["memory"]
    assert memory["parameter_bytes"] > 0 and memory["predicted_parameter_bytes"] > 0
    assert summary["tokens_per_s"] > 0 and summary["final_loss"] == result.losses[-1]


def test_gradient_accumulation_consumes_that_many_micro_batches(single_rank: Path) -> None:
    spec = job_spec(zero={"gradientAccumulationSteps": 3}, training={"steps": 2})
    result = train(spec, RankContext(0, 1, 0))
    # tokens_per_batch = 4 rows × 32 bytes; 3 micro-batches per step, 2 steps.
    assert result.tokens == 2 * 3 * 4 * 32
    assert len(result.losses) == 2


def test_running_out_of_batches_names_the_steps_field(
    single_rank: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "zt_short_data.py").write_text(
        "import torch\n"
        "from zerotrain.runtime.job.task import TrainingTask\n"
        "def build(rank, world_size):\n"
        "    model = torch.nn.Linear(2, 1)\n"
        "    batches = iter([torch.ones(1, 2)] * 3)\n"
        "    return TrainingTask(model=model, loss=lambda o, b: o.pow(2).mean(), batches=batches)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = job_spec(entrypoint="zt_short_data:build", entrypointArgs={}, training={"steps": 5})
    try:
        with pytest.raises(ConfigError, match=r"spec\.training\.steps: got 5.*ran out at step 4"):
            train(spec, RankContext(0, 1, 0))
    finally:
        sys.modules.pop("zt_short_data", None)


class _StatusApi(http.server.BaseHTTPRequestHandler):
    """Stands in for the API server's zerotrainingjobs/status endpoint; records every merge patch."""

    patches: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.patches.append((self.path, body))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: Any) -> None:
        return


def test_rank0_reports_its_step_into_the_job_status(single_rank: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StatusApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("ZEROTRAIN_STATUS_API", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setenv("ZEROTRAIN_JOB_NAME", "alpha")
        monkeypatch.setenv("ZEROTRAIN_NAMESPACE", "team")
        train(job_spec(training={"steps": 6, "logEvery": 2}), RankContext(0, 1, 0))
    finally:
        server.shutdown()
        server.server_close()
    paths = {path for path, _ in _StatusApi.patches}
    assert paths == {"/apis/zerotrain.dev/v1alpha1/namespaces/team/zerotrainingjobs/alpha/status"}
    steps = [body["status"]["step"] for _, body in _StatusApi.patches]
    assert steps[0] == 1 and steps[-1] == 6  # the first, then at most one per 10 s, and always the last
