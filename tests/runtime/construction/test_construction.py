"""Partitioned construction: every model built with each rank holding only its slice of every parameter gets the very
parameters (and random state) an ordinary build from the same seed gives, at every world size and stage; a model
whose construction cannot be partitioned is built whole, with the reason."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from dist_helpers import run_ranks
from tiny_models import TINY_DECODER, llama_config
from torch import nn

from zerotrain.runtime.construction.materialize import ConstructedValues
from zerotrain.runtime.construction.partitioned import build_partitioned
from zerotrain.runtime.job.task import ConfigError, TrainingTask
from zerotrain.runtime.zero.collectives import Comm

GPT = "zerotrain.runtime.examples.gpt:build"
GPT_ARGS = {"seq_len": 16, "batch_size": 12, "d_model": 16, "n_layers": 2, "n_heads": 2, "max_bytes": 10_000}


def ordinary(entrypoint: str, args: dict[str, Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """What an ordinary build gives: the state dict and the random state after it."""
    from zerotrain.runtime.job.task import build_task

    torch.manual_seed(0)
    task = build_task(entrypoint, rank=0, world_size=1, args=args)
    return {k: v.detach().clone() for k, v in task.model.state_dict().items()}, torch.get_rng_state()


def partitioned_engine(rank: int, world: int, entrypoint: str, args: dict[str, Any], stage: int) -> dict[str, Any]:
    import torch.distributed as dist

    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.job.model_start import start_task

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    start = start_task(entrypoint, rank=rank, world_size=world, args=args)
    rng = torch.get_rng_state()
    metas = sum(p.is_meta for p in start.task.model.parameters())
    config = ZeroConfig(stage=stage, unit_modules=start.task.unit_modules)
    engine = ZeroEngine(
        start.task.model, config, lambda g: torch.optim.SGD(g, lr=0.1), init=start.source, device=torch.device("cpu")
    )
    return {
        "state": engine.full_state_dict(),
        "rng": rng,
        "notes": start.notes,
        "placeholders": metas,
        "comm": engine.accounting().comm_report(),
    }


def _same(state: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert state.keys() == ref.keys()
    for name, value in ref.items():
        assert torch.equal(state[name], value.to(state[name].dtype)), name


@pytest.mark.slow
@pytest.mark.parametrize(("world", "stage"), [(2, 3), (3, 1), (4, 0), (2, 2)])
def test_the_built_in_gpt_gets_an_ordinary_builds_parameters_at_every_world_size_and_stage(
    world: int, stage: int
) -> None:
    ref, rng = ordinary(GPT, GPT_ARGS)
    for got in run_ranks(partitioned_engine, world, GPT, GPT_ARGS, stage):
        assert got["notes"] == [] and got["placeholders"] == len(ref) - 1  # every parameter, head tied to embed
        _same(got["state"], ref)
        assert torch.equal(got["rng"], rng)  # what is drawn afterwards (data order, dropout) is drawn alike
        assert got["comm"]["construction"]["calls"] == 3  # one gather per unit: two blocks and the root


CUSTOM_ARGS = {"width": 8, "depth": 3, "batch_size": 4}


@pytest.mark.slow
def test_the_custom_example_gets_an_ordinary_builds_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend("examples/custom")
    ref, _ = ordinary("regression:build", CUSTOM_ARGS)
    for got in run_ranks(partitioned_engine, 2, "regression:build", CUSTOM_ARGS, 3):
        _same(got["state"], ref)


def hf_llama(rank: int, world_size: int, tie: bool = False) -> TrainingTask:
    from transformers import AutoModelForCausalLM

    config = llama_config(tie)
    model = AutoModelForCausalLM.from_config(config)
    return TrainingTask(
        model=model, loss=lambda out, batch: out.logits.mean(), batches=iter([]), unit_modules=["LlamaDecoderLayer"]
    )


def hf_gpt2(rank: int, world_size: int) -> TrainingTask:
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(config)
    return TrainingTask(
        model=model, loss=lambda out, batch: out.logits.mean(), batches=iter([]), unit_modules=["GPT2Block"]
    )


def hf_mixtral(rank: int, world_size: int) -> TrainingTask:
    from transformers import AutoModelForCausalLM, MixtralConfig

    config = MixtralConfig(**TINY_DECODER, num_local_experts=4, num_experts_per_tok=2)
    model = AutoModelForCausalLM.from_config(config)
    return TrainingTask(
        model=model, loss=lambda out, batch: out.logits.mean(), batches=iter([]), unit_modules=["MixtralDecoderLayer"]
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("entrypoint", "args"),
    [
        ("test_construction:hf_llama", {}),
        ("test_construction:hf_llama", {"tie": True}),
        ("test_construction:hf_gpt2", {}),
        ("test_construction:hf_mixtral", {}),
    ],
)
def test_hugging_face_models_get_an_ordinary_builds_parameters(entrypoint: str, args: dict[str, Any]) -> None:
    pytest.importorskip("transformers")
    ref, rng = ordinary(entrypoint, args)
    for got in run_ranks(partitioned_engine, 2, entrypoint, args, 3):
        assert got["notes"] == []
        _same({k: v for k, v in got["state"].items() if k in ref}, ref)
        assert torch.equal(got["rng"], rng)


# ---------------------------------------------------------------- one process: what is recorded, what falls back


def _build(make: Any) -> Any:
    return build_partitioned(make, lambda m: m, 0, 1, passthrough=ConfigError)


def _whole_values(built: Any) -> dict[str, torch.Tensor]:
    source = ConstructedValues(built.slices, built.result)
    return source.whole(list(source.held), torch.device("cpu"), Comm(60), "all")


CAPTURED = {"trunc_normal_": nn.init.trunc_normal_, "orthogonal_": nn.init.orthogonal_}
"""Init functions kept under another name before any construction, as Hugging Face keeps torch's originals."""


class InitAfterwards(nn.Module):
    """Writes into its children's weights after they were built, in every way init code does."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 4, padding_idx=2)
        self.lin = nn.Linear(4, 5)
        self.norm = nn.LayerNorm(4)
        self.proj = nn.Linear(5, 6)
        g = torch.Generator().manual_seed(3)
        nn.init.trunc_normal_(self.lin.weight, std=0.1)  # a rejection sampler: its draws depend on its values
        CAPTURED["trunc_normal_"](self.proj.weight, std=0.2)
        nn.init.orthogonal_(self.proj.weight)
        nn.init.eye_(self.lin.weight[:, :4])  # through out=
        self.embed.weight.data.normal_(0, 0.5)
        self.embed.weight.data[2].zero_()  # a view: Hugging Face zeroes the padding row so
        with torch.no_grad():
            self.lin.bias += 1.0
            self.lin.weight[0] = 0.25
        nn.init.uniform_(self.norm.weight, generator=g)
        self.norm.bias.data = torch.full((4,), 0.5)  # new values outright


def test_writes_after_construction_replay_to_the_same_values_and_random_state() -> None:
    torch.manual_seed(0)
    ref = InitAfterwards().state_dict()
    rng = torch.get_rng_state()
    torch.manual_seed(0)
    built = _build(InitAfterwards)
    assert built.whole_because is None and torch.equal(torch.get_rng_state(), rng)
    assert all(p.is_meta for p in built.result.parameters())
    _same(_whole_values(built), ref)


class ReadsItsWeights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = float(self.lin.weight.detach().abs().max())  # reads a registered child's values


class SkipsMetaTensors(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        CAPTURED["orthogonal_"](self.lin.weight)  # would return at once on a meta tensor: refused, not skipped


class ComputesABuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("gram", self.lin.weight.detach() @ self.lin.weight.detach().T)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (ReadsItsWeights, "Linear.weight is read while the model is built"),
        (ComputesABuffer, "Linear.weight is read"),
        (SkipsMetaTensors, "asks whether Linear.weight is a meta tensor"),
    ],
)
def test_a_model_that_reads_its_weights_while_built_is_built_whole_with_the_reason(model: type, reason: str) -> None:
    torch.manual_seed(0)
    ref = model().state_dict()
    torch.manual_seed(0)
    built = _build(model)
    assert built.slices is None and reason in str(built.whole_because)
    _same(built.result.state_dict(), ref)  # the same model, built whole from the same random state


def test_parameters_kept_outside_the_task_model_make_it_build_whole() -> None:
    teacher: list[nn.Module] = []

    def entry() -> nn.Module:
        teacher.append(nn.Sequential(nn.Linear(3, 3)))  # used by the loss, not trained
        return nn.Sequential(nn.Linear(3, 2))

    built = _build(entry)
    assert built.slices is None and "outside its TrainingTask.model" in str(built.whole_because)
    assert not any(p.is_meta for p in teacher[-1].parameters())


def test_a_configuration_error_is_raised_at_once_not_retried() -> None:
    calls = []

    def entry() -> nn.Module:
        calls.append(1)
        raise ConfigError("spec.entrypointArgs.width: got -1")

    with pytest.raises(ConfigError, match="width"):
        _build(entry)
    assert calls == [1]


# ---------------------------------------------------------------- start-up memory

PEAK_ARGS = {"seq_len": 32, "batch_size": 8, "d_model": 64, "n_layers": 6, "n_heads": 4, "max_bytes": 4000}


def start_up_bytes(rank: int, world: int, partitioned: bool) -> dict[str, int]:
    """Live tensor bytes from before the entry point runs until the engine is built (the last moment before the
    first step), counted from every storage an operator returns (RSS hides frees)."""
    import gc

    import torch.distributed as dist

    from zerotrain.runtime import ZeroConfig, ZeroEngine
    from zerotrain.runtime.job.model_start import start_task
    from zerotrain.runtime.job.task import build_task
    from zerotrain.runtime.zero.live_bytes import LiveBytes

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    with LiveBytes() as live:
        if partitioned:
            start = start_task(GPT, rank=rank, world_size=world, args=PEAK_ARGS)
            task, source, device = start.task, start.source, torch.device("cpu")
            del start
        else:
            task, source, device = build_task(GPT, rank=rank, world_size=world, args=PEAK_ARGS), None, None
        config = ZeroConfig(stage=3, unit_modules=["Block"])
        engine = ZeroEngine(task.model, config, lambda g: torch.optim.AdamW(g), init=source, device=device)
        del source
        gc.collect()
        built = live.live
    return {
        "peak": live.peak,
        "built": built,
        "model": 4 * sum(u.layout.numel for u in engine.units),
        "unit": 4 * max(u.layout.padded for u in engine.units),
        "param": 4 * max(s.numel for u in engine.units for s in u.layout.slots),
    }


@pytest.mark.slow
def test_start_up_holds_the_engines_share_plus_one_unit_where_an_ordinary_build_holds_the_whole_model() -> None:
    whole = run_ranks(start_up_bytes, 4, False)
    for got in run_ranks(start_up_bytes, 4, True):
        # Beyond what the engine keeps for training (its shard of the model states, its fixed buffers): the unit
        # being gathered whole, this rank's slices of it (a quarter unit), the previous unit's gather buffer where
        # gloo's thread lets go of it late, and the one parameter whose init is being replayed; never the whole
        # model. (Bounded by two units alone it failed once in four runs here: 16 kB over, when the late buffer
        # and the slices were held at once.)
        assert got["peak"] <= got["built"] + 2 * got["unit"] + got["unit"] // 4 + got["param"], got
        assert got["peak"] < got["built"] + got["model"] / 2
    for got in whole:
        assert got["peak"] >= got["built"] + got["model"] / 2  # the ordinary build held the whole model at once


@pytest.mark.slow
def test_the_start_up_plan_bounds_the_measured_start_up_peak() -> None:
    from zerotrain.plan.start_up import start_up_plan
    from zerotrain.spec import ZeroTrainingJobSpec

    shape = {"layers": 6, "hidden": 64, "heads": 4, "sequenceLength": 32, "vocabulary": 256, "microBatchSize": 2}
    spec = ZeroTrainingJobSpec.model_validate(
        {"image": "i", "entrypoint": GPT, "replicas": 4, "zero": {"stage": 3}, "model": {"shape": shape}}
    )
    plan = start_up_plan(spec)
    assert plan is not None
    for got in run_ranks(start_up_bytes, 4, True):
        # The plan counts every slice alongside the finished engine (they are never all held at once): an upper
        # bound, within a third of what is measured.
        assert got["peak"] <= plan.per_rank <= got["peak"] * 4 // 3, (got, plan)
        assert plan.engine == pytest.approx(got["built"], rel=0.02)  # the engine as built, data aside


class _Recorder:
    """Stands in for a construction's recorder: every tensor is one it holds, every write is noted."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.slices = self

    def held(self, tensor: torch.Tensor) -> object:
        return tensor

    def write(self, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any], held: list[object]) -> None:
        self.writes.append(original.__name__)


def test_an_init_function_kept_from_one_construction_records_into_the_next_and_is_plain_outside() -> None:
    from torch.nn import init as nn_init

    from zerotrain.runtime.construction.deferred import init_functions_recorded

    first, second = _Recorder(), _Recorder()
    with init_functions_recorded(first):  # type: ignore[arg-type]
        kept = nn_init.kaiming_normal_  # as transformers keeps torch.nn.init's functions in a table
    assert nn_init.kaiming_normal_ is not kept  # torch's own is back
    torch.manual_seed(0)
    plain = kept(torch.empty(4, 4))  # no construction under way: the original's values
    torch.manual_seed(0)
    assert torch.equal(plain, nn_init.kaiming_normal_(torch.empty(4, 4))) and first.writes == []
    with init_functions_recorded(second):  # type: ignore[arg-type]
        kept(torch.empty(4, 4))
    assert second.writes == ["kaiming_normal_"] and first.writes == []
