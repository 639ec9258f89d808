"""Names and labels of a job's children: one place, so builders, observers and tests agree."""

from __future__ import annotations

import re

from zerotrain import pod_contract as contract

# The client's labels (it finds a job's objects by them), named here too for the builders.
from zerotrain.operator.client.selectors import CHILD_SELECTOR as CHILD_SELECTOR
from zerotrain.operator.client.selectors import LABEL_JOB as LABEL_JOB
from zerotrain.operator.client.selectors import LABEL_MANAGED_BY as LABEL_MANAGED_BY
from zerotrain.operator.client.selectors import MANAGER as MANAGER
from zerotrain.spec import GROUP

LABEL_REPLICA = f"{GROUP}/replica-index"
"""A pod's NODE_RANK."""
LABEL_GANG = f"{GROUP}/gang"
"""Which incarnation of the gang a pod belongs to (status.restarts.total when it was created)."""
LABEL_PROBE = f"{GROUP}/capacity-probe"
"""On a pod that only holds a place an elastic gang could grow into (it runs nothing): the scheduler placing it is
how the operator learns capacity returned. Its value is the probe's index."""

CONFIG_KEY = contract.CONFIG_KEY
CONFIG_DIR = contract.CONFIG_DIR
MASTER_PORT = contract.MASTER_PORT
CONTAINER_NAME = "trainer"
CONFIG_VOLUME = "zerotrain-config"
"""The pod volume of its gang's ConfigMap (`config_map_name`), mounted at CONFIG_DIR."""

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_LABEL_MAX = 63


def service_name(job: str) -> str:
    """The headless Service; it is also every pod's `subdomain`."""
    return job


def config_map_name(job: str, gang: int) -> str:
    """The config of gang incarnation `gang`: immutable, so every pod of a gang reads the same spec."""
    return f"{job}-config-{gang}"


def pod_name(job: str, replica: int) -> str:
    """Stable per rank, so the pod's hostname (and so MASTER_ADDR) survives gang restarts."""
    return f"{job}-worker-{replica}"


def probe_name(job: str, index: int) -> str:
    """Capacity probe `index` of an elastic job."""
    return f"{job}-probe-{index}"


def service_account_name(job: str) -> str:
    """The runtime's identity: it may only patch this job's status (see status_report)."""
    return f"{job}-runtime"


def role_name(job: str) -> str:
    return f"{job}-status-reporter"


def pod_group_name(job: str) -> str:
    return job


def master_addr(job: str, namespace: str) -> str:
    """Rank 0's stable DNS name through the headless Service."""
    return f"{pod_name(job, 0)}.{service_name(job)}.{namespace}.svc"


def job_labels(job: str) -> dict[str, str]:
    return {LABEL_JOB: job, LABEL_MANAGED_BY: MANAGER}


def name_problem(job: str, replicas: int) -> str | None:
    """Why `job` cannot name its children (pod hostnames are DNS labels), or None."""
    longest = pod_name(job, replicas - 1)
    if not _DNS_LABEL.match(job):
        return (
            f"metadata.name: got {job!r}; the job name is used as the Service name and must be a DNS label "
            "(lower-case letters, digits and '-', starting with a letter); rename the job"
        )
    if len(longest) > _DNS_LABEL_MAX:
        room = _DNS_LABEL_MAX - (len(longest) - len(job))
        return (
            f"metadata.name: got {job!r} ({len(job)} characters); pod hostname {longest!r} would exceed "
            f"{_DNS_LABEL_MAX} characters; use a name of at most {room} characters"
        )
    return None
