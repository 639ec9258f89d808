"""`zerotrain run --checkpoint-dir`: checkpoints commit, prune, resume exactly, and a corrupt one is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from budget import budget

ROOT = Path(__file__).resolve().parents[2]


def tiny_job(tmp_path: Path, steps: int) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    spec = doc["spec"]
    spec["entrypointArgs"] = {
        "seq_len": 32,
        "batch_size": 4,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 2,
        "max_bytes": 100_000,
    }
    spec.pop("model")  # its declared Ψ is the quickstart's; the runtime refuses it for this smaller GPT
    spec["training"]["steps"] = steps
    spec["training"]["logEvery"] = 1
    spec["checkpoint"] = {"intervalSteps": 2, "keepLast": 2}
    path = tmp_path / f"job-{steps}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(tmp_path: Path, job: Path, name: str, checkpoints: Path | None, *extra: str) -> tuple[dict[str, Any], str]:
    summary = tmp_path / f"{name}.json"
    argv = [sys.executable, "-m", "zerotrain.cli", "run", str(job), "--summary-file", str(summary), "--no-metrics"]
    argv += extra
    if checkpoints is not None:
        argv += ["--checkpoint-dir", str(checkpoints)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=budget(240), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(summary.read_text()), proc.stdout + proc.stderr


@pytest.mark.slow
def test_resume_skips_a_corrupt_checkpoint_and_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first, output = run(tmp_path, tiny_job(tmp_path, 6), "first", ckpt)
    assert len(first["losses"]) == 6
    # The progress display reports each commit and keeps going after it.
    saved = by_step(ckpt)
    for step in (2, 4, 6):
        assert f"checkpoint committed at step {step}: {ckpt.resolve()}/step-{step:08d}-" in " ".join(output.split())
    assert "step 6/6" in output
    # Saved at 2, 4, 6, each in a fresh directory; keepLast=2 pruned step 2.
    assert sorted(saved) == [4, 6]
    marker = json.loads((saved[6] / "COMMITTED").read_text())
    assert (
        marker["step"] == 6
        and marker["micro_batches"] == 6
        and marker["world_size"] == 2
        and sorted(marker["files"]) == ["rank-00000.safetensors", "rank-00001.safetensors"]
    )

    victim = saved[6] / "rank-00001.safetensors"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: the file still parses, only the digest tells
    victim.write_bytes(bytes(data))

    resumed, output = run(tmp_path, tiny_job(tmp_path, 8), "resumed", ckpt)
    assert f"{saved[6].name} refused" in output
    assert "rank-00001.safetensors does not match the SHA-256" in output
    assert f"resumed from {saved[4]} at step 4" in output
    assert len(resumed["losses"]) == 4  # steps 5-8
    assert "over steps 5–8 (4, resumed after 4)" in output, output  # what this invocation ran, not the job's 8

    straight, _ = run(tmp_path, tiny_job(tmp_path, 8), "straight", None)
    # Same data order, same thread count: resuming from step 4 reproduces steps 5-8 bit for bit.
    assert resumed["losses"] == straight["losses"][4:]
    assert sorted(by_step(ckpt)) == [6, 8]

    # Run again (as a gang restarted after its final checkpoint would): nothing left to train, and no failure.
    again, output = run(tmp_path, tiny_job(tmp_path, 8), "again", ckpt)
    assert f"resumed from {by_step(ckpt)[8]} at step 8" in output and "no steps left" in output
    assert "step 8/8" in output, output  # the bar starts where the checkpoint left off
    assert again["losses"] == [] and again["final_loss"] is None


def by_step(root: Path) -> dict[int, Path]:
    """The checkpoint directories under `root` by step (each save has its own `step-N-<token>` directory)."""
    out: dict[int, Path] = {}
    for p in root.iterdir():
        step = int(p.name.split("-")[1])
        assert step not in out, f"two directories for step {step}"
        out[step] = p
    return out


@pytest.mark.slow
def test_reported_loss_is_the_global_batch_mean_at_any_world_size(tmp_path: Path) -> None:
    """Rank r trains on its slice of the same global batch; the reported loss averages over ranks, so 1 and 4
    ranks report the same numbers (up to fp32 summation order; 2 ranks against 1: test_run_schedule_evaluation)."""
    job = tiny_job(tmp_path, 3)
    losses = {n: run(tmp_path, job, f"n{n}", None, "--nproc", str(n))[0]["losses"] for n in (1, 4)}
    assert losses[4] == pytest.approx(losses[1], rel=1e-5)
