"""The contract between who starts a rank and the rank: every environment variable and path, declared once.

Torch-free, so the operator (which writes pods), `zerotrain run` (which starts local ranks) and the runtime (which
reads them) import the same names. What the spec already says travels in the spec (the job's config file); the
environment carries only where this pod sits in the gang, where its files go, and local-run plumbing.
"""

from __future__ import annotations

# The job's manifest, mounted from its ConfigMap; the pod runs `python -m zerotrain.runtime --config CONFIG_PATH`.
CONFIG_DIR = "/etc/zerotrain"
CONFIG_KEY = "job.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"

# Set by the operator in every pod (torchrun's names for the gang; ours for the job).
MASTER_PORT = 29500  # node 0's rendezvous store; MASTER_PORT's default when unset
JOB_NAME_ENV = "ZEROTRAIN_JOB_NAME"  # the ZeroTrainingJob whose status rank 0 reports to; unset outside a job
NAMESPACE_ENV = "ZEROTRAIN_NAMESPACE"
POD_NAME_ENV = "POD_NAME"  # from the downward API
RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "WORLD_SIZE")

# In-place restarts (spec.failurePolicy.restartStrategy InPlace): the operator and each pod's launcher talk through
# the pod's own metadata. Its gang label (`zerotrain.dev/gang`) says which gang the pod belongs to: moved past the
# round the launcher runs, the launcher stops its ranks. ROUND_ANNOTATION says which round the launcher may run (the
# operator writes it: the pod's gang at creation, the next gang once every living pod stopped; ROUND_EXIT: end with
# the last round's outcome). ROUND_END_ANNOTATION is the launcher's: JSON {round, exitCode, message, finishedAt}
# once every rank of that round stopped, as a container's termination record says it.
ROUND_ANNOTATION = "zerotrain.dev/round"
ROUND_END_ANNOTATION = "zerotrain.dev/round-end"
ROUND_EXIT = "exit"
# The gang a round of ranks belongs to (status.restarts.total when it began): the pod's gang label at its start
# (the downward API), then each in-place round's number. Rank 0's clock names it, and the goodput ledger takes the
# running gang's clock alone: a time comparison cannot tell them apart when the next gang starts within a second.
GANG_ENV = "ZEROTRAIN_GANG"
# When the launcher started the round (seconds since the epoch): the start of the ranks' clock (`gang_clock`).
ROUND_STARTED_ENV = "ZEROTRAIN_ROUND_STARTED"

# Read by the runtime when present (tests and the process kubelet set them; a pod has the defaults).
TERMINATION_LOG_ENV = "ZEROTRAIN_TERMINATION_LOG"  # else Kubernetes' terminationMessagePath
TERMINATION_LOG = "/dev/termination-log"
# The first word of the termination message when the pod's launcher refused the job before any rank started (the
# entry check and the other checks of `runtime.job.launch.preflight`): the operator reports its line as the cause.
INVALID_CONFIG_OUTCOME = "invalid-config"
STATUS_API_ENV = "ZEROTRAIN_STATUS_API"  # the API server's URL, else the in-cluster service's
SERVICE_ACCOUNT_DIR_ENV = "ZEROTRAIN_SERVICE_ACCOUNT_DIR"  # else the pod's projected service-account token
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
METRICS_ADDR_ENV = "ZEROTRAIN_METRICS_ADDR"  # the interface /metrics listens on (a pod's every one by default)
DEBUG_ENV = "ZEROTRAIN_DEBUG"  # 1: every traceback; 0: none (kept in files); unset: unexpected errors only

# Set by a launcher for the ranks it starts.
LAUNCHER_PID_ENV = "ZEROTRAIN_LAUNCHER_PID"  # a rank dies with its launcher (`runtime.preemption`)
# The process a rank is the child of, when not its launcher: the fork server (`runtime.job.rank_fork`), which exits
# with the launcher; the rank dies with it.
RANK_PARENT_PID_ENV = "ZEROTRAIN_RANK_PARENT_PID"
# How a launcher starts its ranks: forkserver (forks of a server that imported torch once; the default) or spawn (a
# fresh interpreter each). Read by the launcher (`runtime.job.rank_fork`).
RANK_START_ENV = "ZEROTRAIN_RANK_START"
# The modules the fork server imports before it forks the ranks (comma-separated; `runtime.job.preload`).
RANK_PRELOAD_ENV = "ZEROTRAIN_RANK_PRELOAD"

# Set by `zerotrain run` for its local ranks.
PROGRESS_ENV = "ZEROTRAIN_PROGRESS_FILE"  # rank 0 appends JSON lines here
SUMMARY_ENV = "ZEROTRAIN_SUMMARY_FILE"  # rank 0 writes the end-of-run summary here
METRICS_SEARCH_ENV = "ZEROTRAIN_METRICS_SEARCH"  # the first port to try (0: any), then search
METRICS_REPORT_ENV = "ZEROTRAIN_METRICS_REPORT_DIR"  # where each rank writes the port it holds
ENTRYPOINT_PATH_ENV = "ZEROTRAIN_ENTRYPOINT_PATH"  # the manifest's directory, searched for the entry point
RANK_MEMORY_LIMIT_ENV = "ZEROTRAIN_RANK_MEMORY_LIMIT"  # bytes: the rank's share of resources.memory, as a limit

# Engine switches for tests and benchmarks.
SINGLE_RANK_COLLECTIVES_ENV = "ZEROTRAIN_SINGLE_RANK_COLLECTIVES"
STREAM_MODEL_ENV = "ZEROTRAIN_STREAM_MODEL"


def metrics_port(base: int, local_rank: int) -> int:
    """The port local rank `local_rank` of a pod serves /metrics on (the operator declares it as containerPort)."""
    return base + local_rank
