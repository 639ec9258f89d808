"""The GPU paths in one call: NCCL collectives, stage 0-3 parity, the sanitizer, the allocator and bf16 throughput.

    bash bench/gpu_check.sh OUTDIR               # on the GPU machine: installs .gpu-bundle, then runs this
    python bench/gpu_check.py --device cpu       # the same checks on gloo with small sizes, to try the script
    python bench/gpu_check.py --device cpu --phases parity --out /tmp/gc

Each phase runs in its own process with its own timeout, all within one budget (`--budget-s`), and records one line
per check (printed, and in OUTDIR/gpu_check.json; every phase's full output is in OUTDIR/phases/). The exit status
is 1 when any check failed, 2 when the machine cannot run the checks at all. Phases:

- collectives: raw all_gather_into_tensor, reduce_scatter_tensor (SUM, AVG) and all_reduce (SUM, AVG) on the
  one-rank group (`cpu:gloo,cuda:nccl`, as zerotrain creates it), exact against the expected values, with the
  profiler showing the backend ran them; the stage-3 engine with ZEROTRAIN_SINGLE_RANK_COLLECTIVES=1 issuing real
  all-gathers and reduce-scatters at world size 1, and without it none.
- parity (single-rank collectives): fp32 stages 0-3 against torch.optim.AdamW (TF32 off, deterministic kernels,
  the math attention kernel), also with chunked buckets and with overlap_comm false; bf16 stages 1-3 (also chunked
  and overlap_comm false) against bf16 stage 0 on the same data, and bf16 stage 0 against fp32 AdamW loosely.
- two_ranks: two processes on the same device. NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), which
  is reported as "not possible" with NCCL's reason; where they run (gloo), raw collectives and parity at 2 ranks.
- sanitizer: a short bf16 stage-2 and stage-3 run (and fp32 chunked stage 3) under TORCH_CUDA_SANITIZER=1, failing
  on "CSAN detected a possible data race"; a planted race must be reported, or the sanitizer proves nothing.
- allocator: bf16 stages 0-3 on a mid-size model: torch.cuda.memory_stats (allocated, reserved, retries,
  fragmentation at peak) beside memory_report()'s measured and predicted (ZeRO formula) model states.
- throughput: bench/gpu_throughput.py, bf16 tokens/s of zerotrain stage 3 against FSDP2 in both modes (a 1.01 B
  parameter GPT on CUDA), losses checked against FSDP2's.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_throughput, gpu_bundle, compare*: the siblings

import torch
import torch.distributed as dist
from gpu_bundle import release

from zerotrain.planner import format_bytes
from zerotrain.runtime import ZeroConfig, ZeroEngine
from zerotrain.runtime.collectives import SINGLE_RANK_ENV, process_group_backend
from zerotrain.runtime.examples.gpt import build
from zerotrain.runtime.launch import free_port
from zerotrain.runtime.train import to_device

BENCH = Path(__file__).resolve().parent
OK, FAILED, NOT_POSSIBLE, SKIPPED = "ok", "FAILED", "not possible", "skipped"
PHASES = ("collectives", "parity", "two_ranks", "sanitizer", "allocator", "throughput")
# Seconds each phase may take on one H200 (the whole stays under 8 minutes: see --budget-s); CPU runs get 4x.
TIMEOUTS = {"collectives": 60, "parity": 120, "two_ranks": 75, "sanitizer": 150, "allocator": 90, "throughput": 240}
CPU_SLOWDOWN = 4
FAULTS = ("parity-reference", "collective-result", "throughput-loss")
MIN_TORCH = (2, 11)
LR, WEIGHT_DECAY = 1e-3, 0.1

FP32_ATOL = 1e-5
"""fp32 against torch.optim.AdamW: largest |w - w_adamw| after the steps (also the losses), and the relative
difference of the gradient norm. TF32 is off and kernels deterministic, so only summation order differs."""
BF16_UPDATE_RTOL = 5e-2
"""bf16 stage k against bf16 stage 0 on the same data: per tensor, ‖Δw_k − Δw_0‖ / ‖Δw_0‖ with Δw = w_after − w_init
(fp32 masters). A different rounding or summation order moves a bf16 value by about one unit in the last place
(2^-8 ≈ 0.4%), the gradients by a few of them; AdamW's update m/√v is scale-free and inherits about that relative
error, a few per cent over the steps at most, where near-zero gradients can even flip sign. A sharding mistake (a
unit's gradient missing, a chunk in the wrong place, a stale parameter after the step) changes Δw of what it touches
by its own size (relative error ~1). At world size 1 the stages compute the same values, so 0 is typical."""
BF16_LOSS_ATOL = 2e-2
"""bf16 stage k against bf16 stage 0: |loss difference| at any step (a loss of ~5.5 resolved to bf16's 0.4%)."""
BF16_VS_FP32_LOSS_ATOL = 5e-2
"""bf16 stage 0 against fp32 AdamW, loosely: the mixed-precision path trains the same model (2e-3 seen on CPU)."""
CSAN_MARK = "CSAN detected a possible data race"


@dataclass
class Size:
    """Model sizes and step counts of one mode (cuda, cpu, quick)."""

    gpt: dict[str, int]
    steps: int
    alloc: dict[str, int]
    alloc_steps: int
    sanitizer_steps: int
    throughput: str
    """bench/gpu_throughput.py's model and step arguments."""
    min_params: int = 0


SIZES = {
    "cuda": Size(
        gpt={"seq_len": 128, "batch_size": 8, "d_model": 256, "n_layers": 4, "n_heads": 8, "max_bytes": 400_000},
        steps=5,
        alloc={"seq_len": 512, "batch_size": 8, "d_model": 1024, "n_layers": 8, "n_heads": 16, "max_bytes": 2_000_000},
        alloc_steps=6,
        sanitizer_steps=3,
        # 20·(12·2048² + 13·2048) + (256 + 1024 + 2)·2048 = 1,009,790,976 parameters; see docs/performance.md.
        throughput="--d-model 2048 --layers 20 --heads 16 --seq-len 1024 --batch 16 --steps 8 --warmup 3",
        min_params=1_000_000_000,
    ),
    "cpu": Size(
        gpt={"seq_len": 64, "batch_size": 8, "d_model": 128, "n_layers": 4, "n_heads": 4, "max_bytes": 200_000},
        steps=5,
        alloc={"seq_len": 64, "batch_size": 8, "d_model": 128, "n_layers": 4, "n_heads": 4, "max_bytes": 200_000},
        alloc_steps=3,
        sanitizer_steps=2,
        throughput="--d-model 128 --layers 2 --heads 4 --seq-len 64 --batch 8 --steps 4 --warmup 1 --max-bytes 200000",
    ),
    "quick": Size(
        gpt={"seq_len": 32, "batch_size": 4, "d_model": 64, "n_layers": 2, "n_heads": 4, "max_bytes": 40_000},
        steps=3,
        alloc={"seq_len": 32, "batch_size": 4, "d_model": 64, "n_layers": 2, "n_heads": 4, "max_bytes": 40_000},
        alloc_steps=2,
        sanitizer_steps=1,
        throughput="--d-model 32 --layers 1 --heads 4 --seq-len 16 --batch 4 --steps 3 --warmup 1 --max-bytes 20000 "
        "--systems zero3,fsdp2",
    ),
}


# --- checks -----------------------------------------------------------------------------------------------------


def line(rec: dict[str, Any]) -> str:
    """One check as one printed line."""
    return f"{rec['status']:>12}  {rec['phase']}: {rec['name']}: {rec['detail']}"


class Checks:
    """A phase's check records: printed, and appended to a JSON-lines file as they happen (a crash keeps them)."""

    def __init__(self, phase: str, path: Path | None) -> None:
        self.phase, self.path = phase, path
        self.records: list[dict[str, Any]] = []
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")

    def add(self, name: str, ok: bool | str, detail: str, **figures: Any) -> bool:
        status = ok if isinstance(ok, str) else (OK if ok else FAILED)
        rec = {"phase": self.phase, "name": name, "status": status, "detail": detail, "figures": figures}
        self.records.append(rec)
        print(line(rec), flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(rec, default=str) + "\n")
        return status != FAILED

    def extend(self, records: list[dict[str, Any]], prefix: str = "") -> None:
        for r in records:
            self.add(prefix + r["name"], r["status"], r["detail"], **r.get("figures", {}))


def read_records(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSON-lines file written by `Checks`."""
    if not path.is_file():
        return []
    text = path.read_text()
    return [json.loads(ln) for ln in text[: text.rfind("\n") + 1].splitlines() if ln.strip()]


# --- process group, tasks and training ----------------------------------------------------------------------------


def device_of(args: argparse.Namespace) -> torch.device:
    if args.device == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def init_group(device: torch.device, rank: int = 0, world: int = 1, port: int | None = None) -> None:
    """The group zerotrain creates (`cpu:gloo,cuda:nccl` on CUDA), NCCL's communicator made eagerly."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port if port is not None else free_port())
    dist.init_process_group(
        process_group_backend(device.type == "cuda"),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
        device_id=device if device.type == "cuda" else None,
    )


def teardown() -> None:
    gc.collect()  # engines hold hooks in cycles: free their collective state while the group is alive
    if dist.is_initialized():
        dist.destroy_process_group()


def exact_fp32(device: torch.device) -> None:
    """fp32 that only summation order can change: no TF32, deterministic kernels."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)


@contextmanager
def math_attention() -> Iterator[None]:
    """The math SDPA kernel (the fused ones' backward may be nondeterministic on CUDA)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        yield


def make_task(device: torch.device, gpt: dict[str, int], rank: int = 0, world: int = 1) -> Any:
    torch.manual_seed(0)
    task = build(rank=rank, world_size=world, **gpt)
    task.model.to(device)
    return task


def batches(task: Any, device: torch.device, n: int) -> list[Any]:
    return [to_device(next(task.batches), device) for _ in range(n)]


def adamw(groups: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY)


@dataclass
class Trained:
    """What a run leaves: losses, gradient norms, fp32 weights (on the CPU), and whether collectives ran."""

    losses: list[float]
    grad_norms: list[float]
    weights: dict[str, torch.Tensor]
    local: bool = False
    comm: dict[str, Any] = field(default_factory=dict)


def train_reference(task: Any, data: list[Any]) -> Trained:
    """torch.optim.AdamW on the plain model, one process."""
    params = list(task.model.parameters())
    opt = adamw(params)
    losses, norms = [], []
    for batch in data:
        opt.zero_grad()
        loss = task.loss(task.model(task.inputs(batch)), batch)
        loss.backward()
        norms.append(math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params if p.grad is not None)))
        opt.step()
        losses.append(float(loss.detach()))
    weights = {k: v.detach().float().cpu().clone() for k, v in task.model.named_parameters()}
    return Trained(losses, norms, weights)


def train_engine(task: Any, data: list[Any], stage: int, precision: str = "fp32", **cfg: Any) -> Trained:
    """The engine over `data`, one optimizer step per batch."""
    config = ZeroConfig(stage=stage, unit_modules=task.unit_modules, precision=precision, **cfg)
    engine = ZeroEngine(task.model, config, optimizer=adamw)
    losses, norms = [], []
    for batch in data:
        engine.backward(task.loss(engine(task.inputs(batch)), batch))
        result = engine.step(report_grad_norm=True)
        losses.append(float(result.loss))
        norms.append(float(result.grad_norm if result.grad_norm is not None else math.nan))
    weights = {k: v.detach().float().cpu().clone() for k, v in engine.full_state_dict().items()}
    local = bool(getattr(engine.comm, "local", False))  # True: a world of one that launched no collective
    done = Trained(losses, norms, weights, local=local, comm=engine.comm_report())
    del engine
    gc.collect()
    return done


def chunk_elements(task: Any) -> int:
    """A bucket size that splits every unit into at least three chunks."""
    units = [m for m in task.model.modules() if type(m).__name__ in task.unit_modules]
    return max(1, min(sum(p.numel() for p in u.parameters()) for u in units) // 3)


def initial_weights(task: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in task.model.named_parameters()}


def max_abs(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(float((got[k] - v).abs().max()) for k, v in want.items())


def worst_update(got: Trained, base: Trained, init: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest per-tensor ‖Δw − Δw_base‖ / ‖Δw_base‖, and the tensor."""
    worst, name = 0.0, ""
    for k, w0 in init.items():
        d_base = base.weights[k] - w0
        rel = float((got.weights[k] - w0 - d_base).norm() / d_base.norm().clamp_min(1e-30))
        if not rel <= worst:  # NaN counts as worst
            worst, name = rel, k
    return worst, name


def diffs(got: list[float], want: list[float], relative: bool = False) -> float:
    out = 0.0
    for a, b in zip(got, want, strict=True):
        d = abs(a - b) / (abs(b) if relative and b else 1.0)
        out = d if not d <= out else out
    return out


def fp32_check(checks: Checks, name: str, run: Trained, ref: Trained, single_rank: bool) -> bool:
    dw, dl, dn = (
        max_abs(run.weights, ref.weights),
        diffs(run.losses, ref.losses),
        diffs(run.grad_norms, ref.grad_norms, True),
    )
    ok = dw <= FP32_ATOL and dl <= FP32_ATOL and dn <= FP32_ATOL
    detail = f"max|w - w_adamw| {dw:.2e}, loss {dl:.1e}, grad norm rel {dn:.1e} (<= {FP32_ATOL:.0e})"
    if single_rank and run.local:
        ok, detail = False, f"{SINGLE_RANK_ENV}=1 but the engine ran no collectives; " + detail
    return checks.add(name, ok, detail, max_weight_diff=dw, max_loss_diff=dl, max_grad_norm_rel=dn, tol=FP32_ATOL)


def bf16_check(checks: Checks, name: str, run: Trained, base: Trained, init: dict[str, torch.Tensor]) -> bool:
    du, where = worst_update(run, base, init)
    dl, dn = diffs(run.losses, base.losses), diffs(run.grad_norms, base.grad_norms, True)
    ok = du <= BF16_UPDATE_RTOL and dl <= BF16_LOSS_ATOL and dn <= BF16_UPDATE_RTOL
    detail = (
        f"update rel {du:.1e} ({where or '-'}; <= {BF16_UPDATE_RTOL:.0e}), loss {dl:.1e} (<= {BF16_LOSS_ATOL:.0e}), "
        f"grad norm rel {dn:.1e}"
    )
    return checks.add(name, ok, detail, max_update_rel=du, tensor=where, max_loss_diff=dl, max_grad_norm_rel=dn)


# --- collectives ------------------------------------------------------------------------------------------------


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


def raw_collectives(checks: Checks, device: torch.device, rank: int, world: int, faults: set[str]) -> None:
    """all_gather_into_tensor, reduce_scatter_tensor SUM/AVG, all_reduce SUM/AVG: exact results, backend seen."""
    cuda = device.type == "cuda"
    backend = "nccl" if cuda else "gloo"
    s = 8  # elements per rank's shard
    n = s * world

    def full(r: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32) + 1000 * r

    total = torch.stack([full(r) for r in range(world)]).sum(0)
    mine = slice(rank * s, (rank + 1) * s)
    cases: list[tuple[str, Callable[[], torch.Tensor], torch.Tensor]] = []

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
    for i, (name, fn, want) in enumerate(cases):
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


def engine_collectives(checks: Checks, device: torch.device, gpt: dict[str, int]) -> None:
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


# --- parity -----------------------------------------------------------------------------------------------------


def parity_cases(chunk: int, world: int) -> list[tuple[str, int, dict[str, Any]]]:
    """(label, stage, engine settings) of the fp32 runs compared with AdamW; at 2 ranks, the paths that differ most."""
    chunked = {"reduce_bucket_elements": chunk, "allgather_bucket_elements": chunk}
    cases: list[tuple[str, int, dict[str, Any]]] = [(f"stage {s}", s, {}) for s in range(4)]
    cases += [(f"stage {s} chunked", s, chunked) for s in (range(4) if world == 1 else (2, 3))]
    cases += [(f"stage {s} overlapComm false", s, {"overlap_comm": False}) for s in (range(4) if world == 1 else (3,))]
    return cases


def bf16_cases(chunk: int, world: int) -> list[tuple[str, int, dict[str, Any]]]:
    """The bf16 runs compared with bf16 stage 0: stages 1-3, and chunked and overlapComm false from stage 2."""
    if world > 1:
        return [c for c in parity_cases(chunk, world) if c[1] == 3]
    return [c for c in parity_cases(chunk, world) if c[1] > 0 and (c[1] >= 2 or not c[2])]


def parity_runs(
    checks: Checks, device: torch.device, gpt: dict[str, int], steps: int, faults: set[str], rank: int, world: int
) -> None:
    """fp32 against AdamW on the global batch, bf16 against bf16 stage 0 on the same data."""
    ref_task = make_task(device, gpt)  # the whole global batch, one process
    init = initial_weights(ref_task)
    chunk = chunk_elements(ref_task)
    ref = train_reference(ref_task, batches(ref_task, device, steps))
    del ref_task
    if "parity-reference" in faults:
        first = next(iter(ref.weights))
        ref.weights[first] = ref.weights[first] + 1e-3  # injected: a wrong reference must fail
    data = batches(make_task(device, gpt, rank, world), device, steps)
    where = f"{world} ranks" if world > 1 else "world 1"
    single = world == 1
    for label, stage, cfg in parity_cases(chunk, world):
        run = train_engine(make_task(device, gpt, rank, world), data, stage, **cfg)
        fp32_check(checks, f"fp32 {label} vs AdamW ({where})", run, ref, single)
    base = train_engine(make_task(device, gpt, rank, world), data, 0, "bf16", reduce_dtype="fp32")
    dl = diffs(base.losses, ref.losses)
    checks.add(
        f"bf16 stage 0 vs fp32 AdamW ({where})",
        dl <= BF16_VS_FP32_LOSS_ATOL,
        f"loss {dl:.1e} (<= {BF16_VS_FP32_LOSS_ATOL:.0e}): the mixed-precision path trains the same model",
        max_loss_diff=dl,
    )
    if "parity-reference" in faults:
        first = next(iter(init))
        base.weights[first] = init[first] + 1.1 * (base.weights[first] - init[first])  # injected
    for label, stage, cfg in bf16_cases(chunk, world):
        run = train_engine(make_task(device, gpt, rank, world), data, stage, "bf16", reduce_dtype="fp32", **cfg)
        bf16_check(checks, f"bf16 {label} vs bf16 stage 0 ({where})", run, base, init)


def phase_parity(args: argparse.Namespace, checks: Checks) -> None:
    device = device_of(args)
    exact_fp32(device)
    os.environ[SINGLE_RANK_ENV] = "1"
    init_group(device)
    with math_attention():
        parity_runs(checks, device, SIZES[args.size].gpt, SIZES[args.size].steps, set(args.inject), 0, 1)
    teardown()


# --- two ranks on one device ------------------------------------------------------------------------------------


def phase_two_ranks_rank(args: argparse.Namespace, checks: Checks) -> None:
    """One of two ranks on the same device: a probe, then raw collectives and parity at 2 ranks."""
    device = device_of(args)
    exact_fp32(device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # two ranks share the cores
    try:
        init_group(device, args.rank, 2, args.port)
        t = torch.ones(4, device=device)
        dist.all_reduce(t)
        probe = t.cpu().tolist()
    except Exception as e:
        # NCCL refuses two ranks on one GPU; gloo on the CPU never should.
        checks.add("probe", NOT_POSSIBLE if device.type == "cuda" else FAILED, first_line(e))
        os._exit(0)  # no teardown: a communicator that failed to form can hang it
    if probe != [2.0] * 4:
        checks.add("probe", False, f"all_reduce of ones over 2 ranks gave {probe}")
        return
    checks.add("probe", OK, f"2 ranks on {device}: all_reduce of ones gave 2")
    raw_collectives(checks, device, args.rank, 2, set(args.inject))
    size = SIZES[args.size]
    with math_attention():
        parity_runs(checks, device, size.gpt, size.steps, set(args.inject), args.rank, 2)
    teardown()


def first_line(e: BaseException) -> str:
    """An exception's type, its first line and NCCL's "Last error" line when it has one."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    last = [lines[i + 1] for i, ln in enumerate(lines[:-1]) if ln.startswith("Last error")]
    return f"{type(e).__name__}: {text}{' -- ' + last[0] if last else ''}"[:400]


def run_child(
    args: argparse.Namespace, phase: str, log: Path, timeout: float, env: dict[str, str] | None = None, **extra: Any
) -> tuple[int | None, str]:
    """This script as another phase process; (exit status, None when it timed out; its output)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", phase, *child_args(args)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
    return rc, log.read_text(errors="replace")


def child_args(args: argparse.Namespace) -> list[str]:
    out = ["--device", args.device, "--out", str(args.out), "--size", args.size]
    for fault in args.inject:
        out += ["--inject", fault]
    return out


def phase_two_ranks(args: argparse.Namespace, checks: Checks) -> None:
    port = free_port()
    phases = args.out / "phases"
    timeout = max(10.0, args.timeout - 5)
    cmds = []
    for r in range(2):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", "two_ranks_rank", *child_args(args)]
        cmds.append([*cmd, "--rank", str(r), "--port", str(port)])
    logs = [(phases / f"two_ranks.rank{r}.log").open("w") for r in range(2)]
    env = {**os.environ, "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")}  # NCCL's reason, in the ranks' logs
    procs = [subprocess.Popen(c, stdout=f, stderr=subprocess.STDOUT, env=env) for c, f in zip(cmds, logs, strict=True)]
    deadline = time.monotonic() + timeout
    rcs: list[int | None] = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rcs.append(None)
    for f in logs:
        f.close()
    recs = [read_records(phases / f"two_ranks_rank.rank{r}.jsonl") for r in range(2)]
    probes: list[dict[str, Any] | None] = [next((x for x in rec if x["name"] == "probe"), None) for rec in recs]
    name = f"2 ranks on one {'GPU' if args.device == 'cuda' else 'CPU'}"
    if any(p is None or p["status"] != OK for p in probes):
        reasons = []
        for r, (probe, rc) in enumerate(zip(probes, rcs, strict=True)):
            if probe is None:
                reasons.append(f"rank {r}: " + ("hung" if rc is None else f"exited with status {rc}") + " in its probe")
            elif probe["status"] != OK:
                reasons.append(f"rank {r}: {probe['detail']}")
        failed = any(probe is not None and probe["status"] == FAILED for probe in probes)
        checks.add(name, FAILED if failed else NOT_POSSIBLE, "; ".join(reasons))
        return
    checks.add(name, OK, f"both ranks on {'cuda:0' if args.device == 'cuda' else 'cpu'}")
    checks.extend([x for x in recs[0] if x["name"] != "probe"])
    checks.extend([x for x in recs[1] if x["name"] != "probe" and x["status"] == FAILED], prefix="rank 1: ")
    for r, rc in enumerate(rcs):
        if rc != 0:
            checks.add(f"rank {r}", False, "timed out" if rc is None else f"exited with status {rc}")


# --- the sanitizer ------------------------------------------------------------------------------------------------


def csan_summary(output: str) -> str:
    """The kernels of the first race CSAN reported."""
    lines = output.splitlines()
    start = next(i for i, ln in enumerate(lines) if CSAN_MARK in ln)
    kernels = [
        lines[i + 1].strip() for i in range(start, min(len(lines) - 1, start + 200)) if "during kernel" in lines[i]
    ]
    return f"{lines[start].strip()}: {' vs '.join(kernels[:2]) or 'see the log'}"


def sanitizer_verdict(rc: int | None, output: str) -> tuple[bool, str]:
    """A sanitized run passes when it exited 0 and CSAN reported no race."""
    if CSAN_MARK in output:
        return False, f"{output.count(CSAN_MARK)} race report(s); first: {csan_summary(output)}"
    if rc is None:
        return False, "timed out"
    if rc != 0:
        return False, f"exited with status {rc}: {last_error(output)}"
    return True, "no race reported"


def last_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^(\[rank\d+\]: )?\w*(Error|Exception)\b", ln)]
    return (errors or lines or ["no output"])[-1][:300]


def phase_sanitized_training(args: argparse.Namespace, checks: Checks) -> None:
    """Short stage-2/3 runs; on CUDA, TORCH_CUDA_SANITIZER=1 is set by the parent (CSAN must start with torch)."""
    device = device_of(args)
    if device.type == "cuda":
        from torch.cuda import _sanitizer

        active = bool(getattr(_sanitizer.cuda_sanitizer, "enabled", True))
        checks.add("CSAN active", active, "TORCH_CUDA_SANITIZER=1: every kernel's stream accesses are tracked")
    os.environ[SINGLE_RANK_ENV] = "1"
    init_group(device)
    size = SIZES[args.size]
    gpt = {**size.gpt, "n_layers": 2}  # CSAN's cost is per kernel: two blocks exercise every path
    task = make_task(device, gpt)
    chunk = chunk_elements(task)
    data = batches(task, device, size.sanitizer_steps)
    runs = [
        ("bf16 stage 2", 2, "bf16", {}),
        ("bf16 stage 3", 3, "bf16", {}),
        ("fp32 stage 3 chunked", 3, "fp32", {"reduce_bucket_elements": chunk, "allgather_bucket_elements": chunk}),
    ]
    for label, stage, precision, cfg in runs:
        try:
            run = train_engine(make_task(device, gpt), data, stage, precision, **cfg)
        except Exception as e:  # CSAN raises CUDASanitizerErrors from the racing kernel's dispatch
            checks.add(f"{label} ran", False, first_line(e))
            continue
        finite = all(math.isfinite(x) for x in run.losses)
        checks.add(f"{label} ran", finite, f"{len(run.losses)} steps, loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f}")
    teardown()


def phase_csan_control() -> None:
    """A planted race: written on the default stream, read on another without waiting. CSAN must report it."""
    a = torch.empty(1 << 20, device="cuda")
    a.fill_(1.0)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a.mul(2.0)
    torch.cuda.synchronize()


def phase_sanitizer(args: argparse.Namespace, checks: Checks) -> None:
    phases = args.out / "phases"
    cuda = args.device == "cuda"
    env = {"TORCH_CUDA_SANITIZER": "1"} if cuda else {}
    budget = max(10.0, args.timeout - 5)
    t0 = time.monotonic()
    rc, output = run_child(args, "sanitized_training", phases / "sanitizer.training.log", budget * 0.8, env)
    checks.extend(read_records(phases / "sanitized_training.jsonl"))
    if not cuda:
        ok = rc == 0
        why = "CSAN watches CUDA streams only: the runs above ran unsanitized" if ok else f"exited with status {rc}"
        checks.add("sanitized run", SKIPPED if ok else FAILED, why)
        checks.add("CSAN catches a planted race", SKIPPED, "CPU")
        return
    ok, detail = sanitizer_verdict(rc, output)
    checks.add("bf16 stage 2/3 and chunked stage 3 under TORCH_CUDA_SANITIZER=1", ok, detail, exit_status=rc)
    left = budget - (time.monotonic() - t0)
    rc, output = run_child(args, "csan_control", phases / "sanitizer.control.log", max(5.0, left), env)
    caught = CSAN_MARK in output
    checks.add(
        "CSAN catches a planted race",
        caught,
        "reported (so a clean run above means no race CSAN can see)"
        if caught
        else f"not reported (exit {rc}): the sanitized run proves nothing",
    )


# --- the allocator ------------------------------------------------------------------------------------------------


def gb(n: float | None) -> str:
    return "-" if n is None else format_bytes(n)


def phase_allocator(args: argparse.Namespace, checks: Checks) -> None:
    device = device_of(args)
    cuda = device.type == "cuda"
    os.environ[SINGLE_RANK_ENV] = "1"
    init_group(device)
    size = SIZES[args.size]
    for stage in range(4):
        gc.collect()
        retries0 = 0
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            retries0 = int(torch.cuda.memory_stats().get("num_alloc_retries", 0))
        task = make_task(device, size.alloc)
        data = batches(task, device, size.alloc_steps)
        cfg = ZeroConfig(stage=stage, unit_modules=task.unit_modules, precision="bf16", reduce_dtype="fp32")
        engine = ZeroEngine(task.model, cfg, optimizer=adamw)
        for batch in data:
            engine.backward(task.loss(engine(task.inputs(batch)), batch))
            engine.step()
        engine.synchronize()
        rep = engine.memory_report()
        name = f"bf16 stage {stage}"
        predicted, measured = rep.predicted_model_state_bytes, rep.model_state_bytes
        # Padding (none at world 1) is real memory; 1% covers AdamW's per-tensor step counters.
        slack = 0.01 * predicted + rep.padding_elements * (rep.bytes_per_weight + rep.bytes_per_gradient)
        plan_ok = abs(measured - predicted) <= slack
        extra = {
            "gradient_arena_bytes": rep.gradient_arena_bytes,
            "gathered_peak_bytes": rep.gathered_peak_bytes,
            "activation_peak_bytes": rep.activation_peak_bytes,
            "comm_buffer_peak_bytes": rep.comm_buffer_peak_bytes,
            "unsharded_gradient_peak_bytes": rep.unsharded_gradient_peak_bytes,
        }
        plan = (
            f"plan: model states {gb(predicted)} predicted, {gb(measured)} measured; arenas "
            f"{gb(rep.gradient_arena_bytes)}, gathered peak {gb(rep.gathered_peak_bytes)}, activations peak "
            f"{gb(rep.activation_peak_bytes)}, comm buffers peak {gb(rep.comm_buffer_peak_bytes)}"
        )
        figures: dict[str, Any] = {"predicted_model_state_bytes": predicted, "model_state_bytes": measured, **extra}
        if not cuda:
            none = all(v is None for v in (rep.cuda_allocated_bytes, rep.cuda_reserved_bytes, rep.cuda_alloc_retries))
            checks.add(name, plan_ok and none, f"allocator: none on CPU (as expected); {plan}", **figures)
        else:
            stats = torch.cuda.memory_stats(device)
            alloc, reserved = int(stats["allocated_bytes.all.current"]), int(stats["reserved_bytes.all.current"])
            peak, peak_reserved = int(stats["allocated_bytes.all.peak"]), int(stats["reserved_bytes.all.peak"])
            retries = int(stats.get("num_alloc_retries", 0)) - retries0
            frag = 1.0 - peak / peak_reserved if peak_reserved else 0.0
            figures.update(
                allocated_bytes=alloc,
                reserved_bytes=reserved,
                peak_allocated_bytes=peak,
                peak_reserved_bytes=peak_reserved,
                alloc_retries=retries,
                fragmentation_at_peak=frag,
                report_cuda_allocated_bytes=rep.cuda_allocated_bytes,
                report_cuda_reserved_bytes=rep.cuda_reserved_bytes,
            )
            agrees = rep.cuda_allocated_bytes == alloc and rep.cuda_reserved_bytes == reserved
            problems = [] if plan_ok else [f"measured model states off the plan by more than {gb(slack)}"]
            problems += [] if retries == 0 else [f"{retries} allocation retries"]
            problems += [] if peak >= predicted else ["peak allocated below the predicted model states"]
            problems += [] if agrees else ["memory_report()'s cuda_* figures differ from torch.cuda.memory_stats"]
            detail = (
                f"allocated {gb(alloc)}, reserved {gb(reserved)}, peak {gb(peak)} / {gb(peak_reserved)} reserved, "
                f"retries {retries}, fragmentation at peak {frag:.1%}; {plan}"
            )
            checks.add(name, not problems, detail + ("" if not problems else " -- " + "; ".join(problems)), **figures)
        del engine, task, data
    teardown()


# --- throughput ----------------------------------------------------------------------------------------------------


def phase_throughput(args: argparse.Namespace, checks: Checks) -> None:
    import gpu_throughput

    size = SIZES[args.size]
    out = args.out / "throughput.json"
    argv = ["--device", args.device, "--out", str(out), "--min-params", str(size.min_params), *size.throughput.split()]
    if "throughput-loss" in args.inject:
        argv.append("--inject-loss-offset")
    gpu_throughput.main(argv)
    doc = json.loads(out.read_text())
    for name, ok, detail, figures in gpu_throughput.checks(doc):
        checks.add(name, ok, detail, **figures)


# --- the driver ---------------------------------------------------------------------------------------------------


def environment(args: argparse.Namespace, checks: Checks) -> dict[str, Any]:
    """The machine's torch (it must be its own, CUDA, 2.11 or newer) and where zerotrain was imported from."""
    import zerotrain

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "torch": torch.__version__,
        "torch_file": torch.__file__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "zerotrain_file": zerotrain.__file__,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
    }
    try:
        import pydantic

        info.update(pydantic=pydantic.VERSION, pydantic_file=pydantic.__file__)
    except ImportError:
        info["pydantic"] = None
    new_enough = release(torch.__version__) >= MIN_TORCH
    cuda_ok = args.device != "cuda" or (torch.version.cuda is not None and torch.cuda.is_available())
    checks.add(
        "torch",
        new_enough and cuda_ok,
        f"{torch.__version__} (CUDA {torch.version.cuda}, available {torch.cuda.is_available()}) from {torch.__file__}"
        + ("" if new_enough else f"; {'.'.join(map(str, MIN_TORCH))} or newer needed"),
    )
    if args.expect_site is not None:
        site = args.expect_site.resolve()
        zt = Path(zerotrain.__file__).resolve().is_relative_to(site)
        tr = not Path(torch.__file__).resolve().is_relative_to(site)
        checks.add("zerotrain from the bundle", zt, f"{zerotrain.__file__} ({'under' if zt else 'NOT under'} {site})")
        checks.add("torch is the machine's own", tr, f"{torch.__file__} ({'outside' if tr else 'INSIDE'} {site})")
    return info


def run_phase(args: argparse.Namespace, phase: str, timeout: float, sink: Checks) -> dict[str, Any]:
    """One phase in its own process group, its records printed as they come; a FAILED record if it broke."""
    phases = args.out / "phases"
    log, records = phases / f"{phase}.log", phases / f"{phase}.jsonl"
    records.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--phase",
        phase,
        *child_args(args),
        "--timeout",
        str(timeout),
    ]
    t0 = time.monotonic()
    shown = 0
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        while proc.poll() is None:
            if time.monotonic() - t0 > timeout:
                os.killpg(proc.pid, signal.SIGKILL)  # the phase and every rank it started
                proc.wait()
                timed_out = True
                break
            new = read_records(records)
            sink.extend(new[shown:])
            shown = len(new)
            time.sleep(0.25)
    new = read_records(records)
    sink.extend(new[shown:])
    seconds = time.monotonic() - t0
    rc = proc.returncode
    broke = None
    if timed_out:
        broke = f"timed out after {timeout:.0f} s"
    elif rc != 0:
        broke = f"exited with status {rc}: {last_error(log.read_text(errors='replace'))}"
    elif not new:
        broke = "recorded no checks"
    if broke:
        sink.add("phase", False, f"{broke} (log: {log})")
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print("\n".join("      | " + ln for ln in tail), flush=True)
    return {"seconds": round(seconds, 1), "timeout": round(timeout, 1), "exit_status": rc, "timed_out": timed_out}


def drive(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "phases").mkdir(exist_ok=True)
    records: list[dict[str, Any]] = []
    env_checks = Checks("environment", None)
    env = environment(args, env_checks)
    records += env_checks.records
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device; run on a GPU machine or pass --device cpu", file=sys.stderr)
        write_results(args, records, {}, env, t0)
        return 2
    scale = 1 if args.device == "cuda" else CPU_SLOWDOWN
    phases: dict[str, Any] = {}
    for phase in args.phases:
        left = args.budget_s - (time.monotonic() - t0)
        sink = Checks(phase, None)
        if left < 5:
            sink.add("phase", False, f"not run: the {args.budget_s:.0f} s budget is spent")
        else:
            print(f"--- {phase} (at most {min(TIMEOUTS[phase] * scale, left):.0f} s)", flush=True)
            phases[phase] = run_phase(args, phase, min(TIMEOUTS[phase] * scale, left), sink)
        records += sink.records
    return write_results(args, records, phases, env, t0)


def write_results(
    args: argparse.Namespace, records: list[dict[str, Any]], phases: dict[str, Any], env: dict[str, Any], t0: float
) -> int:
    counts = {s: sum(r["status"] == s for r in records) for s in (OK, FAILED, NOT_POSSIBLE, SKIPPED)}
    ok = counts[FAILED] == 0 and bool(records)
    throughput = args.out / "throughput.json"
    doc = {
        "ok": ok,
        "device": args.device,
        "size": args.size,
        "seconds": round(time.monotonic() - t0, 1),
        "budget_s": args.budget_s,
        "counts": counts,
        "environment": env,
        "phases": phases,
        "checks": records,
        "throughput": json.loads(throughput.read_text()).get("results") if throughput.is_file() else None,
        "tolerances": {
            "fp32_atol": FP32_ATOL,
            "bf16_update_rtol": BF16_UPDATE_RTOL,
            "bf16_loss_atol": BF16_LOSS_ATOL,
            "bf16_vs_fp32_loss_atol": BF16_VS_FP32_LOSS_ATOL,
        },
        "sizes": asdict(SIZES[args.size]),
    }
    (args.out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    print(
        f"gpu_check: {'PASSED' if ok else 'FAILED'}: {summary} in {doc['seconds']:.0f} s; {args.out / 'gpu_check.json'}"
    )
    return 0 if ok else 1


PHASE_FUNCS: dict[str, Callable[[argparse.Namespace, Checks], None]] = {
    "collectives": phase_collectives,
    "parity": phase_parity,
    "two_ranks": phase_two_ranks,
    "two_ranks_rank": phase_two_ranks_rank,
    "sanitizer": phase_sanitizer,
    "sanitized_training": phase_sanitized_training,
    "allocator": phase_allocator,
    "throughput": phase_throughput,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--device", choices=["cuda", "cpu"], default="cuda")
    add("--out", type=Path, default=BENCH / "results" / "gpu_check", help="folder for gpu_check.json and the logs")
    add("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    add("--quick", action="store_true", help="the smallest sizes (the tests' CPU run)")
    add("--budget-s", type=float, default=None, help="seconds for all phases (default 450 on cuda, 3600 on cpu)")
    add("--expect-site", type=Path, default=None, help="fail unless zerotrain was imported from this folder")
    add("--inject", action="append", default=[], choices=FAULTS, help="a fault that must make a check fail")
    # Internal: one phase in this process (the driver starts these).
    add("--phase", default=None, help=argparse.SUPPRESS)
    add("--size", default=None, help=argparse.SUPPRESS)
    add("--timeout", type=float, default=0.0, help=argparse.SUPPRESS)
    add("--rank", type=int, default=0, help=argparse.SUPPRESS)
    add("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.phases = [p for p in args.phases.split(",") if p]
    unknown = set(args.phases) - set(PHASES)
    if unknown:
        parser.error(f"--phases: unknown {', '.join(sorted(unknown))}; choose from {','.join(PHASES)}")
    if args.size is None:
        args.size = "quick" if args.quick else args.device
    if args.budget_s is None:
        args.budget_s = 450.0 if args.device == "cuda" else 3600.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # torch's renamed collectives, per process
    if args.phase is None:
        return drive(args)
    if args.phase == "csan_control":
        phase_csan_control()
        return 0
    name = f"{args.phase}.rank{args.rank}" if args.phase == "two_ranks_rank" else args.phase
    checks = Checks(args.phase, args.out / "phases" / f"{name}.jsonl")
    PHASE_FUNCS[args.phase](args, checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
