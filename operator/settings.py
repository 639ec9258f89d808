"""Operator settings: one pydantic model, read from `ZEROTRAIN_*` environment variables and CLI flags."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from zerotrain.errors import UserError, describe_validation_error

ENV_PREFIX = "ZEROTRAIN_"
_QUANTITY = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"


class OperatorSettings(BaseModel):
    """Everything the operator process can be tuned with; env var = ZEROTRAIN_ + upper-case field name."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    namespaces: list[str] = Field(default_factory=list)
    """Namespaces to watch (env: comma-separated); empty means cluster-wide."""
    gpu_memory: str | None = Field(default=None, pattern=_QUANTITY)
    """Default memory of one GPU (e.g. "80Gi") for the admission memory plan when a job has no resources.gpuMemory."""
    resync_seconds: float = Field(default=30.0, gt=0)
    """Every job is reconciled at least this often, even without events (from the operator's cache: a steady job's
    pass sends no request)."""
    relist_seconds: float = Field(default=300.0, gt=0)
    """How often the resync starts with a LIST of every job (one per namespace), which drops the jobs a watch gap
    hid the deletion of (kopf re-lists after 410 Gone without a DELETED for them; the children's reflectors re-list
    themselves)."""
    restart_backoff_seconds: float = Field(default=10.0, ge=0)
    """Delay before the first gang restart after a failure; doubles with each counted failure."""
    max_restart_backoff_seconds: float = Field(default=300.0, ge=0)
    """Cap of the exponential restart delay."""
    health_port: int = Field(default=8080, ge=1, le=65535)
    """Port of the liveness endpoint /healthz."""
    metrics_port: int = Field(default=9090, ge=0, le=65535)
    """Port of the Prometheus /metrics endpoint (0: do not serve)."""
    bind_address: str = "0.0.0.0"
    """Address the health and metrics endpoints listen on."""
    api_retries: int = Field(default=5, ge=0)
    """Retries of an API call answered with a conflict, throttling or a server error."""
    api_retry_base_seconds: float = Field(default=0.2, ge=0)
    """First retry delay of an API call; doubles with each retry (or follows Retry-After)."""
    api_qps: float = Field(default=200.0, ge=0)
    """Requests a second the operator sends on average at most (client-go's QPS; 0: no client-side limit). The API
    server's own limit (429 with Retry-After) is honoured on top."""
    api_burst: int = Field(default=400, ge=1)
    """Requests the operator may send at once above api_qps after a quiet spell (client-go's burst)."""
    api_connections: int = Field(default=32, ge=1)
    """Connections to the API server the client keeps open, and so the most requests in flight at once."""
    reconcile_workers: int = Field(default=8, ge=1)
    """Passes that run at once, of different jobs (client-go's MaxConcurrentReconciles); a job's passes never
    overlap."""
    pod_create_concurrency: int = Field(default=16, ge=1)
    """Pod creates in flight at once, across all jobs, taken round-robin between the jobs that have some to do."""
    max_pod_creates_per_pass: int = Field(default=500, ge=1)
    """Pods one pass creates at most; a larger gang is created over several passes (Created=False/GangCreating)."""
    allow_host_path: bool = False
    """Admit jobs whose volumes or pod template use hostPath volumes (they give pods the node's files)."""
    leader_election: bool = False
    """Reconcile only while holding a Lease, so several replicas can run (the Helm chart turns it on)."""
    lease_namespace: str = "default"
    """Namespace of the Lease (the chart sets the operator's own)."""
    lease_name: str = "zerotrain-operator"
    """Name of the Lease; operators sharing it elect one leader."""
    lease_seconds: float = Field(default=15.0, gt=0)
    """A leader that has not renewed for this long is replaced (and stops itself)."""
    lease_renew_seconds: float = Field(default=5.0, gt=0)
    """How often the leader renews the Lease."""
    lease_retry_seconds: float = Field(default=2.0, gt=0)
    """How often a standby tries to take the Lease."""
    identity: str = ""
    """This replica's name in the Lease (the chart sets the pod name; default host name and process id)."""

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split(cls, v: object) -> object:
        if isinstance(v, str):
            return [n.strip() for n in v.split(",") if n.strip()]
        return v

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> OperatorSettings:
        """Settings from `ZEROTRAIN_*` variables, with explicit overrides (CLI flags) on top."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for name in cls.model_fields:
            key = ENV_PREFIX + name.upper()
            if key in env:
                values[name] = env[key]
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as e:
            lines = describe_validation_error(e).splitlines()
            named = [ENV_PREFIX + line.split(":", 1)[0].upper() + ":" + line.split(":", 1)[1] for line in lines]
            raise UserError("operator settings are invalid:\n" + "\n".join(named)) from None
