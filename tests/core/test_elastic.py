"""Elastic sizes and layouts (`zerotrain.elastic`): which sizes a manifest's batch allows, and that a step's rows
fall on a gang of any such size exactly once each, as the manifest's own gang takes them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from zerotrain import elastic
from zerotrain.elastic import ElasticSpec
from zerotrain.errors import UserError
from zerotrain.manifest import parse_spec
from zerotrain.runtime.job.data import TextBatches
from zerotrain.runtime.job.elastic_batches import SlotBatches
from zerotrain.runtime.job.task import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_sizes_are_those_that_divide_a_steps_slots() -> None:
    assert elastic.sizes(4, 1, 3, ElasticSpec(min_replicas=1, max_replicas=6)) == [1, 2, 3, 4, 6]
    assert elastic.sizes(2, 2, 1, ElasticSpec(min_replicas=1, max_replicas=4)) == [1, 2]  # 4 slots, 2 ranks a pod
    assert elastic.accumulation_for_all(4, ElasticSpec(min_replicas=2, max_replicas=4)) == 3


@pytest.mark.parametrize(
    ("elastic_spec", "replicas", "accumulation", "says"),
    [
        ({"minReplicas": 5, "maxReplicas": 4}, 4, 1, "elastic.minReplicas is above elastic.maxReplicas"),
        ({"minReplicas": 1, "maxReplicas": 3}, 4, 1, "replicas is outside elastic [minReplicas, maxReplicas]"),
        (
            {"minReplicas": 3, "maxReplicas": 4},
            4,
            1,
            "no size but replicas 4 divides the global batch's 4 micro-batch slots per step "
            "(gradientAccumulationSteps 1 × 4 ranks), so the gang could never resize; set "
            "zero.gradientAccumulationSteps to 3",
        ),
    ],
)
def test_bad_elastic_ranges_are_refused_naming_the_field_and_the_fix(
    elastic_spec: dict[str, int], replicas: int, accumulation: int, says: str
) -> None:
    raw = {
        "image": "x",
        "entrypoint": "a:b",
        "replicas": replicas,
        "zero": {"gradientAccumulationSteps": accumulation},
        "elastic": elastic_spec,
        "checkpoint": {"claimName": "ckpt"},
    }
    with pytest.raises(UserError, match="elastic") as err:
        parse_spec(raw)
    assert says in str(err.value)


def test_the_manifests_size_has_no_layout_and_a_size_that_does_not_divide_is_refused() -> None:
    assert elastic.layout(4, 1, 3, 4) is None
    assert elastic.layout(4, 1, 3, 3) == elastic.Layout(4, 3, 3)
    with pytest.raises(ValueError, match="WORLD_SIZE 5 does not divide the 12 micro-batch slots"):
        elastic.layout(4, 1, 3, 5)


def _rows(world: int, reference: int = 4, accumulation: int = 3, steps: int = 2) -> list[list[torch.Tensor]]:
    """Per step, the rows every rank of a `world`-rank gang trains on, rank by rank."""
    corpus = torch.arange(256, dtype=torch.uint8).repeat(8)
    grid = elastic.layout(reference, 1, accumulation, world)
    per_step: list[list[torch.Tensor]] = [[] for _ in range(steps)]
    for rank in range(world):
        source = TextBatches(corpus, seq_len=8, batch_size=8, rank=rank % reference, world_size=reference, seed=3)
        batches = iter(source) if grid is None else SlotBatches(source, grid, rank)
        per_micro = accumulation if grid is None else grid.accumulation
        for step in range(steps):
            per_step[step] += [next(batches) for _ in range(per_micro)]
    return per_step


@pytest.mark.parametrize("world", [1, 2, 3, 6, 12])
def test_every_size_trains_each_step_on_the_manifests_rows_once_each(world: int) -> None:
    reference = _rows(4)
    for step, got in enumerate(_rows(world)):
        want = sorted(map(tuple, torch.cat(reference[step]).tolist()))
        assert sorted(map(tuple, torch.cat(got).tolist())) == want, f"step {step} at {world} ranks"


def test_a_task_whose_batches_cannot_be_sliced_is_refused_naming_elastic() -> None:
    with pytest.raises(ConfigError, match=r"spec\.elastic: the gang runs at 3 ranks, not the manifest.s 4"):
        SlotBatches(iter([torch.zeros(1)]), elastic.Layout(4, 3, 3), 0)


def test_slot_batches_resume_at_a_step_boundary() -> None:
    corpus = torch.arange(256, dtype=torch.uint8).repeat(8)
    grid = elastic.Layout(4, 3, 3)
    a = SlotBatches(TextBatches(corpus, seq_len=8, batch_size=8, rank=1, world_size=4), grid, 1)
    drawn = [next(a) for _ in range(8)]
    b = SlotBatches(TextBatches(corpus, seq_len=8, batch_size=8, rank=1, world_size=4), grid, 1)
    b.load_state_dict({"micro_batches": 4})
    assert all(torch.equal(x, y) for x, y in zip(drawn[4:], [next(b) for _ in range(4)], strict=True))


def test_at_the_manifests_size_the_slots_are_the_manifests_own_layout() -> None:
    corpus = torch.arange(256, dtype=torch.uint8).repeat(8)
    for rank in range(4):
        plain = iter(TextBatches(corpus, seq_len=8, batch_size=8, rank=rank, world_size=4))
        slots = SlotBatches(
            TextBatches(corpus, seq_len=8, batch_size=8, rank=rank, world_size=4), elastic.Layout(4, 3, 4), rank
        )
        assert all(torch.equal(next(plain), next(slots)) for _ in range(6))


def test_a_rank_at_a_size_that_does_not_divide_the_batch_refuses_to_start_naming_elastic() -> None:
    from zerotrain.runtime.job.model_start import elastic_task
    from zerotrain.runtime.job.train import RankContext

    spec = parse_spec(
        {
            "image": "i",
            "entrypoint": "zerotrain.runtime.examples.gpt:build",
            "entrypointArgs": {
                "seq_len": 8,
                "batch_size": 8,
                "d_model": 8,
                "n_layers": 1,
                "n_heads": 1,
                "max_bytes": 4096,
            },
            "replicas": 4,
            "zero": {"gradientAccumulationSteps": 3},
            "elastic": {"minReplicas": 2, "maxReplicas": 6},
            "checkpoint": {"claimName": "ckpt"},
        }
    )
    with pytest.raises(ConfigError, match=r"spec\.elastic: WORLD_SIZE 5 does not divide the 12 micro-batch slots"):
        elastic_task(spec, RankContext(rank=0, world_size=5, local_rank=0))
    shrunk, start = elastic_task(spec, RankContext(rank=2, world_size=3, local_rank=0))
    assert shrunk.zero.gradient_accumulation_steps == 4 and isinstance(start.task.batches, SlotBatches)
    same, start = elastic_task(spec, RankContext(rank=2, world_size=4, local_rank=0))
    assert same is spec and not isinstance(start.task.batches, SlotBatches)


def test_validate_says_at_which_sizes_the_gang_can_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from zerotrain.cli import main

    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    doc["spec"] |= {"replicas": 4, "elastic": {"minReplicas": 2, "maxReplicas": 5}, "checkpoint": {"claimName": "c"}}
    doc["spec"]["zero"]["gradientAccumulationSteps"] = 3
    doc["spec"]["resources"] |= {"gpu": 1, "gpuMemory": "80Gi"}
    doc["spec"]["nprocPerNode"] = 1
    doc["spec"]["entrypointArgs"]["batch_size"] = 32  # the shape's 8 rows on each of the 4 ranks
    path = tmp_path / "elastic.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "elastic: the gang can run at 2 pods (stage 3, 6 micro-batches a rank), 3 pods (stage 3, 4 micro-batches a "
        "rank), 4 pods (stage 3, 3 micro-batches a rank); not at 5 (does not divide the 12 slots)"
    ) in out, out
