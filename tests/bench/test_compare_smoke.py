"""bench/compare/compare.py: its loss check can fail, its byte convention is zerotrain's, and a tiny run goes
through."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from budget import budget

BENCH = Path(__file__).resolve().parents[2] / "bench" / "compare"
sys.path.insert(0, str(BENCH))

import compare  # noqa: E402
from compare_comm import RULES  # noqa: E402

SMOKE_SYSTEMS = ["zero1", "zero3", "ddp", "fsdp2"]


def test_loss_check_names_the_system_and_step_that_left_the_reference() -> None:
    reference = [5.5, 5.4, 5.3]
    assert compare.check_agreement("ddp", 2, [5.5, 5.4 + 5e-6, 5.3], reference, atol=1e-4) == pytest.approx(5e-6)
    with pytest.raises(compare.LossDisagreement, match=r"zero3 \(N=2\) step 1: .*> atol 1e-04"):
        compare.check_agreement("zero3", 2, [5.5, 5.4 + 1e-2, 5.3 + 1e-2], reference, atol=1e-4)
    with pytest.raises(compare.LossDisagreement, match="zero2"):
        compare.check_agreement("zero2", 2, [5.5, float("nan"), 5.3], reference, atol=1e-4)


def test_a_disagreement_makes_the_run_exit_non_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failure = "zero3 (N=2) step 1: loss 5.410000, reference 5.400000, |diff| 1.00e-02 > atol 1e-04"
    monkeypatch.setattr(compare, "run_all", lambda args, systems: ([5.5, 5.4], [], [failure]))
    assert compare.main(["--systems", "zero3", "--out", str(tmp_path / "c.json"), "--no-plots"]) == 1
    assert failure in capsys.readouterr().err
    assert json.loads((tmp_path / "c.json").read_text())["failures"] == [failure]


def test_byte_convention_is_the_ring_one_zerotrain_reports() -> None:
    full, shard = torch.zeros(1000), torch.zeros(250)  # 4000 and 1000 bytes, N = 4
    assert RULES["c10d.allreduce_"](([full],), 4, 0) == (6000, 4000)  # 2(N-1)/N
    assert RULES["c10d._allgather_base_"]((full, shard), 4, 0) == (3000, 4000)  # (N-1)/N of the full tensor
    assert RULES["c10d._reduce_scatter_base_"]((shard, full), 4, 0) == (3000, 4000)
    assert RULES["c10d.broadcast_"](([full], None, 1), 4, 1) == (4000, 4000)  # the source sends it
    assert RULES["c10d.broadcast_"](([full], None, 1), 4, 0) == (0, 4000)


def _tiny(tmp_path: Path, *extra: str, timeout: float = 240) -> tuple[dict, str]:
    out = tmp_path / "compare.json"
    args = ["--steps", "2", "--warmup", "0", *extra]
    args += ["--d-model", "32", "--layers", "1", "--heads", "4", "--seq-len", "16", "--batch", "4"]
    args += ["--max-bytes", "20000", "--out", str(out), "--plots", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, str(BENCH / "compare.py"), *args], capture_output=True, text=True, timeout=budget(timeout)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
def test_tiny_comparison_runs_every_requested_system_and_agrees(tmp_path: Path) -> None:
    doc, _ = _tiny(tmp_path, "--worlds", "2", "--systems", ",".join(SMOKE_SYSTEMS), "--reps", "1")
    assert [r["system"] for r in doc["results"]] == SMOKE_SYSTEMS
    for r in doc["results"]:
        assert r["tokens_per_second"] > 0 and r["comm_bytes_per_step"] > 0, r["system"]
        assert r["memory"]["model_state"] > 0 and r["max_rss_bytes"] > 0, r["system"]
        assert r["max_loss_diff"] <= 1e-4, r["system"]
        assert len(r["losses"]) == 2
    zero3 = next(r for r in doc["results"] if r["system"] == "zero3")
    # Counted at the dispatcher and by the engine itself: the same bytes.
    assert zero3["comm_bytes_per_step"] == zero3["engine_comm_bytes_per_step"]
    assert {p.name for p in tmp_path.glob("*.png")} == {f"compare-{n}.png" for n in ("throughput", "memory", "comm")}


@pytest.mark.slow
def test_hybrid_sharding_beside_fsdp2_hsdp_counts_the_bytes_between_groups(tmp_path: Path) -> None:
    """World 4 as two groups of two, zerotrain stage 3 beside FSDP2 on a (2, 2) mesh: both agree with
    the reference, hold half the model states (not a quarter), and send the same bytes across groups; zerotrain's
    own count equals the dispatcher's; the report gives each figure's range and a verdict on it."""
    doc, printed = _tiny(tmp_path, "--worlds", "4", "--shard-group", "2", "--systems", "zero3,fsdp2", "--reps", "1")
    zero3, fsdp2 = (next(r for r in doc["results"] if r["system"] == s) for s in ("zero3", "fsdp2"))
    for r in (zero3, fsdp2):
        assert r["max_loss_diff"] <= 1e-4 and r["shard_group"] == 2 and len(r["tokens_per_second_reps"]) == 1
        assert r["predicted"]["model_state"] * 0.9 <= r["memory"]["model_state"] <= r["predicted"]["model_state"] * 1.1
        assert 0 < r["across_bytes_per_step"] < r["comm_bytes_per_step"]
    assert zero3["comm_bytes_per_step"] == zero3["engine_comm_bytes_per_step"]
    assert zero3["across_bytes_per_step"] == pytest.approx(fsdp2["across_bytes_per_step"], rel=0.05)
    assert "4 (2×2)" in printed and any(v in printed for v in ("equal (within the spread)", "faster", "slower"))


def test_the_verdict_is_equal_while_the_ranges_overlap() -> None:
    from compare_report import verdict

    def r(*reps: float) -> dict:
        return {"tokens_per_second": sorted(reps)[len(reps) // 2], "tokens_per_second_reps": list(reps)}

    assert verdict(r(100, 120, 110), r(115, 130, 125)) == "equal (within the spread)"
    assert verdict(r(140, 150), r(100, 120)) == "faster"
    assert verdict(r(80, 90), r(100, 120)) == "slower"
