"""Hybrid sharding (`zero.shardGroupSize`) on real gloo ranks: model states sharded inside groups of S consecutive
ranks and replicated across the W/S groups train exactly as single-process AdamW on the global batch (stages 1-3,
with accumulation, clipping and the stage-3 prefetch); each rank holds the formula's states for S ranks, not W;
bytes inside a group are the plain-ZeRO figure at N = S, and the only bytes across groups are one all-reduce of the
shard per step, whatever the accumulation — both against the plan's `comm_bytes_per_step`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from dist_helpers import run_ranks
from test_reshard import resume_two_more, save_after_three
from test_stages import Case, _check_memory, _check_parity, engine_for, run_case

from zerotrain.plan.peak import ACROSS_GROUPS
from zerotrain.runtime.checkpoints import checkpoint
from zerotrain.runtime.checkpoints.shard_file import ShardReader


def _hybrid_case(rank: int, world: int, case: Case) -> dict[str, Any]:
    out = run_case(rank, world, case)
    engine = engine_for(case)  # a fresh engine of the same case: its plan, not its traffic
    out["planned"] = engine.accounting().planned_comm()
    out["shard_ranks"], out["replica"] = engine._shard_ranks, engine._replica
    return out


def _hybrid_cases(rank: int, world: int, cases: list[Case]) -> list[dict[str, Any]]:
    return [_hybrid_case(rank, world, c) for c in cases]


def _check_bytes(r: dict[str, Any], case: Case, world: int, group: int) -> None:
    """Every step moves what the plan says, op by op; across groups, one all-reduce of the padded shard."""
    ops = r["ops_per_step"]
    shard = sum(r["unit_bytes"].values()) // group
    across = 2 * shard * (world // group - 1) // (world // group)
    assert abs(ops[ACROSS_GROUPS] - across) <= 64 * len(r["unit_bytes"]), (ops, across)
    for op, planned in r["planned"].items():
        assert abs(ops.get(op, 0) - planned) <= 0.01 * planned, (op, ops, r["planned"])


def _cases() -> list[Case]:
    # Accumulation 2 on stages 2/3: the shard is reduce-scattered inside the group every micro-batch but averaged
    # across groups once per step.
    return [
        Case(stage=1, extra={"shard_group_size": 2}),
        Case(stage=2, tied=False, accum=2, clip=0.5, extra={"shard_group_size": 2}),
        Case(stage=3, accum=2, extra={"shard_group_size": 2}),
        Case(stage=3, bucket=64, overlap=False, extra={"shard_group_size": 2}),
    ]


@pytest.mark.slow
def test_four_ranks_as_two_groups_of_two_match_adamw() -> None:
    cases = _cases()
    per_rank = run_ranks(_hybrid_cases, 4, cases, timeout=300)
    for rank, results in enumerate(per_rank):
        for case, r in zip(cases, results, strict=True):
            _check_parity(r)
            _check_memory(r)  # predicted at N = S = 2: each rank holds half, not a quarter
            assert r["memory"]["world_size"] == 4 and r["memory"]["shard_group_size"] == 2
            assert (r["shard_ranks"], r["replica"]) == (2, rank // 2)
            _check_bytes(r, case, 4, 2)
    # The same shard on ranks 0 and 2 (the same place in the two groups): replicas, bit for bit.
    for a, b in zip(per_rank[0], per_rank[2], strict=True):
        torch.testing.assert_close(a["got"], b["got"], rtol=0, atol=0)


@pytest.mark.slow
def test_eight_ranks_as_two_groups_of_four_match_adamw() -> None:
    cases = [Case(stage=3, accum=2, extra={"shard_group_size": 4})]
    per_rank = run_ranks(_hybrid_cases, 8, cases, timeout=300)
    for results in per_rank:
        for case, r in zip(cases, results, strict=True):
            _check_parity(r)
            _check_memory(r)
            _check_bytes(r, case, 8, 4)


def _both_ways(rank: int, world: int, root: str) -> list[dict[str, object]]:
    """In one spawn of 4 ranks: saved by 2 groups of 2 at stage 3 and loaded by the 4 ranks plain at stage 2; then
    saved plain at stage 3 and loaded by 2 groups of 2."""
    save_after_three(rank, world, f"{root}/hybrid", 3, None, 2)
    into_plain = resume_two_more(rank, world, f"{root}/hybrid", 2, world)
    save_after_three(rank, world, f"{root}/plain", 3)
    return [into_plain, resume_two_more(rank, world, f"{root}/plain", 3, world, 2)]


@pytest.mark.slow
def test_a_hybrid_checkpoint_holds_one_copy_and_reloads_either_way(tmp_path: Path) -> None:
    """Training goes on exactly both ways; the second group's files hold no model states (the first group's are the
    same bytes)."""
    for loads in run_ranks(_both_ways, 4, str(tmp_path), timeout=300):
        for r in loads:
            _check_parity({**r, "norms": [], "ref_norms": []})
    saved = checkpoint.committed(tmp_path / "hybrid")[0]
    files = [ShardReader(saved / checkpoint.rank_file(r)) for r in range(4)]
    held = [sorted(n for n in f.names if not n.startswith("rng.")) for f in files]
    assert held[0] and held[1] and held[2] == held[3] == [], held  # masters and Adam moments only in group 0
