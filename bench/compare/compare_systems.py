"""The systems `compare.py` runs, and one rank's training run of one of them.

Every system trains zerotrain's byte-level GPT from the same seed on the same global batches with AdamW
(lr 1e-3, weight decay 0.1 on every parameter, no clipping, fp32). A rank writes its figures to a JSON file
(`<out_dir>/<rank>.json`) that the parent reads once all ranks have exited.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from compare_comm import CommCounter
from torch import nn

from zerotrain.runtime.zero.memory import StorageCounter

ZEROTRAIN = ["zero0", "zero1", "zero2", "zero3", "zero3-compile"]
TORCH = ["ddp", "zro", "fsdp2", "fsdp2-keep", "fsdp2-compile"]
DEEPSPEED = ["ds1", "ds2", "ds3"]
SYSTEMS = ZEROTRAIN + TORCH + DEEPSPEED
LABELS = {
    **{f"zero{s}": f"zerotrain stage {s}" for s in range(4)},
    "ddp": "DDP",
    "zro": "DDP + ZeroRedundancyOptimizer",
    "fsdp2": "FSDP2 (reshard after forward)",
    "fsdp2-keep": "FSDP2 (keep after forward)",
    "zero3-compile": "zerotrain stage 3, compiled blocks",
    "fsdp2-compile": "FSDP2, compiled blocks",
    **{f"ds{s}": f"DeepSpeed ZeRO-{s}" for s in range(1, 4)},
}
HYBRID = ["zero1", "zero2", "zero3", "zero3-compile", "fsdp2", "fsdp2-keep", "fsdp2-compile"]
"""The systems `--shard-group` shards within groups (stage 0, DDP and ZeroRedundancyOptimizer stay as they are)."""
# The ZeRO stage whose memory formula each system implements.
FORMULA_STAGE = {"ddp": 0, "zro": 1, "fsdp2": 3, "fsdp2-keep": 3, "fsdp2-compile": 3, "zero3-compile": 3}
FORMULA_STAGE.update({f"zero{s}": s for s in range(4)})
FORMULA_STAGE.update({f"ds{s}": s for s in range(1, 4)})
LR, WEIGHT_DECAY = 1e-3, 0.1


@dataclass
class RunSpec:
    """One system at one world size: what every rank of the run is told."""

    system: str
    world: int
    port: int
    out_dir: str
    d_model: int
    layers: int
    heads: int
    seq_len: int
    batch: int
    steps: int
    warmup: int
    device: str
    max_bytes: int
    shard_group: int = 0
    """Hybrid sharding: shard over groups of this many ranks and replicate across them (zerotrain's
    zero.shardGroupSize, FSDP2's HSDP on a (replicate, shard) mesh); 0 or the world: plain sharding."""

    @property
    def hybrid(self) -> bool:
        return 0 < self.shard_group < self.world


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _count(counter: StorageCounter, tensors: Any) -> int:
    return counter.count(_local(t) for t in tensors if isinstance(t, torch.Tensor))


def _state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


class System:
    """A model and its optimizer behind one interface: forward, backward, step, what it holds."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        self.model, self.opt = model, opt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.opt.step()
        # Gradients stay allocated between steps, as zerotrain's buffers do: what the formula counts.
        self.opt.zero_grad(set_to_none=False)

    def memory(self) -> dict[str, int]:
        """Parameter, gradient and optimizer-state bytes this rank holds (each storage once)."""
        c = StorageCounter()
        params = list(self.model.parameters())
        opt = getattr(self.opt, "optim", self.opt)  # ZeroRedundancyOptimizer keeps its shard's optimizer there
        return {
            "parameter": _count(c, params),
            "gradient": _count(c, [p.grad for p in params]),
            "optimizer": _count(c, _state_tensors(opt)),
        }

    def engine_comm_bytes(self) -> int | None:
        return None


class ZeroSystem(System):
    """zerotrain's ZeroEngine: counts its own memory and communication."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine, engine.optimizer)
        self.engine = engine

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> None:
        self.engine.step()

    def memory(self) -> dict[str, int]:
        r = self.engine.accounting().memory_report()
        return {"parameter": r.parameter_bytes, "gradient": r.gradient_bytes, "optimizer": r.optimizer_bytes}

    def engine_comm_bytes(self) -> int:
        return sum(int(s["bytes"]) for s in self.engine.accounting().comm_report().values())


class DeepSpeedSystem(System):
    """A DeepSpeed engine; its ZeRO optimizer keeps flat buffers whose names differ between stages."""

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss)  # type: ignore[operator]

    def step(self) -> None:
        self.model.step()  # type: ignore[operator]

    def memory(self) -> dict[str, int]:
        c = StorageCounter()
        zo = self.opt
        params: list[Any] = list(getattr(zo, "bit16_groups_flat", []))
        for p in self.model.parameters():
            # Stage 3: the partition, plus the full tensor of the small parameters it keeps gathered.
            params += [getattr(p, "ds_tensor", None), p.data if p.data.numel() else None]
        grads: list[Any] = [p.grad for p in self.model.parameters()]
        grads += [getattr(zo, "grads_in_partition", None), getattr(zo, "grad_partitions_flat_buffer", None)]
        grads += [t for t in getattr(zo, "averaged_gradients", {}).values() for t in (t or [])]
        masters = list(getattr(zo, "single_partition_of_fp32_groups", [])) + list(
            getattr(zo, "fp32_partitioned_groups_flat", [])
        )
        grads += [m.grad for m in masters]
        return {
            "parameter": _count(c, params),
            "gradient": _count(c, grads),
            "optimizer": _count(c, _state_tensors(zo.optimizer) + masters),  # type: ignore[attr-defined]
        }


def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY)


def _torch_system(name: str, model: nn.Module, spec: RunSpec | None = None) -> System:
    """DDP, ZeroRedundancyOptimizer or FSDP2 around `model`; `spec` only for HSDP's mesh (bench_plan passes none)."""
    if name in ("ddp", "zro"):
        ddp = nn.parallel.DistributedDataParallel(model)
        if name == "ddp":
            return System(ddp, _adamw(ddp.parameters()))
        from torch.distributed.optim import ZeroRedundancyOptimizer

        zro = ZeroRedundancyOptimizer(
            ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=LR, weight_decay=WEIGHT_DECAY
        )
        return System(ddp, zro)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    keep = name == "fsdp2-keep"
    mesh = None
    if spec is not None and spec.hybrid:
        # HSDP: a 2-D mesh, shard inside each group of consecutive ranks, replicate across the groups.
        shape = (spec.world // spec.shard_group, spec.shard_group)
        mesh = init_device_mesh(spec.device, shape, mesh_dim_names=("replicate", "shard"))
    for block in model.blocks:  # type: ignore[union-attr]
        if name == "fsdp2-compile":
            # Per block, as torchtitan does; FSDP2's hooks stay around the compiled forward, as zerotrain's do
            # (zerotrain's wrapper: the counted step runs under a dispatch mode, which dynamo cannot trace).
            from zerotrain.runtime.zero.compiled import CompiledForward

            block.forward = CompiledForward("block", block.forward, {})
        fully_shard(block, mesh=mesh, reshard_after_forward=not keep)
    fully_shard(model, mesh=mesh, reshard_after_forward=not keep)
    return System(model, _adamw(model.parameters()))


def _deepspeed_system(name: str, model: nn.Module, spec: RunSpec) -> System:
    import deepspeed

    config = {
        "train_micro_batch_size_per_gpu": spec.batch // spec.world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        # torch_adam: torch.optim.AdamW itself, not DeepSpeed's fused kernel, so only the sharding differs.
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY, "torch_adam": True}},
        "zero_optimization": {"stage": int(name[-1])},
    }
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return DeepSpeedSystem(engine, opt)


def build_system(name: str, model: nn.Module, unit_modules: list[str], spec: RunSpec) -> System:
    if name in ZEROTRAIN:
        from zerotrain.runtime import ZeroConfig, ZeroEngine

        # Same optimisation as the peers: decay on every parameter, no clipping.
        cfg = ZeroConfig(
            stage=int(name[4]),
            compile_units=name.endswith("-compile"),
            unit_modules=unit_modules,
            gradient_clipping=None,
            no_weight_decay=[],
            shard_group_size=spec.shard_group if spec.hybrid else None,
        )
        return ZeroSystem(ZeroEngine(model, cfg, optimizer=_adamw))
    if name in DEEPSPEED:
        return _deepspeed_system(name, model, spec)
    return _torch_system(name, model, spec)


def _init_group(spec: RunSpec, rank: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(spec.port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(spec.world),
        DS_ACCELERATOR="cuda" if spec.device == "cuda" else "cpu",
    )
    if spec.device == "cuda":
        torch.cuda.set_device(rank)
    if spec.system in DEEPSPEED:
        import deepspeed

        deepspeed.utils.logger.setLevel("WARNING")
        deepspeed.init_distributed(dist_backend="nccl" if spec.device == "cuda" else "gloo")
    else:
        from zerotrain.runtime.zero.process_group import process_group_backend

        # With CUDA, gloo too: zerotrain's small control collectives use CPU tensors.
        dist.init_process_group(process_group_backend(spec.device == "cuda"), rank=rank, world_size=spec.world)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _train(system: System, task: Any, spec: RunSpec, rank: int) -> dict[str, Any]:
    """All steps; the last is untimed and runs under the comm counter (dispatching in Python costs time)."""
    losses: list[float] = []
    seconds: list[float] = []
    counter = CommCounter(rank, spec.world, spec.shard_group if spec.hybrid else 0)
    engine_bytes = 0
    for step in range(spec.steps):
        batch = next(task.batches).to(spec.device)
        counted = step == spec.steps - 1
        if counted:
            engine_bytes = system.engine_comm_bytes() or 0
            counter.__enter__()
        if spec.world > 1:
            dist.barrier()
        _sync(spec.device)
        t0 = time.perf_counter()
        loss = task.loss(system.forward(task.inputs(batch)), batch)
        system.backward(loss)
        system.step()
        _sync(spec.device)
        if spec.warmup <= step and not counted:
            seconds.append(time.perf_counter() - t0)
        if counted:
            counter.__exit__(None, None, None)
        losses.append(loss.item())
    engine_comm = system.engine_comm_bytes()
    return {
        "losses": losses,
        "step_seconds": seconds,
        "comm_ops": counter.ops,
        "comm_bytes": counter.total_bytes(),
        "across_bytes": counter.across_bytes(),
        "engine_comm_bytes": None if engine_comm is None else engine_comm - engine_bytes,
    }


def _build_task(spec: RunSpec, rank: int, world: int, batch: int) -> Any:
    from zerotrain.runtime.examples.gpt import build

    torch.manual_seed(0)
    return build(
        rank=rank,
        world_size=world,
        seq_len=spec.seq_len,
        batch_size=batch,
        d_model=spec.d_model,
        n_layers=spec.layers,
        n_heads=spec.heads,
        max_bytes=spec.max_bytes,
    )


def run_rank(rank: int, spec: RunSpec) -> None:
    """One rank of one system's run (the target of torch.multiprocessing.spawn)."""
    torch.set_num_threads(1)
    # The peers' internals warn per process (deprecated collective names, DeepSpeed's own notes).
    warnings.simplefilter("ignore", UserWarning)
    warnings.simplefilter("ignore", FutureWarning)
    _init_group(spec, rank)
    task = _build_task(spec, rank, spec.world, spec.batch)
    task.model.to(spec.device)
    psi = sum(p.numel() for p in task.model.parameters())
    system = build_system(spec.system, task.model, task.unit_modules, spec)
    result = _train(system, task, spec, rank)
    result.update(rank=rank, parameters=psi, memory=system.memory(), spec=asdict(spec))
    result["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # On a GPU the model states live in device memory, which RSS does not see.
    result["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated() if spec.device == "cuda" else None
    Path(spec.out_dir, f"{rank}.json").write_text(json.dumps(result))
    # Free the systems (their hooks form cycles) while the group is alive: gloo state that outlives its
    # group can abort the process at exit.
    del system, task
    gc.collect()
    dist.destroy_process_group()


def run_reference(_rank: int, spec: RunSpec) -> None:
    """The plain model and torch.optim.AdamW on the whole global batch, in one process, no group."""
    torch.set_num_threads(1)
    task = _build_task(spec, 0, 1, spec.batch)
    task.model.to(spec.device)
    opt = _adamw(task.model.parameters())
    losses = []
    for _ in range(spec.steps):
        batch = next(task.batches).to(spec.device)
        loss = task.loss(task.model(task.inputs(batch)), batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    Path(spec.out_dir, "0.json").write_text(json.dumps({"losses": losses}))
