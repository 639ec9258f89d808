"""Accepted means runs, refused means would not have run: for 24 Hugging Face jobs (six families × stages 1-3, LoRA
on and off, activation checkpointing on and off, token windows and padded or packed records), the smallest
`resources.memory` that `zerotrain plan -f` accepts runs 20 steps to completion under `zerotrain run`'s limit (each
rank's data segment held to its share, as a pod's limit holds it), and 15% less is refused by validate and by run
before any rank starts.

    python bench/runtime/bench_memory_sweep.py                  # every job; its table is docs/memory.md's
    python bench/runtime/bench_memory_sweep.py --jobs 3 --json out.json

Each row: the job, the smallest memory, each rank's measured peak against its share, and what 15% less did.
tests/bench/test_bench_memory_sweep.py runs a part of it in the long tier.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hf_plan import FAMILIES, GATED_TARGETS, TARGETS, _records

from zerotrain.hf_config import HF_ENTRYPOINT, architecture

MIB = 1 << 20
STEPS = 20
SHORT = 0.85


@dataclass(frozen=True)
class Job:
    family: str
    stage: int
    lora: bool
    checkpointing: bool
    data: str
    """tokens, padded or packed."""

    @property
    def name(self) -> str:
        extra = ["lora"] * self.lora + ["ckpt"] * self.checkpointing
        return "-".join([self.family, f"stage{self.stage}", *extra, self.data])


VARIANTS = (
    (1, False, False, "tokens"),
    (2, True, False, "packed"),
    (3, False, True, "padded"),
    (3, True, True, "tokens"),
)
"""Per family: stages 1-3, LoRA on and off, checkpointing on and off, each kind of data."""


def jobs() -> list[Job]:
    return [Job(f, *v) for f in FAMILIES for v in VARIANTS]


def manifest(job: Job, root: Path, memory: str) -> Path:
    """The job's manifest at `memory`: 2 ranks of one pod, 20 steps, its architecture block as --fill writes it."""
    config = FAMILIES[job.family]
    model_dir = root / job.family
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config))
    args: dict[str, Any] = {"config": str(model_dir), "seq_len": 64, "batch_size": 4}
    if job.data == "tokens":
        tokens = root / "train.bin"
        if not tokens.exists():
            np.random.default_rng(0).integers(0, 2000, 100_000).astype("<u2").tofile(tokens)
        args |= {"train": str(tokens), "token_dtype": "uint16"}
    else:
        records = root / "records" / "train.bin"
        if not records.exists():
            _records(root)
        args |= {"train": str(records), "packing": job.data == "packed", "max_truncated": 1.0}
    block = architecture(config)
    assert block is not None
    model: dict[str, Any] = {"architecture": block.model_dump(by_alias=True, exclude_defaults=True, mode="json")}
    if job.lora:
        model["lora"] = {"rank": 8, "alpha": 16, "targetModules": TARGETS.get(job.family, GATED_TARGETS)}
    spec = {
        "entrypoint": HF_ENTRYPOINT,
        "entrypointArgs": args,
        "nprocPerNode": 2,
        "resources": {"memory": memory},
        "zero": {"stage": job.stage, "activationCheckpointing": job.checkpointing},
        "model": model,
        "training": {"steps": STEPS, "logEvery": STEPS, "optimizer": {"lr": 0.001}},
    }
    doc = {"apiVersion": "zerotrain.dev/v1alpha1", "kind": "ZeroTrainingJob", "metadata": {"name": "sweep"}}
    path = root / f"{job.name}-{memory}.yaml"
    path.write_text(yaml.safe_dump({**doc, "spec": spec}))
    return path


def _zerotrain(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zerotrain.cli", *argv], capture_output=True, text=True)


def sweep_one(job: Job, root: Path) -> dict[str, Any]:
    """The job's smallest accepted memory run for 20 steps, and 15% less refused by validate and run."""
    planned = _zerotrain("plan", "-f", str(manifest(job, root, "64Gi")), "--output", "json")
    assert planned.returncode == 0, planned.stderr
    smallest = json.loads(planned.stdout)["host"]["smallestMemory"] // MIB
    summary = root / f"{job.name}.summary.json"
    ran = _zerotrain("run", str(manifest(job, root, f"{smallest}Mi")), "--no-metrics", "--summary-file", str(summary))
    result = json.loads(summary.read_text()) if summary.exists() else {}
    peaks = [int(r["process_bytes"]) for r in result.get("ranks", [])]
    short = manifest(job, root, f"{int(smallest * SHORT)}Mi")
    validated, refused_run = _zerotrain("validate", str(short)), _zerotrain("run", str(short), "--no-metrics")
    return {
        **asdict(job),
        "name": job.name,
        "smallest_mib": smallest,
        "share_bytes": smallest * MIB // 2,
        "ran": ran.returncode == 0 and result.get("outcome") == "succeeded",
        "peaks": peaks,
        "run_error": "" if ran.returncode == 0 else ran.stderr.strip().splitlines()[-1:],
        "short_refused_by_validate": validated.returncode == 2 and "resources.memory: got" in validated.stderr,
        "short_refused_by_run": refused_run.returncode == 2 and "logs:" not in refused_run.stdout,
    }


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| job | smallest resources.memory | peak per rank of its share | 20 steps | 15% less |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        peak = max(r["peaks"]) if r["peaks"] else 0
        short = "refused" if r["short_refused_by_validate"] and r["short_refused_by_run"] else "NOT refused"
        out.append(
            f"| {r['name']} | {r['smallest_mib']}Mi | {peak / 1e6:.0f} of {r['share_bytes'] / 1e6:.0f} MB | "
            f"{'ran' if r['ran'] else 'FAILED'} | {short} |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=None, help="only the first N jobs")
    parser.add_argument("--json", help="write every job's figures here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="zerotrain-sweep-") as d:
        for job in jobs()[: args.jobs]:
            row = sweep_one(job, Path(d))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
