#!/usr/bin/env bash
# The GPU paths in a few minutes: NCCL parity of stages 0-3 against AdamW, bf16 and the CUDA allocator figures
# (bench/gpu_check.py), then stage-3 throughput against both FSDP2 modes on the same GPU, with the losses checked
# against one process (bench/compare.py, one rank). Run from the repository root on a machine with a GPU and a
# CUDA build of torch:  bash bench/gpu_check.sh
set -euo pipefail
export PYTHONSAFEPATH=1
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" bench/gpu_check.py --device cuda
exec "$PY" bench/compare.py --device cuda --worlds 1 --systems zero3,fsdp2,fsdp2-keep --reps 3 --steps 12 \
  --d-model 1024 --layers 8 --heads 16 --seq-len 512 --batch 16 --out bench/results/gpu_compare.json --no-plots "$@"
