"""Tables and plots of `compare.py`'s results: absolute figures, then each zerotrain stage against its peers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from zerotrain.quantity import format_bytes

# Each zerotrain stage against the systems that shard the same states (and stage 3 against plain DDP too).
PEERS = {
    "zero0": ["ddp"],
    "zero1": ["zro", "ds1"],
    "zero2": ["zro", "ds2"],
    "zero3": ["fsdp2", "fsdp2-keep", "ds3", "ddp"],
    "zero3-compile": ["zero3", "fsdp2-compile"],
}
CATEGORIES = ("parameter", "gradient", "optimizer")


def _by_key(doc: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["system"], r["world"]): r for r in doc["results"]}


def figures_table(doc: dict[str, Any]) -> Table:
    cfg = doc["config"]
    psi = doc["results"][0]["parameters"] if doc["results"] else 0
    table = Table(
        title=f"GPT d={cfg['d_model']} L={cfg['layers']} (Ψ = {psi:,}), batch {cfg['batch']}×{cfg['seq_len']}, "
        f"fp32 AdamW, medians of {cfg['reps']} repetitions (range in brackets)"
    )
    cols = ("N", "system", "tokens/s (range)", "step", "model states/rank", "formula", "peak RSS/rank")
    for col in (*cols, "comm/step/rank", "across groups", "loss", "max |Δ ref|"):
        table.add_column(col, justify="left" if col == "system" else "right")
    for r in doc["results"]:
        lo, hi = spread(r)
        group = r.get("shard_group", r["world"])
        table.add_row(
            str(r["world"]) + (f" ({r['world'] // group}×{group})" if group < r["world"] else ""),
            r["system"],
            f"{r['tokens_per_second']:,.0f} ({lo:,.0f}–{hi:,.0f})",
            f"{r['step_seconds'] * 1e3:.0f} ms",
            format_bytes(r["memory"]["model_state"]),
            format_bytes(r["predicted"]["model_state"]),
            format_bytes(r["max_rss_bytes"]),
            format_bytes(r["comm_bytes_per_step"]),
            format_bytes(r.get("across_bytes_per_step", 0)) if group < r["world"] else "-",
            f"{r['final_loss']:.4f}",
            f"{r['max_loss_diff']:.1e}",
        )
    return table


def spread(r: dict[str, Any]) -> tuple[float, float]:
    """The lowest and highest tokens/s over a result's repetitions."""
    reps = r.get("tokens_per_second_reps") or [r["tokens_per_second"]]
    return min(reps), max(reps)


def verdict(z: dict[str, Any], p: dict[str, Any]) -> str:
    """zerotrain against a peer on throughput: equal while the two ranges of repetitions overlap (this machine's
    run-to-run spread is ±15%), else faster or slower."""
    (zlo, zhi), (plo, phi) = spread(z), spread(p)
    if zlo > phi:
        return "faster"
    if zhi < plo:
        return "slower"
    return "equal (within the spread)"


def ratio_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """zerotrain / peer for every pair both of which ran, at every world size."""
    by = _by_key(doc)
    rows = []
    for (system, world), z in by.items():
        for peer in PEERS.get(system, []):
            p = by.get((peer, world))
            if p is None:
                continue
            comm = z["comm_bytes_per_step"] / p["comm_bytes_per_step"] if p["comm_bytes_per_step"] else None
            rows.append(
                {
                    "world": world,
                    "zerotrain": system,
                    "peer": peer,
                    "throughput": z["tokens_per_second"] / p["tokens_per_second"],
                    "verdict": verdict(z, p),
                    "model_states": z["memory"]["model_state"] / p["memory"]["model_state"],
                    "peak_rss": z["max_rss_bytes"] / p["max_rss_bytes"],
                    "comm": comm,
                    "loss_diff": z["final_loss"] - p["final_loss"],
                }
            )
    return sorted(rows, key=lambda r: (r["world"], r["zerotrain"]))


def ratios_table(doc: dict[str, Any]) -> Table:
    table = Table(title="zerotrain ÷ peer (throughput > 1: zerotrain faster; memory and comm < 1: it holds/sends less)")
    cols = ("N", "zerotrain", "peer", "tokens/s ×", "throughput", "model states ×", "peak RSS ×", "comm/step ×")
    for col in (*cols, "Δ loss"):
        table.add_column(col, justify="left" if col in ("zerotrain", "peer", "throughput") else "right")
    for r in ratio_rows(doc):
        table.add_row(
            str(r["world"]),
            r["zerotrain"],
            r["peer"],
            f"{r['throughput']:.2f}",
            r["verdict"],
            f"{r['model_states']:.2f}",
            f"{r['peak_rss']:.2f}",
            "-" if r["comm"] is None else f"{r['comm']:.2f}",
            f"{r['loss_diff']:+.1e}",
        )
    return table


def print_tables(doc: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(width=200)
    env = doc["environment"]
    console.print(
        f"{env['nproc']} × {env['cpu']}; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
        + f"; {doc['byte_convention']}"
    )
    console.print(figures_table(doc))
    console.print(ratios_table(doc))
    for system, why in doc["skipped"].items():
        console.print(f"skipped {system}: {why}")


def plot_all(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    """docs/compare-{throughput,memory,comm}.png; nothing (and a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plots: matplotlib is not installed (pip install -c constraints.txt '.[bench]')")
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in (("throughput", _throughput), ("memory", _memory), ("comm", _comm)):
        fig = draw(doc, plt)
        if fig is None:
            continue
        path = out_dir / f"compare-{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


def _systems(doc: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for r in doc["results"]:
        if r["system"] not in seen:
            seen.append(r["system"])
    return seen


def _worlds(doc: dict[str, Any]) -> list[int]:
    return sorted({r["world"] for r in doc["results"]})


def _throughput(doc: dict[str, Any], plt: Any) -> Any:
    systems, worlds, by = _systems(doc), _worlds(doc), _by_key(doc)
    fig, ax = plt.subplots(figsize=(max(6, len(systems) * 0.9), 4))
    width = 0.8 / len(worlds)
    for i, w in enumerate(worlds):
        xs = [j + i * width for j, s in enumerate(systems) if (s, w) in by]
        ys = [by[(s, w)]["tokens_per_second"] for s in systems if (s, w) in by]
        ax.bar(xs, ys, width, label=f"N = {w}")
    ax.set_xticks([j + width * (len(worlds) - 1) / 2 for j in range(len(systems))], systems, rotation=30)
    ax.set_ylabel("tokens/s (global)")
    ax.set_title("Throughput by system and world size (fp32, gloo, 1 thread per rank)")
    ax.legend()
    return fig


def _memory(doc: dict[str, Any], plt: Any) -> Any:
    world = max(w for w in _worlds(doc))
    rows = [r for r in doc["results"] if r["world"] == world]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.9), 4))
    xs = range(len(rows))
    bottom = [0.0] * len(rows)
    for cat in CATEGORIES:
        ys = [r["memory"][cat] / 1e6 for r in rows]
        ax.bar(xs, ys, 0.6, bottom=bottom, label=f"{cat} (counted)")
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    for x, r in zip(xs, rows, strict=True):
        ax.hlines(r["predicted"]["model_state"] / 1e6, x - 0.4, x + 0.4, colors="black", linestyles="--")
    ax.plot([], [], "k--", label="ZeRO formula (4Ψ+4Ψ+8Ψ, sharded per stage)")
    ax.set_xticks(list(xs), [r["system"] for r in rows], rotation=30)
    ax.set_ylabel("MB per rank")
    ax.set_title(f"Model states per rank by category, N = {world}, Ψ = {rows[0]['parameters']:,}")
    ax.legend(fontsize="small")
    return fig


def _comm(doc: dict[str, Any], plt: Any) -> Any:
    worlds = [w for w in _worlds(doc) if w > 1]
    if not worlds:
        return None
    systems, by = _systems(doc), _by_key(doc)
    fig, ax = plt.subplots(figsize=(max(6, len(systems) * 0.9), 4))
    width = 0.8 / len(worlds)
    for i, w in enumerate(worlds):
        present = [(j, by[(s, w)]) for j, s in enumerate(systems) if (s, w) in by]
        # Ψ fp32 elements sent (N-1)/N each: the ZeRO paper's unit, so DDP sits at 2 and stage 3 at 3.
        ys = [r["comm_bytes_per_step"] / (4 * r["parameters"] * (w - 1) / w) for _, r in present]
        ax.bar([j + i * width for j, _ in present], ys, width, label=f"N = {w}")
    for level, style in ((2, ":"), (3, "--")):
        ax.axhline(level, color="black", linestyle=style, label=f"{level}Ψ")
    ax.set_xticks([j + width * (len(worlds) - 1) / 2 for j in range(len(systems))], systems, rotation=30)
    ax.set_ylabel("bytes sent per step per rank ÷ (4 B · Ψ · (N-1)/N)")
    ax.set_title("Communication per step against the ZeRO paper's 2Ψ and 3Ψ (fp32 elements, ring)")
    ax.legend(fontsize="small")
    return fig
