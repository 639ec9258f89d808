"""Progress reports from the runtime's rank 0 into its ZeroTrainingJob's status, through the kubernetes client.

The operator gives every job's pods a ServiceAccount whose Role allows exactly one thing: `patch` on
`zerotrainingjobs/status` for this job's name. Rank 0 merge-patches `status.step`, `status.lastCheckpoint`,
`status.lastEvaluation`, `status.stragglers` and `status.gangClock`; the operator never writes those fields, so
neither side overwrites the other.

`report_progress` is a no-op outside a job (ZEROTRAIN_JOB_NAME unset, e.g. `zerotrain run`) and never
raises into training: a failed report is logged and training goes on.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import kubernetes

from zerotrain.pod_contract import (
    JOB_NAME_ENV,
    NAMESPACE_ENV,
    SERVICE_ACCOUNT_DIR,
    SERVICE_ACCOUNT_DIR_ENV,
    STATUS_API_ENV,
)
from zerotrain.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

SA_DIR = Path(SERVICE_ACCOUNT_DIR)
TIMEOUT_SECONDS = 5.0


def _api_url() -> str | None:
    if url := os.environ.get(STATUS_API_ENV):
        return url.rstrip("/")
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@dataclass(frozen=True)
class Progress:
    """What one report carries."""

    step: int
    """The latest optimizer step."""
    checkpoint: tuple[int, str] | None = None
    """A newly committed checkpoint: (its step, its path)."""
    evaluation: tuple[int, float] | None = None
    """A new evaluation: (the step it followed, its loss)."""
    stragglers: list[dict[str, object]] | None = None
    """A new straggler verdict (`Straggler.status` of each rank named; empty: cleared)."""
    clock: dict[str, object] | None = None
    """A reading of the gang's clock (`gang_clock.Timekeeper.reading`, on the wire) for the goodput ledger."""


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(progress: Progress) -> dict[str, object]:
    """The merge patch for the job (camelCase, as the CRD's status schema names the fields)."""
    status: dict[str, object] = {"step": int(progress.step)}
    if progress.checkpoint is not None:
        step, path = progress.checkpoint
        status["lastCheckpoint"] = {"step": int(step), "path": path, "time": _now()}
    if progress.evaluation is not None:
        step, loss = progress.evaluation
        status["lastEvaluation"] = {"step": int(step), "loss": float(loss), "time": _now()}
    if progress.stragglers is not None:
        status["stragglers"] = progress.stragglers  # a merge patch replaces a list whole: [] clears it
    if progress.clock is not None:
        status["gangClock"] = progress.clock
    return {"status": status}


def report_progress(progress: Progress) -> None:
    """Record the latest optimizer step (and a newly committed checkpoint or evaluation) in the job's status."""
    name, namespace = os.environ.get(JOB_NAME_ENV), os.environ.get(NAMESPACE_ENV)
    if not name:
        return
    try:
        _patch(name, namespace or "default", status_body(progress))
    except Exception as e:  # reports are advisory; training must never fail because of one
        log.warning("could not report step %s to %s/%s: %s", progress.step, namespace, name, e)


def _api(base: str) -> kubernetes.client.ApiClient:
    """A client for `base` with the pod's service-account token (re-read each time: bound tokens rotate) and CA."""
    config = kubernetes.client.Configuration()
    config.host = base
    sa_dir = Path(os.environ.get(SERVICE_ACCOUNT_DIR_ENV) or SA_DIR)
    token_file = sa_dir / "token"
    if token_file.exists():
        config.api_key = {"authorization": token_file.read_text().strip()}
        config.api_key_prefix = {"authorization": "Bearer"}
    ca = sa_dir / "ca.crt"
    if base.startswith("https://") and ca.exists():
        config.ssl_ca_cert = str(ca)
    return kubernetes.client.ApiClient(config)


def _patch(name: str, namespace: str, body: dict[str, object]) -> None:
    base = _api_url()
    if base is None:
        raise RuntimeError(f"no API server address: set KUBERNETES_SERVICE_HOST or {STATUS_API_ENV}")
    with _api(base) as client:
        kubernetes.client.CustomObjectsApi(client).patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            body,
            # A dict would otherwise go as the first JSON type the endpoint lists, a JSON Patch.
            _content_type="application/merge-patch+json",
            _request_timeout=TIMEOUT_SECONDS,
        )
