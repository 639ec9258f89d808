"""A job deleted while a reconcile pass runs: the status write meets a 404, and the series that pass set for the job
must go with it (the delete handler may already have forgotten the job, before this pass set them again)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, cast

import pytest
from prometheus_client import generate_latest

from zerotrain.operator.kube import Kube, KubeError
from zerotrain.operator.reconcile import Reconciler
from zerotrain.operator.settings import OperatorSettings
from zerotrain.operator.status import invalid

BODY = {"metadata": {"namespace": "ns", "name": "gone", "uid": "u1"}}


class StatusWrites:
    """The one API call `_write` makes, answered with `status`."""

    def __init__(self, status: int) -> None:
        self.status = status

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        raise KubeError(self.status, "Refused", f"{namespace}/{name}", "PATCH")


def _series(r: Reconciler) -> str:
    return generate_latest(r.metrics.registry).decode()


def test_a_job_deleted_during_the_pass_leaves_no_series() -> None:
    r = Reconciler(cast(Kube, StatusWrites(404)), OperatorSettings())
    new = invalid(None, "InvalidSpec", "spec.image: missing", datetime.now(timezone.utc))
    r._write(BODY, None, new)
    assert 'zerotrain_job="gone"' not in _series(r)


def test_other_refusals_of_the_status_write_still_raise_and_keep_the_series() -> None:
    r = Reconciler(cast(Kube, StatusWrites(500)), OperatorSettings())
    new = invalid(None, "InvalidSpec", "spec.image: missing", datetime.now(timezone.utc))
    with pytest.raises(KubeError):
        r._write(BODY, None, new)
    assert 'zerotrain_job="gone"' in _series(r)
