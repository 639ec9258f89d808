#!/usr/bin/env bash
# The GPU check in one call on a bare machine (docs/performance.md, "GPU check"):
#
#   make gpu-bundle                       # first, on a machine with package access: .gpu-bundle/ (git-ignored)
#   bash bench/gpu/gpu_check.sh OUTDIR        # then, from the repository root on the GPU machine (.gpu-bundle/ with it)
#                                         # (OUTDIR defaults to bench/results/gpu_check)
#
# Installs the bundle's wheels that the machine lacks (zerotrain itself, pydantic and its requirements) with
# `pip install --no-index --no-deps --target` into a fresh folder on PYTHONPATH, never touching the machine's torch
# (no torch wheel in the bundle, no constraints file), checks that the bundled zerotrain is this checkout's code, then
# runs bench/gpu/gpu_check.py: every check prints one line; OUTDIR gets gpu_check.log (all of this output),
# gpu_check.json (every check and figure), throughput.json and phases/ (each phase's own log). The whole stays within
# --budget-s (default 470 s on cuda), each phase within its own timeout. Exit status: 0 all checks passed, 1 a check failed,
# 2 the machine or the bundle cannot run them.
#
# Options: --device cpu (gloo, small sizes: try it anywhere), --bundle DIR (default .gpu-bundle), --no-bundle (use
# the zerotrain this Python already imports), --allow-stale-bundle, --budget-s N; anything else goes to
# bench/gpu/gpu_check.py (e.g. --phases parity,allocator, --quick). PYTHON names the interpreter (default python3).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
case ${1:-} in
  -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "" | -*) OUT=$ROOT/bench/results/gpu_check ;;  # no OUTDIR: the git-ignored results folder
  *) OUT=$1; shift ;;
esac
DEVICE=cuda BUNDLE=$ROOT/.gpu-bundle USE_BUNDLE=1 ALLOW_STALE=0 BUDGET=
PASS=()
while [ $# -gt 0 ]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --device=*) DEVICE=${1#*=}; shift ;;
    --bundle) BUNDLE=$2; shift 2 ;;
    --no-bundle) USE_BUNDLE=0; shift ;;
    --allow-stale-bundle) ALLOW_STALE=1; shift ;;
    --budget-s) BUDGET=$2; shift 2 ;;
    *) PASS+=("$1"); shift ;;
  esac
done
# Under 8 minutes on the GPU machine; a CPU run (2 cores, other work) is not held to it.
[ -n "$BUDGET" ] || { [ "$DEVICE" = cuda ] && BUDGET=470 || BUDGET=3600; }
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}

# A setup failure still leaves OUTDIR/gpu_check.json saying why.
setup_failed() {
  echo "FAILED  setup: $1"
  "$PY" -c 'import json, sys; print(json.dumps({"ok": False, "setup_error": sys.argv[1]}))' "$1" \
    >"$OUT/gpu_check.json" 2>/dev/null || printf '{"ok": false}\n' >"$OUT/gpu_check.json"
  exit 2
}

main() {
  local start=$SECONDS
  cd "$ROOT" || setup_failed "no repository root at $ROOT"
  # The repository root has a folder named `operator`: keep the working directory off sys.path (Python >= 3.11),
  # so the standard library's operator module and the installed zerotrain, not the checkout's folders, are imported.
  export PYTHONSAFEPATH=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
  unset PIP_CONSTRAINT PIP_REQUIREMENT PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_TARGET PIP_PREFIX
  echo "gpu_check: $(date -u +%FT%TZ) on $(hostname), device $DEVICE, results in $OUT"
  if [ "$DEVICE" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not available"
  fi
  "$PY" -c 'import sys; print("python", sys.version.split()[0], sys.executable)' || setup_failed "no $PY"
  local expect=()
  if [ "$USE_BUNDLE" = 1 ]; then
    [ -f "$BUNDLE/bundle.json" ] || setup_failed "no bundle at $BUNDLE: run \`make gpu-bundle\` where packages can be downloaded, and bring .gpu-bundle/ along"
    local site selected wheels=()
    site=$(mktemp -d "${TMPDIR:-/tmp}/zerotrain-site.XXXXXX")
    selected=$("$PY" bench/gpu/gpu_bundle.py select "$BUNDLE") || setup_failed "the bundle's wheels did not check out"
    mapfile -t wheels <<<"$selected"
    [ ${#wheels[@]} -gt 0 ] || setup_failed "the bundle selected nothing to install (not even zerotrain)"
    echo "installing into $site: ${wheels[*]##*/}"
    if "$PY" -m pip --version >/dev/null 2>&1; then
      timeout 180 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "${wheels[@]}" || setup_failed "pip install --no-index --target $site failed"
    else  # no pip: these wheels are plain archives of their packages (no scripts or data that matter here)
      echo "no pip for $PY: unpacking the wheels into $site"
      for w in "${wheels[@]}"; do "$PY" -m zipfile -e "$w" "$site" || setup_failed "cannot unpack $w"; done
    fi
    [ ! -e "$site/torch" ] || setup_failed "$site holds a torch: the machine's own must be used"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    if ! "$PY" bench/gpu/gpu_bundle.py verify "$BUNDLE" --checkout "$ROOT"; then
      [ "$ALLOW_STALE" = 1 ] || setup_failed "the bundle's zerotrain is not this checkout's code (--allow-stale-bundle runs it anyway)"
      echo "running the stale bundle (--allow-stale-bundle)"
    fi
    expect=(--expect-site "$site")
  fi
  # The installed zerotrain imports with only the machine's own packages besides the bundle.
  "$PY" -c 'import zerotrain, zerotrain.runtime.zero.engine, zerotrain.runtime.examples.gpt, torch, pydantic
print("zerotrain", zerotrain.__version__, "from", zerotrain.__file__)
print("torch", torch.__version__, "CUDA", torch.version.cuda, "from", torch.__file__)
print("pydantic", pydantic.VERSION, "from", pydantic.__file__)' || setup_failed "zerotrain does not import"
  local left=$((BUDGET - (SECONDS - start)))
  [ "$left" -gt 30 ] || setup_failed "setup used the budget (${BUDGET} s)"
  # The driver keeps every phase within left - 10 s; timeout is only the backstop.
  timeout -k 5 "$left" "$PY" bench/gpu/gpu_check.py --device "$DEVICE" --out "$OUT" --budget-s "$((left - 10))" \
    "${expect[@]}" "${PASS[@]}"
  local rc=$?
  [ "$rc" != 124 ] || echo "FAILED  gpu_check.py ran past the ${BUDGET} s budget"
  echo "gpu_check: exit status $rc after $((SECONDS - start)) s (log: $OUT/gpu_check.log)"
  return "$rc"
}

main 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
