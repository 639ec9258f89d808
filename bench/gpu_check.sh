#!/usr/bin/env bash
# The GPU paths in a few minutes (see bench/gpu_check.py): NCCL parity of stages 0-3 against AdamW, bf16, the
# CUDA allocator figures, throughput against FSDP2. Run from the repository root on a machine with a GPU and a
# CUDA build of torch:  bash bench/gpu_check.sh
set -euo pipefail
export PYTHONSAFEPATH=1
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec "$PY" bench/gpu_check.py --device cuda "$@"
