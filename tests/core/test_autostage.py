"""`zero.stage: auto`: the lowest stage whose plan fits each rank's device, chosen before the ranks start, the same by
admission, `zerotrain validate`, `zerotrain plan -f` and `zerotrain run`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from zerotrain.cli import main
from zerotrain.manifest import load_job
from zerotrain.operator.controller.admission import admit
from zerotrain.plan.inputs import at_stage, memory_plan
from zerotrain.plan.model_states import DEFAULT_HEADROOM
from zerotrain.plan.process_baseline import baseline_bytes
from zerotrain.plan.stage_choice import NoStageFits, choose_stage, local_rank_memory, resolve_stage
from zerotrain.quantity import format_bytes
from zerotrain.spec import ZeroTrainingJobSpec
from zerotrain.zero_config import AutoStage, Stage

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
# Ψ = 1e9, fp32 AdamW, 4 ranks: 16, 10, 7 and 4 GB of model states per rank for stages 0-3.
BILLION = {"image": "i", "entrypoint": "m:f", "replicas": 4, "model": {"parameters": 1_000_000_000}}
GPU = {"gpu": 1, "gpuMemory": "12G"}


def spec(**extra: Any) -> ZeroTrainingJobSpec:
    return ZeroTrainingJobSpec.model_validate({**BILLION, "zero": {"stage": "auto"}, "resources": GPU, **extra})


@pytest.mark.parametrize(("memory", "stage"), [(21e9, 0), (13e9, 1), (9e9, 2), (5.5e9, 3)])
def test_the_lowest_stage_whose_plan_fits_is_chosen(memory: float, stage: int) -> None:
    choice = choose_stage(spec(), int(memory))
    assert choice.stage == stage
    # The same verdict as the plan of every fixed stage: it fits, and the stage below does not.
    fits = [memory_plan(at_stage(spec(), s), int(memory)).stages[s].fits for s in Stage]
    assert fits[stage] and not any(fits[:stage])


def test_the_choice_says_what_it_needs_and_what_the_stage_below_would() -> None:
    choice = choose_stage(spec(), 12_000_000_000)
    assert choice.message == "stage 2: 7.0 GB of model states of 9.6 GB usable of 12.0 GB; stage 1 would need 10.0 GB"


def test_nothing_fitting_names_the_smallest_world_size_for_stage_3() -> None:
    with pytest.raises(NoStageFits) as e:
        choose_stage(spec(nprocPerNode=2, resources={"gpu": 2, "gpuMemory": "1.5G"}, replicas=2), 1_500_000_000)
    # 16 GB over N ranks within 1.2 GB: N >= 14, as 7 pods of 2 ranks; at 14 ranks stage 3 fits.
    assert "stage 3 fits with at least 7 replicas (14 ranks)" in str(e.value) and "spec.zero.stage: auto" in str(
        e.value
    )
    fits = spec(nprocPerNode=2, resources={"gpu": 2, "gpuMemory": "1.5G"}, replicas=7)
    assert choose_stage(fits, 1_500_000_000).stage == Stage.PARAMETERS


def test_a_fixed_stage_is_left_as_it_is() -> None:
    fixed = ZeroTrainingJobSpec.model_validate({**BILLION, "zero": {"stage": 1}})
    assert resolve_stage(fixed) == (fixed, None)


def test_cpu_ranks_plan_against_their_share_of_the_pod_s_memory() -> None:
    cpu = spec(nprocPerNode=2, replicas=2, resources={"memory": "24G"})
    resolved, choice = resolve_stage(cpu)
    # 24 GB over 2 ranks, less each rank's own process (scaled by the headroom, which is kept on the whole process)
    tensors = 12_000_000_000 - round(baseline_bytes(cpu) / (1 - DEFAULT_HEADROOM))
    assert choice is not None and f"of {format_bytes(tensors)}" in choice.message
    assert resolved.zero.stage == choice.stage and cpu.zero.stage is AutoStage.AUTO
    assert local_rank_memory(cpu, 4) == tensors


def test_auto_without_a_size_or_memory_is_refused_naming_both(tmp_path: Path) -> None:
    doc = {"image": "i", "entrypoint": "m:f", "zero": {"stage": "auto"}}
    with pytest.raises(ValueError, match=r"model.parameters or model.shape.*resources.gpuMemory"):
        ZeroTrainingJobSpec.model_validate(doc)
    verdict = admit(doc, "job")
    assert verdict.reason == "InvalidSpec" and "zero.stage: auto" in verdict.message


def test_the_ranks_never_see_auto() -> None:
    with pytest.raises(ValueError, match=r"spec\.zero\.stage: auto is chosen before the ranks start"):
        _ = spec().zero.fixed_stage


def test_admission_hands_on_the_concrete_stage_and_why() -> None:
    verdict = admit({**BILLION, "zero": {"stage": "auto"}, "resources": GPU}, "job")
    assert verdict.admitted and verdict.spec is not None and verdict.stage_choice is not None
    assert verdict.spec.zero.stage == Stage.GRADIENTS and verdict.stage_choice.stage == Stage.GRADIENTS


def auto_quickstart(tmp_path: Path, memory: str) -> Path:
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["zero"]["stage"] = "auto"
    doc["spec"]["resources"]["memory"] = memory
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_validate_and_plan_say_which_stage_auto_chose(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = auto_quickstart(tmp_path, "2Gi")
    job = load_job(str(path)).spec
    want = choose_stage(job, local_rank_memory(job, 1))  # one rank per pod, less its process
    assert main(["validate", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"is valid: stage {want.stage.value}," in out and f"stage auto chose {want.message}" in out
    assert main(["plan", "-f", str(path)]) == 0
    assert f"stage auto chose {want.message}" in " ".join(capsys.readouterr().err.split())


@pytest.mark.slow
def test_zerotrain_run_chooses_against_each_rank_s_memory_and_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = auto_quickstart(tmp_path, "2Gi")
    job = load_job(str(path)).spec
    want = choose_stage(job, local_rank_memory(job, 2))
    summary = tmp_path / "summary.json"
    argv = ["run", str(path), "--steps", "2", "--no-metrics", "--summary-file", str(summary)]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f": stage {want.stage.value}, 2 rank(s)" in out and f"stage auto chose {want.message}" in out
    assert summary.exists()


def test_a_floor_raised_past_a_stage_that_ran_out_is_respected_and_said() -> None:
    choice = choose_stage(spec(), 12_000_000_000, floor=Stage.PARAMETERS)
    assert choice.stage == Stage.PARAMETERS and choice.message.endswith("; stage 2 ran out of memory")
    # A floor below the plan's choice changes nothing.
    assert choose_stage(spec(), 12_000_000_000, floor=Stage.OPTIMIZER_STATES).stage == Stage.GRADIENTS
