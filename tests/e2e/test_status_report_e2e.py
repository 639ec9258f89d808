"""The runtime's progress reports land in the job's status, and the operator never overwrites them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from zerotrain.operator.client.kube import Kube, path_of
from zerotrain.pod_contract import SERVICE_ACCOUNT_DIR_ENV, STATUS_API_ENV
from zerotrain.runtime.job import status_report

from .cluster import Cluster, project_token, until_async
from .conftest import Operator
from .test_operator_api_errors_e2e import warnings_about
from .test_operator_e2e import start_job


async def test_report_progress_patches_step_checkpoint_and_evaluation(
    cluster: Cluster, operator: Operator, kube: Kube, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ns = cluster.namespace
    await start_job(kube, ns, "lambda", replicas=1)
    # As rank 0 in pod lambda-worker-0 would: with the job's runtime ServiceAccount, whose Role allows only this.
    pod = await asyncio.to_thread(kube.request, "GET", path_of("v1", "pods", ns, "lambda-worker-0"))
    await asyncio.to_thread(project_token, cluster, kube, "lambda-runtime", pod, tmp_path / "sa")
    monkeypatch.setenv(SERVICE_ACCOUNT_DIR_ENV, str(tmp_path / "sa"))
    monkeypatch.setenv("ZEROTRAIN_JOB_NAME", "lambda")
    monkeypatch.setenv("ZEROTRAIN_NAMESPACE", ns)
    monkeypatch.setenv(STATUS_API_ENV, cluster.configuration.host)
    checkpoint = status_report.Progress(40, checkpoint=(40, "/checkpoints/step-40"))
    await asyncio.to_thread(status_report.report_progress, checkpoint)
    await asyncio.to_thread(status_report.report_progress, status_report.Progress(41, evaluation=(41, 2.5)))
    job = await until_async(lambda: (j := kube.get_job(ns, "lambda")) and j["status"].get("step") == 41 and j)
    assert job["status"]["lastCheckpoint"]["step"] == 40
    assert job["status"]["lastCheckpoint"]["path"] == "/checkpoints/step-40"
    assert job["status"]["lastEvaluation"]["step"] == 41 and job["status"]["lastEvaluation"]["loss"] == 2.5
    await asyncio.sleep(1.2)  # resync passes: the operator must keep the runtime's fields
    job = await asyncio.to_thread(kube.get_job, ns, "lambda")
    assert job["status"]["step"] == 41 and job["status"]["phase"] == "Running"
    assert job["status"]["lastEvaluation"]["loss"] == 2.5

    # A straggler verdict: kept in status.stragglers (the CRD's schema has it), named by the operator with its pod
    # and node in condition Straggler, with a Warning Event; an empty verdict clears it.
    named = {"rank": 0, "cause": "input", "secondsPerStep": 0.3, "othersSecondsPerStep": 0.2, "windowSteps": 10}
    verdict = status_report.Progress(50, stragglers=[named | {"step": 50}])
    await asyncio.to_thread(status_report.report_progress, verdict)
    job = await until_async(lambda: (j := kube.get_job(ns, "lambda")) and straggler(j) and j)
    assert job["status"]["stragglers"] == [named | {"step": 50}]
    condition = straggler(job)
    assert condition["status"] == "True" and condition["reason"] == "SlowInput", condition
    assert condition["message"].startswith("rank 0 (pod lambda-worker-0"), condition
    assert await until_async(lambda: warnings_about(kube, ns, "lambda", "SlowInput"))
    await asyncio.to_thread(status_report.report_progress, status_report.Progress(60, stragglers=[]))
    job = await until_async(lambda: (j := kube.get_job(ns, "lambda")) and straggler(j)["status"] == "False" and j)
    assert job["status"]["stragglers"] == [] and straggler(job)["reason"] == "GangKeepsPace"


def straggler(job: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in job["status"].get("conditions", []) if c["type"] == "Straggler"), {})


def test_report_progress_is_a_noop_outside_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEROTRAIN_JOB_NAME", raising=False)
    monkeypatch.setenv(STATUS_API_ENV, "http://127.0.0.1:9")  # would fail if it tried
    status_report.report_progress(status_report.Progress(1, checkpoint=(1, "/x")))


def test_report_progress_never_raises(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("ZEROTRAIN_JOB_NAME", "j")
    monkeypatch.setenv(STATUS_API_ENV, "http://127.0.0.1:9")  # nothing listens on the discard port
    status_report.report_progress(status_report.Progress(5))
    assert "could not report step 5" in caplog.text
