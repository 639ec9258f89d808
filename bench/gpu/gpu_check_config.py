"""What bench/gpu/gpu_check.py runs with: its phases and their timeouts, the model sizes of each mode, the
tolerances."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

# offload comes last: the newest phase, measured on no GPU yet, takes what the budget has left rather than
# squeezing the established ones (the driver gives each phase min(its timeout, what is left)).
PHASES = ("collectives", "parity", "two_ranks", "sanitizer", "allocator", "device", "throughput", "offload")
# Seconds each phase may take on one H200 (the whole stays under 8 minutes: see --budget-s); CPU runs get 4x.
# offload: 4 runs of 6 steps on the allocator's 101 M-parameter model, three of them stepping AdamW on the host
# (roughly a second a step on 16 cores), besides CUDA and process start: about 40 s estimated, 90 s allowed.
TIMEOUTS = {
    "collectives": 60,
    "parity": 120,
    "two_ranks": 75,
    "sanitizer": 150,
    "allocator": 90,
    # device: CUDA's start, two matmuls, a one-rank communicator, 10 bf16 stage-3 steps on the allocator model.
    "device": 60,
    "throughput": 240,
    "offload": 90,
}
CPU_SLOWDOWN = 4
FAULTS = ("parity-reference", "collective-result", "throughput-loss")
MIN_TORCH = (2, 11)

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
OFFLOAD_BYTES_RTOL = 0.02
"""The offload phase: each of memory_report()'s categories (device parameters, gradients, optimizer state; host
optimizer state and parameters) within 2% of its prediction, plus padding_elements times the category's bytes per
element (0 at world size 1). The engine's buffers are flat per unit, so the formula is exact up to AdamW's 0-dim
`step` counters (4 bytes per unit); 2% (as tests/runtime/zero/test_offload.py) is far above those and far below any
misplaced tensor class: a master left on the device is 4 bytes per element where 0 is predicted (and a category
predicted 0 must measure exactly 0), a second copy of the bf16 shard is +100% of its category."""
OFFLOAD_CPU_LOSS_ATOL = 0.0
"""The offload phase on the CPU: the offloaded runs' losses equal the plain run's exactly, since the host step runs
the same CPU AdamW kernels on the same fp32 values (tests/runtime/zero/test_offload.py: bit-equal weights). On CUDA the
host AdamW and the device's differ in kernel and summation order, by an fp32 ulp in a master, which can round a
bf16 weight one unit the other way: BF16_LOSS_ATOL applies there."""
FSDP2_LOSS_ATOL = 5e-2
"""FSDP2 with CPUOffloadPolicy against zero3 plain: |loss difference| at any step, bench/gpu/gpu_throughput.py's --atol
for zerotrain against FSDP2 (other bf16 casts and reduction order, same model, data and AdamW)."""
TOLERANCES = {
    "fp32_atol": FP32_ATOL,
    "bf16_update_rtol": BF16_UPDATE_RTOL,
    "bf16_loss_atol": BF16_LOSS_ATOL,
    "bf16_vs_fp32_loss_atol": BF16_VS_FP32_LOSS_ATOL,
    "offload_bytes_rtol": OFFLOAD_BYTES_RTOL,
    "offload_cpu_loss_atol": OFFLOAD_CPU_LOSS_ATOL,
    "fsdp2_loss_atol": FSDP2_LOSS_ATOL,
}
"""The tolerances as gpu_check.json records them."""


class GptSize(TypedDict):
    """The keyword sizes of zerotrain.runtime.examples.gpt.build."""

    seq_len: int
    batch_size: int
    d_model: int
    n_layers: int
    n_heads: int
    max_bytes: int


@dataclass
class Size:
    """Model sizes and step counts of one mode (cuda, cpu, quick)."""

    gpt: GptSize
    steps: int
    alloc: GptSize
    alloc_steps: int
    sanitizer_steps: int
    throughput: str
    """bench/gpu/gpu_throughput.py's model and step arguments."""
    min_params: int = 0
    offload_warmup: int = 1
    """The offload phase (alloc model, alloc_steps): steps left out of the median step time (the first allocates
    AdamW's state; on CUDA the second may still grow the caching allocator's pools)."""


# On the CPU the allocator phase trains the parity model itself.
CPU_GPT: GptSize = {"seq_len": 64, "batch_size": 8, "d_model": 128, "n_layers": 4, "n_heads": 4, "max_bytes": 200_000}
QUICK_GPT: GptSize = {"seq_len": 32, "batch_size": 4, "d_model": 64, "n_layers": 2, "n_heads": 4, "max_bytes": 40_000}
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
        offload_warmup=2,
    ),
    "cpu": Size(
        gpt=CPU_GPT.copy(),
        steps=5,
        alloc=CPU_GPT.copy(),
        alloc_steps=3,
        sanitizer_steps=2,
        throughput="--d-model 128 --layers 2 --heads 4 --seq-len 64 --batch 8 --steps 4 --warmup 1 --max-bytes 200000",
    ),
    "quick": Size(
        gpt=QUICK_GPT.copy(),
        steps=3,
        alloc=QUICK_GPT.copy(),
        alloc_steps=2,
        sanitizer_steps=1,
        throughput="--d-model 32 --layers 1 --heads 4 --seq-len 16 --batch 4 --steps 3 --warmup 1 --max-bytes 20000 "
        "--systems zero3,fsdp2",
    ),
}
