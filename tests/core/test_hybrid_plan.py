"""Hybrid sharding in the one plan: a rank of W ranks in groups of S holds what a rank of plain ZeRO at N = S holds,
every caller (plan -f, validate, admission) says so, the bytes across groups are one all-reduce of the shard, and a
group that does not fit names the group, not the replicas, as the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from zerotrain.cli import main
from zerotrain.plan.inputs import memory_plan, peak_input
from zerotrain.plan.peak import ACROSS_GROUPS, comm_bytes_per_step
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.zero_config import Stage

SHAPE = {"layers": 4, "hidden": 128, "heads": 4, "sequenceLength": 128, "vocabulary": 256, "microBatchSize": 8}
BASE: dict[str, Any] = {"image": "x", "entrypoint": "m:build", "model": {"shape": SHAPE}}


def _spec(**kw: Any) -> ZeroTrainingJobSpec:
    return ZeroTrainingJobSpec.model_validate({**BASE, **kw})


def test_a_rank_in_groups_of_s_holds_what_plain_zero_at_s_holds() -> None:
    hybrid = _spec(replicas=4, nprocPerNode=2, zero={"shardGroupSize": "pod", "gradientAccumulationSteps": 2})
    plain = _spec(replicas=1, nprocPerNode=2, zero={"gradientAccumulationSteps": 2})
    assert hybrid.shard_group_ranks == 2
    for stage in Stage:
        a, b = memory_plan(hybrid).stages[stage], memory_plan(plain).stages[stage]
        assert a.model_state_bytes == b.model_state_bytes and a.peak == b.peak, stage
    pi = peak_input(hybrid)
    assert pi is not None and (pi.world_size, pi.shard_groups) == (2, 4)
    comm, inside = comm_bytes_per_step(pi), comm_bytes_per_step(peak_input(plain))  # type: ignore[arg-type]
    # Inside the group: plain ZeRO's traffic at N = 2; across: each shard all-reduced over 4 groups, once a step
    # although the two micro-batches are each reduce-scattered.
    assert {k: v for k, v in comm.items() if k != ACROSS_GROUPS} == inside
    shard = (sum(pi.blocks) + pi.root) // 2
    assert comm[ACROSS_GROUPS] == pytest.approx(2 * shard * 4 * 3 / 4, rel=1e-3)
    assert comm["reduce_scatter"] == 2 * (sum(pi.blocks) + pi.root) * 4 // 2


def test_stage_0_ignores_the_group() -> None:
    pi = peak_input(_spec(replicas=4, nprocPerNode=2, zero={"stage": 0, "shardGroupSize": 2}))
    assert pi is not None and (pi.world_size, pi.shard_groups) == (8, 1)


def test_validate_and_plan_say_the_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = {**BASE, "replicas": 4, "nprocPerNode": 2, "resources": {"gpu": 2, "gpuMemory": "80Gi"}}
    spec["zero"] = {"shardGroupSize": "pod"}
    path = tmp_path / "job.yaml"
    doc = {"apiVersion": "zerotrain.dev/v1alpha1", "kind": "ZeroTrainingJob", "metadata": {"name": "h"}, "spec": spec}
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path), "--no-import"]) == 0  # m:build is a stand-in
    out = " ".join(capsys.readouterr().out.split())
    assert "hybrid sharding: 4 groups of 2 ranks, each holding one copy of the model states (planned at N = 2)" in out
    assert main(["plan", "-f", str(path), "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["dataParallel"] == 2


def test_a_group_too_small_names_the_group_as_the_fix() -> None:
    from zerotrain.operator.controller.admission import admit

    # 16 GB of model states at stage 3 over N ranks: more replicas alone add copies, so the fix is the group.
    spec = {
        **BASE,
        "replicas": 8,
        "nprocPerNode": 2,
        "resources": {"gpu": 2, "gpuMemory": "1.5G"},
        "model": {"parameters": 1_000_000_000},
        "zero": {"stage": 3, "shardGroupSize": "pod"},
    }
    verdict = admit(spec, "small")
    assert not verdict.admitted
    assert "keep stage 3 with a zero.shardGroupSize of at least 14 ranks (7 pods or more per group)" in verdict.message
