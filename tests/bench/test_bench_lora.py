"""bench/runtime/bench_lora.py: a tiny run goes through and its figures are what the runs held; its agreement check
fails a system that left its kind's reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from budget import budget

BENCH = Path(__file__).resolve().parents[2] / "bench" / "runtime"
sys.path[:0] = [str(BENCH), str(BENCH.parent / "compare")]

import bench_lora  # noqa: E402


def runs(losses: list[float]) -> list[list[dict[str, object]]]:
    return [[{"losses": losses}]]


def test_a_system_off_its_kinds_reference_fails_the_run() -> None:
    close = {"zero3-lora": runs([8.0, 7.0]), "fsdp2-lora": runs([8.0, 7.001])}
    assert bench_lora.agreement(close)["fsdp2-lora"] == pytest.approx(1e-3)
    with pytest.raises(AssertionError, match="fsdp2-lora's losses leave zero3-lora's"):
        bench_lora.agreement({"zero3-lora": runs([8.0, 7.0]), "fsdp2-lora": runs([8.0, 7.5])})


@pytest.mark.slow
def test_a_tiny_run_of_zerotrain_and_fsdp2_with_adapters(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    out = tmp_path / "lora.json"
    args = ["--systems", "zero3-lora,fsdp2-lora", "--reps", "1", "--steps", "3", "--warmup", "1"]
    args += ["--hidden", "64", "--layers", "2", "--vocab", "256", "--seq-len", "16", "--batch", "4", "--rank", "2"]
    args += ["--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_lora.py"), *args], capture_output=True, text=True, timeout=budget(240)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(out.read_text())["summary"]
    lora, fsdp = summary["zero3-lora"], summary["fsdp2-lora"]
    assert lora["trained"] == fsdp["trained"]
    assert 0 < lora["memory"]["gradient"] <= 4 * lora["trained"]  # the adapters' fp32 gradients, nothing frozen
    assert lora["memory"]["parameter"] > 5 * lora["memory"]["gradient"]  # the frozen base is most of what it holds
    assert lora["first_loss"] == fsdp["first_loss"]
    assert "zero3-lora" in done.stdout
