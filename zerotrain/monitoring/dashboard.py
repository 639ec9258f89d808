"""The Grafana dashboard of training jobs, built with grafana-foundation-sdk (`make monitoring` writes it).

Rows follow what a user asks in order: does every rank fit (memory by category against the ZeRO formula,
headroom to the device limit, what the device itself reports), is communication healthy, is training moving
(step time per rank with stragglers, throughput, loss), are checkpoints landing, and what the operator did.
Template variables: datasource, namespace, job, rank; every query is in `queries`.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.builders import statetimeline, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from zerotrain.monitoring import queries as q

UID = "zerotrain-training"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")


def _targets(panel: Any, *queries: q.Query) -> Any:
    for i, query in enumerate(queries):
        panel = panel.with_target(
            pb.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(chr(ord("A") + i)).datasource(DATASOURCE)
        )
    return panel


def series(title: str, description: str, unit: str, *queries: q.Query, width: int = 12) -> timeseries.Panel:
    """A time-series panel of `queries`."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
        .line_width(1)
        .fill_opacity(10)
        .legend(
            cb.VizLegendOptions()
            .show_legend(True)
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
        )
    )
    return _targets(panel, *queries)


def memory_by_category() -> timeseries.Panel:
    """Measured categories stacked, the plan's per category as dashed lines (each category's largest rank; one
    rank with the rank variable)."""
    return (
        series(
            "Memory by category, against the plan",
            "Bytes by category, measured from live tensors and stacked, for the ranks selected (each category's "
            "largest rank; pick one rank with the rank variable); dashed: what the plan (`zerotrain plan`, "
            "docs/memory.md) predicts for that category at this stage, world size and configuration.",
            "bytes",
            q.MEMORY_MEASURED,
            q.MEMORY_PREDICTED,
            width=24,
        )
        .stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
        .fill_opacity(40)
        .override_by_regexp(
            ".* planned",
            [
                dm.DynamicConfigValue("custom.stacking", {"mode": "none"}),
                dm.DynamicConfigValue("custom.fillOpacity", 0),
                dm.DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
                dm.DynamicConfigValue("custom.lineWidth", 2),
            ],
        )
    )


def phase_timeline(title: str, description: str, query: q.Query) -> statetimeline.Panel:
    panel = statetimeline.Panel().title(title).description(description).datasource(DATASOURCE).span(12).height(8)
    return _targets(panel, query)


def variable(name: str, label: str, query: str) -> db.QueryVariable:
    return (
        db.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DATASOURCE)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
    )


def memory_rows(d: db.Dashboard) -> db.Dashboard:
    return (
        d.with_row(db.Row("Memory"))
        .with_panel(memory_by_category())
        .with_panel(
            series(
                "Ranks holding the most memory",
                "The 8 ranks with the most bytes in every category together: where a job runs out first.",
                "bytes",
                q.MEMORY_TOP_RANKS,
            )
        )
        .with_panel(
            series(
                "Memory across ranks: min, median, max",
                "Bytes per rank, every category together. The ranks of a ZeRO job hold the same; a spread means "
                "uneven shards (padding) or a rank doing something the others do not.",
                "bytes",
                *q.MEMORY_ACROSS_RANKS,
            )
        )
        .with_panel(
            series(
                "Plan error by category",
                "|measured / planned - 1| of each category at its furthest rank (gathered parameters and "
                "communication buffers at their peak). 0 means the plan is exact; docs/memory.md says what it "
                "leaves out.",
                "percentunit",
                q.PLAN_ERROR_BY_CATEGORY,
            )
        )
        .with_panel(
            series(
                "Plan error: the ranks furthest from it",
                "The 8 ranks whose categories are furthest from the plan (largest |measured / planned - 1|).",
                "percentunit",
                q.PLAN_ERROR_TOP_RANKS,
            )
        )
        .with_panel(
            series(
                "Device memory headroom",
                "Device memory left per rank: CUDA total minus what the caching allocator reserved, or on CPU the "
                "container limit minus the resident set.",
                "bytes",
                q.DEVICE_HEADROOM,
            )
        )
        .with_panel(
            series(
                "Device memory used",
                "Fraction of the device limit in use per rank; the memory alert fires above 92%.",
                "percentunit",
                q.DEVICE_USED_FRACTION,
            )
        )
        .with_panel(
            series(
                "Model states: measured / predicted",
                "Parameters + gradients + optimizer states this rank holds over what the ZeRO formula predicts. "
                "1 means the stage shards exactly as the paper counts; padding to a multiple of N shows as a "
                "little above 1.",
                "none",
                q.MODEL_STATES_RATIO,
            )
        )
        .with_panel(
            series(
                "Peaks: gathered parameters, communication buffers, activations",
                "Most bytes held at once since the rank started, per category that comes and goes within a step "
                "(each category's largest rank).",
                "bytes",
                q.MEMORY_PEAKS,
            )
        )
        .with_panel(
            series(
                "CUDA caching allocator",
                "Allocated, reserved and peak-allocated bytes per rank (CUDA ranks only). Reserved far above "
                "allocated means fragmentation.",
                "bytes",
                *q.CUDA_ALLOCATOR,
            )
        )
        .with_panel(
            series(
                "CUDA allocation retries",
                "Allocations the CUDA allocator retried after emptying its cache: a sign of memory pressure.",
                "short",
                q.CUDA_RETRIES,
            )
        )
        .with_panel(
            series(
                "Device framebuffer (DCGM) next to ZeRO's accounting",
                "Where NVIDIA's DCGM exporter runs: framebuffer in use per GPU as the device reports it, next to "
                "the bytes ZeRO accounts for in the same pod. The gap is the CUDA context, allocator cache and "
                "anything outside the engine.",
                "bytes",
                q.DCGM_FRAMEBUFFER,
                q.DCGM_ACCOUNTED,
                width=24,
            )
        )
    )


def communication_rows(d: db.Dashboard) -> db.Dashboard:
    return (
        d.with_row(db.Row("Communication"))
        .with_panel(
            series(
                "Bandwidth by op",
                "Bytes each rank sends per second by collective (ring convention: n·(N-1)/N per all-gather or "
                "reduce-scatter of n bytes).",
                "Bps",
                q.COMM_BANDWIDTH,
                width=8,
            )
        )
        .with_panel(
            series(
                "Time in collectives by op",
                "Seconds per second each rank spends launching or waiting for collectives (1 = all of its time).",
                "percentunit",
                q.COMM_TIME,
                width=8,
            )
        )
        .with_panel(series("Collective calls by op", "Calls per second.", "ops", q.COMM_CALLS, width=8))
        .with_panel(
            series(
                "Bytes per step by op, against the plan",
                "What the furthest rank's ZeRO collectives sent per optimizer step over the window, next to the plan "
                "(dashed): the paper's 2Ψ (stages 0-2) and 3Ψ (stage 3, less the root, which stays gathered into "
                "backward) in bytes, ring convention. With hybrid sharding (zero.shardGroupSize) those run inside "
                "each shard group, and all_reduce_across_groups is what crosses between groups: one all-reduce of "
                "the shard per step. A gap means the runtime sent what the plan does not know.",
                "bytes",
                q.COMM_PER_STEP,
                q.COMM_PLANNED,
                width=24,
            ).override_by_regexp(
                ".* planned",
                [
                    dm.DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
                    dm.DynamicConfigValue("custom.lineWidth", 2),
                ],
            )
        )
    )


def training_rows(d: db.Dashboard) -> db.Dashboard:
    return (
        d.with_row(db.Row("Training"))
        .with_panel(
            series(
                "Step time per rank",
                "Mean and p90 wall time of an optimizer step per rank. All ranks of a job step together, at the "
                "slowest one's pace: which rank holds them back is the stragglers panel's.",
                "s",
                q.STEP_TIME,
                q.STEP_P90,
            )
        )
        .with_panel(
            series(
                "Stragglers: the rank holding the gang back",
                "1 while a rank is named, by cause: its data wait (input) or compute at least "
                "spec.stragglers.threshold times the other ranks' median over a window. 0 for every rank of a gang "
                "that keeps pace; the straggler alert fires after 10 minutes named.",
                "none",
                q.STRAGGLER,
            )
        )
        .with_panel(
            series(
                "Step split per rank",
                "Seconds per second of each rank's steps by phase: data wait, compute, collective wait, checkpoint, "
                "evaluation. The rank that waits least in collectives is the one the others wait for.",
                "percentunit",
                q.STEP_PHASES,
            )
        )
        .with_panel(
            series("Tokens per second", "Tokens all ranks process per second.", "short", q.TOKENS_PER_S, width=8)
        )
        .with_panel(series("Loss", "Loss of the last step, mean over the global batch.", "none", q.LOSS, width=8))
        .with_panel(series("Progress", "Steps done over spec.training.steps.", "percentunit", q.PROGRESS, width=8))
        .with_panel(series("Gradient norm", "Global gradient norm before clipping.", "none", q.GRAD_NORM, width=8))
        .with_panel(
            series("Learning rate", "The last step's (spec.training.lrSchedule).", "none", q.LEARNING_RATE, width=8)
        )
        .with_panel(
            series(
                "Evaluation loss",
                "The last evaluation's loss, mean over every rank's held-out micro-batches (spec.training.evaluation).",
                "none",
                q.EVAL_LOSS,
                width=8,
            )
        )
        .with_panel(
            series(
                "Loss scale and skipped steps",
                "fp16 only: the dynamic loss scale and the steps skipped on gradient overflow.",
                "none",
                q.LOSS_SCALE,
                q.SKIPPED,
                width=8,
            )
        )
    )


def health_rows(d: db.Dashboard) -> db.Dashboard:
    return (
        d.with_row(db.Row("Checkpoints and health"))
        .with_panel(
            series(
                "Checkpoint save and load",
                "Duration of the last checkpoint save per rank, and of the load a resumed run started from.",
                "s",
                q.CHECKPOINT_SAVE,
                q.CHECKPOINT_LOAD,
                width=8,
            )
        )
        .with_panel(series("Checkpoint writes", "Bytes per second written.", "Bps", q.CHECKPOINT_WRITE, width=8))
        .with_panel(series("Last committed checkpoint", "Its step.", "none", q.CHECKPOINT_STEP, width=8))
        .with_panel(
            series(
                "Heartbeat age",
                "Seconds since each rank last made progress; a hung collective shows as a line that keeps rising.",
                "s",
                q.HEARTBEAT_AGE,
            )
        )
        .with_panel(phase_timeline("Rank phase", "What each rank is doing.", q.PHASE))
        .with_panel(series("Metrics targets up", "1 while a rank's /metrics answers.", "none", q.TARGETS_UP, width=8))
        .with_panel(phase_timeline("Job phase (operator)", "The job's status.phase.", q.JOB_PHASE).span(8))
        .with_panel(
            series("Gang restarts by cause (operator)", "From the job's status.", "short", q.JOB_RESTARTS, width=8)
        )
        .with_panel(
            series(
                "Gang size and stage (operator)",
                "Pods of the gang in force (an elastic job's moves between its bounds) and the ZeRO stage its ranks "
                "run (stage auto's choice); the dashboard's annotations mark each change.",
                "short",
                q.JOB_REPLICAS,
                q.JOB_STAGE,
                width=8,
            )
        )
        .with_panel(
            series(
                "Goodput: where the job's time went (operator)",
                "The job's wall time since its creation by bucket (status.goodput): pending, starting, training, "
                "evaluating, checkpointing (blocked), lost (steps trained after the newest checkpoint of a gang that "
                "failed) and restarting. A line that climbs is where the time goes now.",
                "s",
                q.GOODPUT,
            )
        )
        .with_panel(
            series(
                "Goodput ratio (operator)",
                "Training seconds over the job's wall time, across every gang it ran.",
                "percentunit",
                q.GOODPUT_RATIO,
            )
        )
    )


def annotation(name: str, query: q.Query, color: str) -> db.AnnotationQuery:
    """A mark on every time-series panel where `query` answers (a resize, a re-plan)."""
    return db.AnnotationQuery().name(name).datasource(DATASOURCE).enable(True).icon_color(color).expr(query.expr)


def build() -> dm.Dashboard:
    d = (
        db.Dashboard("ZeRO training")
        .uid(UID)
        .description("Every rank of every ZeroTrainingJob: memory by ZeRO category, communication, steps, checkpoints.")
        .tags(["zerotrain", "training"])
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(variable("namespace", "Namespace", "label_values(zerotrain_world_size, namespace)"))
        .with_variable(
            variable("job", "Job", 'label_values(zerotrain_world_size{namespace=~"$namespace"}, zerotrain_job)')
        )
        .with_variable(variable("rank", "Rank", f"label_values(zerotrain_world_size{{{q.JOB_SEL}}}, rank)"))
    )
    d = d.annotation(annotation("Resizes (operator)", q.RESIZED, "orange"))
    d = d.annotation(annotation("Re-plans (operator)", q.REPLANNED, "purple"))
    for rows in (memory_rows, communication_rows, training_rows, health_rows):
        d = rows(d)
    return d.build()


def dashboard_json() -> str:
    """The dashboard as Grafana imports it (stable key order, so the committed file diffs cleanly)."""
    return json.dumps(json.loads(JSONEncoder(sort_keys=True).encode(build())), indent=2, sort_keys=True) + "\n"
