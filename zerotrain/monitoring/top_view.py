"""What `zerotrain top` shows, from the series a source gave (pure): per rank its model-state memory against the
plan, its step split since the last refresh, its tokens/s and a straggler mark; the job's step and goodput."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from zerotrain.goodput import Bucket, GoodputSeconds, progress, summary_line
from zerotrain.monitoring.top_sources import Sample
from zerotrain.quantity import format_bytes

# The phases of `zerotrain_step_phase_seconds_total`, shown as data / compute / collective wait / the rest.
SHOWN_PHASES = {"data_wait": "data", "compute": "compute", "collective_wait": "wait"}
# Model states: what the plan predicts and the ranks hold between steps (the gathered parameters and communication
# buffers are planned at their peak and held only within a step, so they are left out of both figures).
STATES = ("parameters", "gradients", "optimizer_states", "host_optimizer_states", "host_parameters", "gradient_arenas")


@dataclass(frozen=True)
class RankRow:
    """One rank as the view shows it."""

    rank: int
    memory: float | None = None
    """Model-state bytes held now."""
    plan: float | None = None
    """What the plan predicts for them."""
    split: dict[str, float] = field(default_factory=dict)
    """Share of the step time by phase since the last refresh (`SHOWN_PHASES`, and `other`)."""
    tokens_per_s: float | None = None
    straggler: str = ""
    """'input 1.50×' while the rank is named as holding the gang back, else empty."""


@dataclass(frozen=True)
class TopView:
    """The whole screen."""

    job: str
    source: str
    ranks: list[RankRow]
    step: int | None = None
    steps: int | None = None
    goodput: GoodputSeconds | None = None


def _by_rank(samples: Iterable[Sample], name: str) -> dict[int, list[Sample]]:
    out: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.name == name and "rank" in s.labels:
            out[int(s.labels["rank"])].append(s)
    return out


def _phase_totals(samples: Iterable[Sample]) -> dict[int, dict[str, float]]:
    return {
        rank: {s.labels.get("phase", ""): s.value for s in found}
        for rank, found in _by_rank(samples, "zerotrain_step_phase_seconds_total").items()
    }


def _split(now: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """Shares by phase of the time since `before` (all of it when nothing moved since)."""
    moved = {p: now[p] - before.get(p, 0.0) for p in now}
    if sum(moved.values()) <= 0:
        moved = now
    whole = sum(moved.values())
    if whole <= 0:
        return {}
    shares = {SHOWN_PHASES[p]: v / whole for p, v in moved.items() if p in SHOWN_PHASES}
    return {**shares, "other": max(0.0, 1.0 - sum(shares.values()))}


def _straggler(samples: list[Sample], ratios: list[Sample]) -> str:
    named = [s.labels.get("cause", "") for s in samples if s.value >= 1]
    if not named:
        return ""
    ratio = {s.labels.get("cause", ""): s.value for s in ratios}
    return ", ".join(f"{c} {ratio[c]:.2f}×" if c in ratio else c for c in named)


def _goodput(samples: list[Sample]) -> GoodputSeconds | None:
    """The operator's ledger of the job when there is one (a cluster job), else rank 0's of its run."""
    for name, where in (("zerotrain_operator_job_goodput_seconds", None), ("zerotrain_goodput_seconds", "0")):
        found = {
            s.labels.get("bucket", ""): s.value
            for s in samples
            if s.name == name and (where is None or s.labels.get("rank") == where)
        }
        if found:
            return GoodputSeconds(**{b.value: found.get(b.value, 0.0) for b in Bucket})
    return None


def _first(samples: list[Sample], name: str) -> float | None:
    return next((s.value for s in samples if s.name == name), None)


def build(job: str, source: str, now: list[Sample], before: list[Sample] | None = None) -> TopView:
    """The view of `now`; the step split is over the time since `before` (the previous refresh)."""
    phases_now, phases_before = _phase_totals(now), _phase_totals(before or [])
    memory, plan = _by_rank(now, "zerotrain_memory_bytes"), _by_rank(now, "zerotrain_memory_predicted_bytes")
    tokens, flags = _by_rank(now, "zerotrain_tokens_per_second"), _by_rank(now, "zerotrain_straggler")
    ratios = _by_rank(now, "zerotrain_straggler_ratio")
    ranks = sorted({int(s.labels["rank"]) for s in now if "rank" in s.labels})

    def states(found: list[Sample]) -> float | None:
        held = [s.value for s in found if s.labels.get("category") in STATES]
        return sum(held) if held else None

    rows = [
        RankRow(
            rank=r,
            memory=states(memory.get(r, [])),
            plan=states(plan.get(r, [])),
            split=_split(phases_now.get(r, {}), phases_before.get(r, {})),
            tokens_per_s=next((s.value for s in tokens.get(r, [])), None),
            straggler=_straggler(flags.get(r, []), ratios.get(r, [])),
        )
        for r in ranks
    ]
    stepped = [s.value for s in now if s.name == "zerotrain_step"]
    steps = _first(now, "zerotrain_training_steps")
    step = int(max(stepped)) if stepped else None
    return TopView(job, source, rows, step, None if steps is None else int(steps), _goodput(now))


def _bytes(n: float | None) -> str:
    return "-" if n is None else format_bytes(int(n))


def _share(split: dict[str, float], key: str) -> str:
    return f"{split[key]:.0%}" if key in split else "-"


def render(view: TopView, note: str = "") -> RenderableType:
    """The screen: a header, a table of ranks (within 80 columns), the goodput, and how to leave."""
    step = f"step {view.step}/{view.steps}" if view.step is not None and view.steps else "no step yet"
    if view.step is not None and view.steps and view.goodput is not None:
        eta = progress(view.step, view.steps, view.goodput.training).eta  # at the ledger's training rate
        step += f"  eta {eta}" if eta is not None else ""
    header = Text.assemble((view.job, "bold"), f"  {step}  {len(view.ranks)} rank(s)  {view.source}")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    for name in ("rank", "memory", "plan", "data", "comp", "wait", "rest", "tok/s", "straggler"):
        table.add_column(name, justify="left" if name == "straggler" else "right", no_wrap=True)
    for row in view.ranks:
        tokens = "-" if row.tokens_per_s is None else f"{row.tokens_per_s:,.0f}"
        mark = Text(row.straggler, style="bold red") if row.straggler else Text("")
        shares = [_share(row.split, k) for k in ("data", "compute", "wait", "other")]
        table.add_row(str(row.rank), _bytes(row.memory), _bytes(row.plan), *shares, tokens, mark)
    goodput = Text(summary_line(view.goodput) if view.goodput is not None else "goodput: not reported yet")
    footer = Text(note or "q or Ctrl-C to quit", style="dim")
    return Group(header, table, goodput, footer)
