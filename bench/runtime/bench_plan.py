"""The memory plan against measured peaks: predicted whole peak per rank next to the live tensor bytes measured.

    python bench/runtime/bench_plan.py               # the matrix: stages 0-3 x checkpointing x 3 sizes x world 1, 2, 4
    python bench/runtime/bench_plan.py --quick       # one size, world 2
    python bench/runtime/bench_plan.py --json out.json --plot docs/memory-plan.png

Each configuration trains the example GPT (`zerotrain.runtime.examples.gpt`) for three steps on gloo, with every
rank under `zerotrain.runtime.zero.live_bytes.LiveBytes` from before its model is built, and prints the most bytes alive
at once next to `zerotrain plan`'s whole peak for the same manifest (its `spec.model.shape`, the formula's activations).
The error is (predicted - measured) / measured. The corpus is kept to 20 kB so the entry point's own tensors,
which no plan knows, stay out of the comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# compare_systems (bench/compare) and this script's own folder, also for spawned ranks.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zerotrain.plan.inputs import peak_input
from zerotrain.plan.peak import peak_plan
from zerotrain.quantity import format_bytes
from zerotrain.runtime.job.launch import free_port
from zerotrain.runtime.zero.live_bytes import LiveBytes
from zerotrain.spec import ZeroTrainingJobSpec

SIZES = {  # name: (layers, hidden, heads, sequence length, sequences per rank)
    "small": (2, 64, 2, 64, 4),
    "medium": (4, 128, 4, 128, 8),
    "large": (6, 256, 8, 128, 8),
}
STEPS = 3
CORPUS_BYTES = 20_000


@dataclass(frozen=True)
class Case:
    """One configuration of the matrix."""

    size: str
    stage: int
    checkpointing: bool
    world: int
    precision: str = "fp32"
    system: str = "zerotrain"
    """zerotrain, or fsdp2 (the same model under FSDP2's fully_shard, as bench/compare/compare.py builds it)."""

    def spec(self) -> ZeroTrainingJobSpec:
        layers, hidden, heads, seq, micro = SIZES[self.size]
        return ZeroTrainingJobSpec.model_validate(
            {
                "image": "local",
                "entrypoint": "zerotrain.runtime.examples.gpt:build",
                "replicas": self.world,
                "zero": {
                    "stage": self.stage,
                    "unitModules": ["Block"],
                    "precision": self.precision,
                    "activationCheckpointing": self.checkpointing,
                },
                "model": {
                    "shape": {
                        "layers": layers,
                        "hidden": hidden,
                        "heads": heads,
                        "sequenceLength": seq,
                        "vocabulary": 256,
                        "microBatchSize": micro,
                    }
                },
            }
        )


def predicted(case: Case) -> dict[str, Any]:
    p = peak_input(case.spec(), foreach_step=False)
    assert p is not None
    return peak_plan(p).model_dump(mode="json")


def _rank(rank: int, case: Case, port: int, out: str) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=case.world)
    from zerotrain.runtime.examples.gpt import build

    layers, hidden, heads, seq, micro = SIZES[case.size]
    live = LiveBytes()
    with live:
        torch.manual_seed(0)
        task = build(
            rank,
            case.world,
            seq_len=seq,
            batch_size=micro * case.world,
            d_model=hidden,
            n_layers=layers,
            n_heads=heads,
            max_bytes=CORPUS_BYTES,
        )
        system = _system(case, task.model)
        for _ in range(STEPS):
            batch = next(task.batches)
            with live.phase("backward"):
                loss = task.loss(system.forward(task.inputs(batch)), batch)
                system.backward(loss)
                del loss
            with live.phase("step"):
                system.step()
        report = (
            system.engine.accounting().memory_report().model_dump(mode="json") if case.system == "zerotrain" else None
        )
    Path(out, f"{rank}.json").write_text(json.dumps({"peak": live.peak, "phases": live.phase_peaks, "report": report}))
    del system, task
    gc.collect()
    dist.destroy_process_group()


def _system(case: Case, model: torch.nn.Module) -> Any:
    from compare_systems import ZeroSystem, _torch_system

    if case.system == "fsdp2":
        return _torch_system("fsdp2", model)
    from zerotrain.runtime import ZeroEngine

    return ZeroSystem(ZeroEngine(model, case.spec().zero, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3)))


def measure_peak(case: Case) -> tuple[int, list[dict[str, Any]]]:
    """The largest rank's measured peak, and every rank's record."""
    with tempfile.TemporaryDirectory() as out:
        mp.set_forkserver_preload(["torch", "torch.distributed", "zerotrain.runtime.zero.engine"])  # imported once
        mp.start_processes(_rank, args=(case, free_port(), out), nprocs=case.world, start_method="forkserver")
        ranks = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(case.world)]
    return max(r["peak"] for r in ranks), ranks


def measure(case: Case) -> dict[str, Any]:
    """Run the case's ranks and return the prediction, each rank's measured peak and the largest error."""
    measured, ranks = measure_peak(case)
    plan = predicted(case)
    return {
        "case": asdict(case),
        "predicted": plan,
        "measured_peak": measured,
        "measured_phases": ranks[0]["phases"],
        "report": ranks[0]["report"],
        "error": (plan["peak"] - measured) / measured,
    }


def cases(quick: bool, precisions: list[str]) -> list[Case]:
    sizes, worlds = (["medium"], [2]) if quick else (list(SIZES), [1, 2, 4])
    return [
        Case(z, s, c, n, prec)
        for prec in precisions
        for z in sizes
        for n in worlds
        for s in range(4)
        for c in (False, True)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one size at world 2")
    ap.add_argument("--precision", default="fp32", help="compute dtypes, comma-separated (fp32,bf16)")
    ap.add_argument(
        "--versus-fsdp2",
        action="store_true",
        help="also measure FSDP2 beside every fp32 stage-3 configuration without checkpointing",
    )
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="draw predicted against measured here (needs matplotlib)")
    args = ap.parse_args(argv)
    rows = []
    head = f"{'dtype':>5} {'size':>6} {'N':>2} {'stage':>5} {'ckpt':>4} {'predicted':>10} {'measured':>10} {'error':>7}"
    print(head + "  phase" + ("      FSDP2  zerotrain ÷ FSDP2" if args.versus_fsdp2 else ""))
    for case in cases(args.quick, args.precision.split(",")):
        row = measure(case)
        rows.append(row)
        versus = ""
        # The peer as bench/compare/compare.py builds it: fp32, no activation checkpointing.
        if args.versus_fsdp2 and case.stage == 3 and not case.checkpointing and case.precision == "fp32":
            row["fsdp2_peak"], _ = measure_peak(dataclasses.replace(case, system="fsdp2"))
            versus = f"  {format_bytes(row['fsdp2_peak']):>9}  {row['measured_peak'] / row['fsdp2_peak']:>17.2f}"
        c, p = row["case"], row["predicted"]
        print(
            f"{c['precision']:>5} {c['size']:>6} {c['world']:>2} {c['stage']:>5} "
            f"{'on' if c['checkpointing'] else 'off':>4} "
            f"{format_bytes(p['peak']):>10} {format_bytes(row['measured_peak']):>10} {row['error']:>+7.1%}  "
            f"{p['peak_phase']:<8}{versus}",
            flush=True,
        )
    worst = max(abs(r["error"]) for r in rows)
    print(f"largest error: {worst:.1%} over {len(rows)} configurations")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.plot:
        plot(rows, Path(args.plot))
    return 0


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 6))
    for ckpt, marker in ((False, "o"), (True, "s")):
        pts = [r for r in rows if r["case"]["checkpointing"] is ckpt]
        ax.scatter(
            [r["measured_peak"] / 1e6 for r in pts],
            [r["predicted"]["peak"] / 1e6 for r in pts],
            marker=marker,
            label=f"checkpointing {'on' if ckpt else 'off'}",
        )
    top = max(max(r["measured_peak"], r["predicted"]["peak"]) for r in rows) / 1e6 * 1.05
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8, label="predicted = measured")
    ax.set_xlabel("measured peak per rank (MB, live tensor bytes)")
    ax.set_ylabel("planned peak per rank (MB)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("zerotrain plan vs measured peak (stages 0-3, N = 1, 2, 4, fp32 and bf16)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
