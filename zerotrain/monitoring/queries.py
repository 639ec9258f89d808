"""The PromQL the dashboard and the alerts run, each with the scope of what it must return.

Selectors use the dashboard's template variables `$namespace`, `$job` (the ZeroTrainingJob, label
`zerotrain_job`) and `$rank`. Their "All" value is `.*`, which also matches a series without the label: a local
`zerotrain run` has no `namespace`. `vars_all()` substitutes that, for evaluating a query outside Grafana.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

RANK_SEL = 'namespace=~"$namespace", zerotrain_job=~"$job", rank=~"$rank"'
JOB_SEL = 'namespace=~"$namespace", zerotrain_job=~"$job"'
JOB_KEY = "namespace, zerotrain_job"
RATE = "$__rate_interval"


class Scope(str, Enum):
    """What a query answers with, so a test knows what to expect from a live Prometheus."""

    RANK = "rank"
    """A series for every rank (label `rank`)."""
    JOB = "job"
    """At least one series for the job (label `zerotrain_job`), from the ranks' metrics."""
    OPERATOR = "operator"
    """A series for the job from the operator's metrics (labels `namespace`, `zerotrain_job`)."""
    CUDA = "cuda"
    """Per rank, but only where ranks run on CUDA (allocator statistics)."""
    DCGM = "dcgm"
    """Only where NVIDIA's DCGM exporter runs and Prometheus scrapes it with pod labels."""


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a panel or an alert."""

    expr: str
    """PromQL, with the dashboard's variables."""
    legend: str
    """Grafana legend format."""
    scope: Scope
    """What it returns."""


def vars_all(expr: str, rate_window: str = "30s") -> str:
    """`expr` as Grafana runs it with every variable on "All" and `$__rate_interval` = `rate_window`."""
    for var in ("$namespace", "$job", "$rank"):
        expr = expr.replace(var, ".*")
    return expr.replace(RATE, rate_window)


def step_seconds(sel: str = RANK_SEL) -> str:
    """Mean step time per rank over the rate window."""
    return (
        f"rate(zerotrain_step_duration_seconds_sum{{{sel}}}[{RATE}])"
        f" / rate(zerotrain_step_duration_seconds_count{{{sel}}}[{RATE}])"
    )


def straggler(sel: str = RANK_SEL) -> str:
    """1 for each rank (and cause) the runtime names as holding its gang back: its data wait or compute against the
    other ranks' (`runtime/job/stragglers.py`). Not the step time: every rank of a synchronous gang steps at the
    slowest one's pace, so step times name no one."""
    return f"max by ({JOB_KEY}, rank, pod, cause) (zerotrain_straggler{{{sel}}})"


# Memory by category for the ranks selected: each category's largest rank (with one rank selected, that rank),
# so a 1,024-rank job draws seven lines, not seven thousand.
MEMORY_MEASURED = Query(
    f"max by (zerotrain_job, category) (zerotrain_memory_bytes{{{RANK_SEL}}})", "{{category}}", Scope.JOB
)
MEMORY_PREDICTED = Query(
    f"max by (zerotrain_job, category) (zerotrain_memory_predicted_bytes{{{RANK_SEL}}})",
    "{{category}} planned",
    Scope.JOB,
)
_RANK_TOTAL = f"sum by (zerotrain_job, rank) (zerotrain_memory_bytes{{{RANK_SEL}}})"
MEMORY_TOP_RANKS = Query(f"topk(8, {_RANK_TOTAL})", "rank {{rank}}", Scope.JOB)
MEMORY_ACROSS_RANKS = (
    Query(f"min by (zerotrain_job) ({_RANK_TOTAL})", "min", Scope.JOB),
    Query(f"quantile by (zerotrain_job) (0.5, {_RANK_TOTAL})", "median", Scope.JOB),
    Query(f"max by (zerotrain_job) ({_RANK_TOTAL})", "max", Scope.JOB),
)
MEMORY_PEAKS = Query(
    f"max by (zerotrain_job, category) (zerotrain_memory_peak_bytes{{{RANK_SEL}}})", "{{category}}", Scope.JOB
)
# The plan's relative error per rank and category: what a rank holds (its peak, for the categories that come and
# go within a step) over what the plan predicted for it, less 1; categories the plan gives 0 are left out.
_HELD = f'zerotrain_memory_bytes{{{RANK_SEL}, category=~"parameters|gradients|optimizer_states|gradient_arenas"}}'
_PEAKED = f'zerotrain_memory_peak_bytes{{{RANK_SEL}, category=~"gathered_parameters|communication_buffers"}}'
_PLANNED = f"(zerotrain_memory_predicted_bytes{{{RANK_SEL}}} > 0)"
PLAN_ERROR = f"(({_HELD}) / {_PLANNED} or ({_PEAKED}) / {_PLANNED}) - 1"
PLAN_ERROR_BY_CATEGORY = Query(
    f"max by (zerotrain_job, category) (abs({PLAN_ERROR}))", "{{category}} (furthest rank)", Scope.JOB
)
PLAN_ERROR_TOP_RANKS = Query(f"topk(8, max by (zerotrain_job, rank) (abs({PLAN_ERROR})))", "rank {{rank}}", Scope.JOB)
# Communication per optimizer step by op: measured (the furthest rank) against the plan's 2Ψ/3Ψ made exact; with
# hybrid sharding, all_reduce_across_groups is the traffic between shard groups (the network between pods).
_ZERO_OPS = 'op=~"all_reduce|reduce_scatter|all_gather|all_reduce_across_groups"'
COMM_PER_STEP = Query(
    f"max by (zerotrain_job, op) (increase(zerotrain_comm_bytes_total{{{RANK_SEL}, {_ZERO_OPS}}}[{RATE}])"
    f" / ignoring(op) group_left() increase(zerotrain_optimizer_steps_total{{{RANK_SEL}}}[{RATE}]))",
    "{{op}} measured",
    Scope.JOB,
)
COMM_PLANNED = Query(
    f"max by (zerotrain_job, op) (zerotrain_comm_planned_bytes_per_step{{{RANK_SEL}, {_ZERO_OPS}}})",
    "{{op}} planned",
    Scope.JOB,
)
MODEL_STATES_RATIO = Query(
    f'sum by (rank) (zerotrain_memory_bytes{{{RANK_SEL}, category=~"parameters|gradients|optimizer_states"}})'
    f' / sum by (rank) (zerotrain_memory_predicted_bytes{{{RANK_SEL}, category=~"parameters|gradients|'
    'optimizer_states"})',
    "rank {{rank}}",
    Scope.RANK,
)
DEVICE_USED_FRACTION = Query(
    f"zerotrain_device_memory_used_bytes{{{RANK_SEL}}} / zerotrain_device_memory_limit_bytes{{{RANK_SEL}}}",
    "rank {{rank}} ({{device}})",
    Scope.RANK,
)
DEVICE_HEADROOM = Query(
    f"zerotrain_device_memory_limit_bytes{{{RANK_SEL}}} - zerotrain_device_memory_used_bytes{{{RANK_SEL}}}",
    "rank {{rank}} ({{device}})",
    Scope.RANK,
)
CUDA_ALLOCATOR = (
    Query(f"zerotrain_cuda_memory_allocated_bytes{{{RANK_SEL}}}", "rank {{rank}} allocated", Scope.CUDA),
    Query(f"zerotrain_cuda_memory_reserved_bytes{{{RANK_SEL}}}", "rank {{rank}} reserved", Scope.CUDA),
    Query(f"zerotrain_cuda_memory_peak_allocated_bytes{{{RANK_SEL}}}", "rank {{rank}} peak allocated", Scope.CUDA),
)
CUDA_RETRIES = Query(f"increase(zerotrain_cuda_alloc_retries_total{{{RANK_SEL}}}[{RATE}])", "rank {{rank}}", Scope.CUDA)
# DCGM reports framebuffer MiB per GPU with the pod it serves; ranks carry the pod label from their target.
DCGM_FRAMEBUFFER = Query(
    'DCGM_FI_DEV_FB_USED{namespace=~"$namespace"} * 1048576'
    f" * on(namespace, pod) group_left(zerotrain_job) max by (namespace, pod, zerotrain_job)"
    f" (zerotrain_world_size{{{JOB_SEL}}} * 0 + 1)",
    "{{pod}} GPU {{gpu}} (DCGM)",
    Scope.DCGM,
)
DCGM_ACCOUNTED = Query(
    f"sum by (namespace, pod) (zerotrain_memory_bytes{{{JOB_SEL}}})"
    ' and on(namespace, pod) DCGM_FI_DEV_FB_USED{namespace=~"$namespace"}',
    "{{pod}} ZeRO categories",
    Scope.DCGM,
)
COMM_BANDWIDTH = Query(
    f"sum by (rank, op) (rate(zerotrain_comm_bytes_total{{{RANK_SEL}}}[{RATE}]))", "rank {{rank}} {{op}}", Scope.RANK
)
COMM_TIME = Query(
    f"sum by (rank, op) (rate(zerotrain_comm_seconds_total{{{RANK_SEL}}}[{RATE}]))", "rank {{rank}} {{op}}", Scope.RANK
)
COMM_CALLS = Query(
    f"sum by (rank, op) (rate(zerotrain_comm_calls_total{{{RANK_SEL}}}[{RATE}]))", "rank {{rank}} {{op}}", Scope.RANK
)
STEP_TIME = Query(step_seconds(), "rank {{rank}}", Scope.RANK)
STEP_P90 = Query(
    f"histogram_quantile(0.9, sum by (rank, le) (rate(zerotrain_step_duration_seconds_bucket{{{RANK_SEL}}}[{RATE}])))",
    "rank {{rank}} p90",
    Scope.RANK,
)
STRAGGLER = Query(straggler(), "rank {{rank}} ({{cause}})", Scope.RANK)
STEP_PHASES = Query(
    f"sum by (rank, phase) (rate(zerotrain_step_phase_seconds_total{{{RANK_SEL}}}[{RATE}]))",
    "rank {{rank}} {{phase}}",
    Scope.RANK,
)
TOKENS_PER_S = Query(
    f"sum by ({JOB_KEY}) (rate(zerotrain_tokens_total{{{RANK_SEL}}}[{RATE}]))", "{{zerotrain_job}}", Scope.JOB
)
LOSS = Query(f"avg by ({JOB_KEY}) (zerotrain_loss{{{JOB_SEL}}})", "{{zerotrain_job}}", Scope.JOB)
GRAD_NORM = Query(f"avg by ({JOB_KEY}) (zerotrain_grad_norm{{{JOB_SEL}}})", "{{zerotrain_job}}", Scope.JOB)
EVAL_LOSS = Query(f"avg by ({JOB_KEY}) (zerotrain_eval_loss{{{JOB_SEL}}})", "{{zerotrain_job}}", Scope.JOB)
LEARNING_RATE = Query(f"avg by ({JOB_KEY}) (zerotrain_learning_rate{{{JOB_SEL}}})", "{{zerotrain_job}}", Scope.JOB)
LOSS_SCALE = Query(f"avg by ({JOB_KEY}) (zerotrain_loss_scale{{{JOB_SEL}}})", "loss scale", Scope.JOB)
SKIPPED = Query(f"max by ({JOB_KEY}) (zerotrain_skipped_steps_total{{{JOB_SEL}}})", "skipped steps", Scope.JOB)
PROGRESS = Query(
    f"max by ({JOB_KEY}) (zerotrain_step{{{JOB_SEL}}}) / max by ({JOB_KEY}) (zerotrain_training_steps{{{JOB_SEL}}})",
    "{{zerotrain_job}}",
    Scope.JOB,
)
HEARTBEAT_AGE = Query(f"time() - zerotrain_heartbeat_timestamp_seconds{{{RANK_SEL}}}", "rank {{rank}}", Scope.RANK)
PHASE = Query(f"zerotrain_phase{{{RANK_SEL}}} == 1", "rank {{rank}} {{phase}}", Scope.RANK)
CHECKPOINT_SAVE = Query(
    f"zerotrain_checkpoint_last_save_duration_seconds{{{RANK_SEL}}}", "rank {{rank}} save", Scope.RANK
)
CHECKPOINT_WRITE = Query(
    f"rate(zerotrain_checkpoint_save_bytes_total{{{RANK_SEL}}}[{RATE}])", "rank {{rank}} write", Scope.RANK
)
CHECKPOINT_LOAD = Query(
    f"zerotrain_checkpoint_load_duration_seconds{{{RANK_SEL}}}", "rank {{rank}} load (resume)", Scope.RANK
)
CHECKPOINT_STEP = Query(
    f"max by ({JOB_KEY}) (zerotrain_checkpoint_last_committed_step{{{JOB_SEL}}})", "last committed step", Scope.JOB
)
TARGETS_UP = Query('up{zerotrain_job=~"$job"}', "{{instance}}", Scope.JOB)
JOB_PHASE = Query(f"zerotrain_operator_job_phase{{{JOB_SEL}}} == 1", "{{phase}}", Scope.OPERATOR)
JOB_RESTARTS = Query(
    f"sum by ({JOB_KEY}, cause) (zerotrain_operator_job_restarts_total{{{JOB_SEL}}})", "{{cause}}", Scope.OPERATOR
)

GOODPUT = Query(
    f"max by ({JOB_KEY}, bucket) (zerotrain_operator_job_goodput_seconds{{{JOB_SEL}}})", "{{bucket}}", Scope.OPERATOR
)
GOODPUT_RATIO = Query(
    f"max by ({JOB_KEY}) (zerotrain_operator_job_goodput_ratio{{{JOB_SEL}}})", "goodput", Scope.OPERATOR
)
JOB_REPLICAS = Query(f"max by ({JOB_KEY}) (zerotrain_operator_job_replicas{{{JOB_SEL}}})", "pods", Scope.OPERATOR)
JOB_STAGE = Query(f"max by ({JOB_KEY}) (zerotrain_operator_job_stage{{{JOB_SEL}}})", "ZeRO stage", Scope.OPERATOR)
# Annotations: a mark where the value changed. Grafana draws one per series and step the expression returns.
MARK_ABOVE = " > 0"
RESIZED = Query(
    f"changes(zerotrain_operator_job_replicas{{{JOB_SEL}}}[2m]){MARK_ABOVE}",
    "{{zerotrain_job}} resized",
    Scope.OPERATOR,
)
REPLANNED = Query(
    f"changes(zerotrain_operator_job_stage{{{JOB_SEL}}}[2m]){MARK_ABOVE}",
    "{{zerotrain_job}} re-planned",
    Scope.OPERATOR,
)


def all_queries() -> list[Query]:
    """Every query defined here (what the dashboard may use)."""
    return [v for v in globals().values() if isinstance(v, Query)] + [*CUDA_ALLOCATOR, *MEMORY_ACROSS_RANKS]
