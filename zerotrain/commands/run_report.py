"""What `zerotrain run` prints when the ranks are done: the summary tables, and how the run ended.

Everything that comes from outside our own literals (messages of ranks' exceptions, paths, names from manifests)
is printed as plain `Text`, never parsed as rich markup: gloo's errors alone are full of square brackets.
"""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from zerotrain.commands import runtime_calls as rt
from zerotrain.commands.tables import Rows, print_rows
from zerotrain.goodput import GoodputSeconds, summary_line
from zerotrain.quantity import format_bytes


def throughput(record: dict[str, Any]) -> str:
    """A progress or summary record's throughput in the task's own unit (tokens/s, samples/s or steps/s)."""
    value, unit = record.get("throughput", 0.0), record.get("throughput_unit", "steps/s")
    return f"{value:,.2f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def local_outcome(outcome: Any, stopped: dict[str, Any] | None, steps: int) -> Any:
    """The launcher's outcome as a local command reports it: a run stopped before its last step exits 130 (SIGINT)
    or 143 (SIGTERM), never 0, and says after which step it stopped and what it saved (rank 0's `stopped` record)."""
    if outcome.reason not in (rt.Outcome.PREEMPTED, rt.Outcome.INTERRUPTED):
        return outcome
    sig = signal.SIGINT if outcome.reason is rt.Outcome.INTERRUPTED else signal.SIGTERM
    message = outcome.message
    if stopped is not None:
        saved = f"checkpoint {stopped['saved']} committed" if stopped["saved"] else "no --checkpoint-dir, nothing saved"
        message = f"{stopped['cause']}: every rank stopped after step {stopped['stopped']} of {steps}, {saved}"
    elif outcome.reason is rt.Outcome.INTERRUPTED:
        message += "; the newest checkpoint committed before stands"
    return dataclasses.replace(outcome, exit_code=128 + int(sig), message=message)


def render_outcome(outcome: Any, console: Console) -> None:
    """The root cause first, then each other rank's consequence, then where the failing rank's logs are."""
    style = "green" if outcome.exit_code == 0 else "bold red"
    console.print(
        Text.assemble((outcome.reason.value, style), f": {outcome.message} (exit status {outcome.exit_code})"),
        soft_wrap=True,
    )
    for line in outcome.details:
        console.print(Text(f"  {line}"), soft_wrap=True)
    if outcome.logs:
        folders = {str(Path(p).parent) for p in outcome.logs}
        names = ", ".join(Path(p).name for p in outcome.logs)
        where = f"{folders.pop()}/ ({names})" if len(folders) == 1 else ", ".join(outcome.logs)
        console.print(Text(f"  logs: {where}"), soft_wrap=True)


def memory_rows(report: Any) -> list[tuple[str, float | None, float | None]]:
    """(category, measured bytes, predicted bytes) from a memory report.

    Every `X_bytes` field is a measured category; `predicted_X_bytes`, when present, is its formula value.
    """
    if not isinstance(report, dict):
        return []
    rows: list[tuple[str, float | None, float | None]] = []
    for key, value in report.items():
        if key.startswith("predicted_") or not key.endswith("_bytes") or not isinstance(value, (int, float)):
            continue
        category = key.removesuffix("_bytes").replace("_", " ")
        rows.append((category, value, report.get(f"predicted_{key}")))
    return rows


def comm_rows(report: Any) -> list[tuple[str, dict[str, Any]]]:
    """(op, {calls, bytes, seconds, ...}) from a comm report (a mapping of op to its totals)."""
    ops = report if isinstance(report, dict) else {}
    return [(op, stats) for op, stats in ops.items() if isinstance(stats, dict)]


def _bytes(n: float | None) -> str:
    return "-" if n is None else format_bytes(n)


def render_summary(summary: dict[str, Any], console: Console) -> None:
    """The run's loss and throughput, then per rank: memory measured vs predicted, bytes communicated by op."""
    ran, first = len(summary["losses"]), summary.get("first_step", 1)
    if ran:
        which = f"{ran} steps" if first == 1 else f"steps {first}–{first + ran - 1} ({ran}, resumed after {first - 1})"
        console.print(
            f"loss {summary['first_loss']:.4f} → {summary['final_loss']:.4f} over {which}, "
            f"{throughput(summary)}, {summary['elapsed_s']:.1f} s",
            highlight=False,
            markup=False,
        )
    else:
        console.print(f"no steps left: resumed from the checkpoint of the final step {summary['steps']}")
    if evaluations := summary.get("evaluations"):
        console.print(
            f"evaluation loss {evaluations[0]['loss']:.4f} → {evaluations[-1]['loss']:.4f} "
            f"over {len(evaluations)} evaluation(s), the last after step {evaluations[-1]['step']}",
            highlight=False,
            markup=False,
        )
    if spent := summary.get("goodput"):
        console.print(summary_line(GoodputSeconds.model_validate(spent)), highlight=False, markup=False)
    world = summary["world_size"]
    group = min((e["memory"].get("shard_group_size", world) for e in summary["ranks"]), default=world)
    sharding = f"N = {world}" if group == world else f"N = {group}: {world} ranks in {world // group} shard groups"
    title = f"memory per rank (stage {summary['stage']}, {sharding})"
    memory = Rows(title, ("rank", "category", "measured", "predicted"), left=frozenset({"category"}))
    comm = Rows("communication per rank", ("rank", "op", "calls", "bytes", "seconds"), left=frozenset({"op"}))
    for entry in summary["ranks"]:
        rank = str(entry["rank"])
        for category, measured, predicted in memory_rows(entry.get("memory")):
            memory.add(rank, Text(category), _bytes(measured), _bytes(predicted))
        memory.end_section()
        for op, stats in comm_rows(entry.get("comm")):
            calls, seconds = str(stats.get("calls", "-")), f"{stats.get('seconds', 0.0):.3f}"
            comm.add(rank, Text(op), calls, _bytes(stats.get("bytes")), seconds)
        comm.end_section()
    print_rows(memory, console)
    print_rows(comm, console)
