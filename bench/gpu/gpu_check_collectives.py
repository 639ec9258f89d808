"""bench/gpu/gpu_check.py's collectives phase: the raw collectives on zerotrain's group, exact and seen by the profiler
to run on the backend, and the stage-3 engine's own collectives at world size 1 with and without
ZEROTRAIN_SINGLE_RANK_COLLECTIVES. The raw collectives also run at two ranks (bench/gpu/gpu_check_two_ranks.py)."""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from gpu_check_config import SIZES, GptSize
from gpu_check_records import OK, Checks
from gpu_check_train import adamw, batches, device_of, init_group, make_task, teardown

from zerotrain.pod_contract import SINGLE_RANK_COLLECTIVES_ENV as SINGLE_RANK_ENV
from zerotrain.runtime import ZeroConfig, ZeroEngine

Case = tuple[str, Callable[[], torch.Tensor], torch.Tensor]
"""A collective's name, a call that returns its result, and the exact result expected."""


def backend_activity(fn: Callable[[], Any], cuda: bool) -> dict[str, Any]:
    """Run `fn` under the profiler: c10d dispatcher ops, the backend's own events (nccl:* on CUDA tensors, gloo:*),
    NCCL's device work, and the c10d ops by name."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    counts: dict[str, Any] = {"c10d": 0, "backend": 0, "device_nccl": 0, "ops": {}}
    backend = "nccl:" if cuda else "gloo:"
    for ev in prof.events():
        name = ev.name
        on_device = "CUDA" in str(ev.device_type)
        if name.startswith("c10d::"):
            counts["c10d"] += 1
            counts["ops"][name] = counts["ops"].get(name, 0) + 1
        counts["backend"] += name.startswith(backend)
        counts["device_nccl"] += on_device and "nccl" in name.lower()
    return counts


def collective_cases(device: torch.device, rank: int, world: int) -> list[Case]:
    """all_gather_into_tensor, reduce_scatter_tensor SUM/AVG, all_reduce SUM/AVG with their exact results."""
    s = 8  # elements per rank's shard
    n = s * world

    def full(r: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32) + 1000 * r

    total = torch.stack([full(r) for r in range(world)]).sum(0)
    mine = slice(rank * s, (rank + 1) * s)
    cases: list[Case] = []

    def all_gather() -> torch.Tensor:
        out = torch.full((n,), math.nan, device=device)
        dist.all_gather_into_tensor(out, (torch.arange(s, dtype=torch.float32) + 1000 * rank).to(device))
        return out

    gathered = torch.cat([torch.arange(s, dtype=torch.float32) + 1000 * r for r in range(world)])
    cases.append(("all_gather_into_tensor", all_gather, gathered))
    for op, scale in (("SUM", 1.0), ("AVG", float(world))):

        def reduce_scatter(op: str = op) -> torch.Tensor:
            out = torch.full((s,), math.nan, device=device)
            dist.reduce_scatter_tensor(out, full(rank).to(device), op=getattr(dist.ReduceOp, op))
            return out

        def all_reduce(op: str = op) -> torch.Tensor:
            t = full(rank).to(device)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            return t

        cases.append((f"reduce_scatter_tensor {op}", reduce_scatter, total[mine] / scale))
        cases.append((f"all_reduce {op}", all_reduce, total / scale))
    return cases


def raw_collectives(checks: Checks, device: torch.device, rank: int, world: int, faults: set[str]) -> None:
    """all_gather_into_tensor, reduce_scatter_tensor SUM/AVG, all_reduce SUM/AVG: exact results, backend seen."""
    cuda = device.type == "cuda"
    backend = "nccl" if cuda else "gloo"
    for i, (name, fn, want) in enumerate(collective_cases(device, rank, world)):
        if i == 0 and "collective-result" in faults:
            want = want + 1  # injected: a wrong expectation must fail
        got: list[torch.Tensor] = []

        def run(fn: Callable[[], torch.Tensor] = fn, got: list[torch.Tensor] = got) -> None:
            got.append(fn())

        try:
            counts = backend_activity(run, cuda)
        except Exception as e:
            checks.add(f"{name} ({world} rank{'s' if world > 1 else ''})", False, f"raised {type(e).__name__}: {e}")
            continue
        exact = bool(torch.equal(got[0].cpu(), want))
        ran = counts["c10d"] > 0 and (counts["backend"] > 0 or counts["device_nccl"] > 0)
        detail = (
            f"{'exact' if exact else 'WRONG ' + str(got[0].cpu().tolist()[:4])} on {backend}; profiler: "
            f"{counts['c10d']} c10d, {counts['backend']} {backend}:*, {counts['device_nccl']} nccl device events"
        )
        if not ran:
            detail += f" (no sign the {backend} backend ran it)"
        checks.add(f"{name} ({world} rank{'s' if world > 1 else ''})", exact and ran, detail, **counts)


def engine_collectives(checks: Checks, device: torch.device, gpt: GptSize) -> None:
    """The stage-3 engine at world size 1 issues real gathers and reduce-scatters with the variable, none without."""
    for single in (True, False):
        if single:
            os.environ[SINGLE_RANK_ENV] = "1"
        else:
            os.environ.pop(SINGLE_RANK_ENV, None)
        task = make_task(device, gpt)
        data = batches(task, device, 2)
        engine = ZeroEngine(task.model, ZeroConfig(stage=3, unit_modules=task.unit_modules), optimizer=adamw)
        engine.backward(task.loss(engine(task.inputs(data[0])), data[0]))
        engine.step()  # the first step's set-up stays out of the profile

        def one_step(engine: Any = engine, task: Any = task, batch: Any = data[1]) -> None:
            engine.backward(task.loss(engine(task.inputs(batch)), batch))
            engine.step()

        counts = backend_activity(one_step, device.type == "cuda")
        local = bool(getattr(engine.comm, "local", not single))
        del engine, task
        gc.collect()
        if single:
            ops = counts["ops"]
            gathers = sum(n for op, n in ops.items() if "allgather" in op)
            scatters = sum(n for op, n in ops.items() if "reduce_scatter" in op)
            # Every data collective reached the device backend (NCCL's own events, or failing those its kernels).
            reached = counts["backend"] >= gathers + scatters or counts["device_nccl"] > 0
            ok = not local and gathers > 0 and scatters > 0 and reached
            checks.add(
                f"engine stage 3, world 1, {SINGLE_RANK_ENV}=1",
                ok,
                f"{gathers} all-gathers, {scatters} reduce-scatters in one step; {counts['backend']} "
                f"{'nccl' if device.type == 'cuda' else 'gloo'}:* events, {counts['device_nccl']} nccl device events",
                **counts,
            )
        else:
            ok = local and counts["c10d"] == 0
            checks.add(
                "engine stage 3, world 1, variable unset", ok, f"{counts['c10d']} collectives in one step (0 expected)"
            )
    os.environ[SINGLE_RANK_ENV] = "1"


def environment_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        nccl = torch.cuda.nccl.version()
        info.update(
            device=props.name,
            memory_bytes=props.total_memory,
            capability=f"{props.major}.{props.minor}",
            nccl=".".join(str(v) for v in nccl) if isinstance(nccl, tuple) else str(nccl),
        )
    return info


def phase_collectives(args: argparse.Namespace, checks: Checks) -> None:
    device = device_of(args)
    init_group(device)
    info = environment_info(device)
    checks.add("device", OK, ", ".join(f"{k} {v}" for k, v in info.items()), **info)
    raw_collectives(checks, device, 0, 1, set(args.inject))
    engine_collectives(checks, device, SIZES[args.size].gpt)
    teardown()
