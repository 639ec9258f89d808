"""Progress reports from the runtime's rank 0 into its ZeroTrainingJob's status (torch-free, stdlib only).

The operator gives every job's pods a ServiceAccount whose Role allows exactly one thing: `patch` on
`zerotrainingjobs/status` for this job's name. Rank 0 merge-patches `status.step` and
`status.lastCheckpoint`; the operator never writes those two fields, so neither side overwrites the other.

`report_progress` is a no-op outside a job (ZEROTRAIN_JOB_NAME unset, e.g. `zerotrain run`) and never
raises into training: a failed report is logged and training goes on.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from zerotrain.pod_contract import (
    JOB_NAME_ENV,
    NAMESPACE_ENV,
    SERVICE_ACCOUNT_DIR,
    SERVICE_ACCOUNT_DIR_ENV,
    STATUS_API_ENV,
)

log = logging.getLogger(__name__)

SA_DIR = Path(SERVICE_ACCOUNT_DIR)
SA_DIR_ENV = SERVICE_ACCOUNT_DIR_ENV
"""Overrides where the projected service-account token and CA are read (a kubelet stand-in in tests)."""
API_URL_ENV = STATUS_API_ENV
"""Overrides the API server URL (tests, or a proxy); by default the in-cluster service address is used."""
TIMEOUT_SECONDS = 5.0


def _api_url() -> str | None:
    if url := os.environ.get(API_URL_ENV):
        return url.rstrip("/")
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def status_body(step: int, checkpoint_step: int | None, checkpoint_path: str | None) -> dict[str, object]:
    """The merge patch for the job (camelCase, as the CRD's status schema names the fields)."""
    status: dict[str, object] = {"step": int(step)}
    if checkpoint_step is not None:
        status["lastCheckpoint"] = {
            "step": int(checkpoint_step),
            "path": checkpoint_path or "",
            "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    return {"status": status}


def report_progress(step: int, checkpoint_step: int | None = None, checkpoint_path: str | None = None) -> None:
    """Record the latest optimizer step (and a newly committed checkpoint) in the job's status."""
    name, namespace = os.environ.get(JOB_NAME_ENV), os.environ.get(NAMESPACE_ENV)
    if not name:
        return
    try:
        _patch(name, namespace or "default", status_body(step, checkpoint_step, checkpoint_path))
    except Exception as e:  # reports are advisory; training must never fail because of one
        log.warning("could not report step %s to %s/%s: %s", step, namespace, name, e)


def _patch(name: str, namespace: str, body: dict[str, object]) -> None:
    base = _api_url()
    if base is None:
        raise RuntimeError(f"no API server address: set KUBERNETES_SERVICE_HOST or {API_URL_ENV}")
    url = f"{base}/apis/zerotrain.dev/v1alpha1/namespaces/{namespace}/zerotrainingjobs/{name}/status"
    headers = {"Content-Type": "application/merge-patch+json", "Accept": "application/json"}
    sa_dir = Path(os.environ.get(SA_DIR_ENV) or SA_DIR)
    token_file = sa_dir / "token"
    if token_file.exists():  # re-read each time: bound service-account tokens rotate
        headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"
    context = None
    if url.startswith("https://"):
        ca = sa_dir / "ca.crt"
        context = ssl.create_default_context(cafile=str(ca) if ca.exists() else None)
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="PATCH")
    with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS, context=context) as response:
        response.read()
