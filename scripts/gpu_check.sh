#!/usr/bin/env bash
# One prepared command for a GPU machine (CuPy, Numba and pytest installed): the CuPy
# tests (bit-identical to NumPy, equal to pp_lite), then what a roofline needs
# (scripts/bench_gpu.py: kernel-only times from CUDA events against a measured
# device-to-device copy peak, at 4 and 64 options, on the sweep's real level shapes),
# the whole-model searches on NumPy and CuPy (every row does DP), the sweep end to end.
#
# Usage: bash scripts/gpu_check.sh [full|quick|rehearse]
#   full  (default) at most 8 minutes; quick at most 3 minutes (smaller batches and grid);
#   rehearse: quick on a machine without a GPU, CuPy played by the strict CPU stand-in
#   (tests/strict_cupy.py: the CUDA kernel compiled for the CPU), to check every step
#   runs before a GPU is lent (its numbers are the CPU's, not a GPU's).
# Every step has its own time limit and prints its rows as they are measured, so a
# step cut short still leaves what it measured.  Output: gpu_check.log and
# gpu_bench.md in $OUT (or ./).
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-full}"
out="${OUT:-.}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "$mode" = rehearse ]; then
    shim="$(mktemp -d)"
    trap 'rm -rf "$shim"' EXIT
    cat > "$shim/cupy.py" <<EOF
import sys
sys.path.insert(0, "$PWD/tests")
import strict_cupy
sys.modules[__name__] = strict_cupy
EOF
    export PYTHONPATH="$shim:$PYTHONPATH"
    echo "rehearsal: CuPy is the strict CPU stand-in (tests/strict_cupy.py); no number below is a GPU's"
    mode=quick t_slack=60
fi
if [ "$mode" = quick ]; then
    t_tests=40 t_gpu=$(( 70 + ${t_slack:-0} )) t_search=35 rows=2 quick=--quick sweep=
else
    t_tests=110 t_gpu=200 t_search=80 rows=4 quick= sweep=,sweep
fi
start=$(date +%s)
step() { echo; echo "### $1 ($(( $(date +%s) - start )) s in)"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv,noheader || true
timeout 30 python3 -c "import cupy; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount())"

step "CuPy tests (limit ${t_tests} s)"
timeout "$t_tests" python3 -m pytest -q -x -p no:cacheprovider -k "cupy and not strict" \
    tests/engine/test_backends.py 2>&1 | tee "$out/gpu_check.log"
status=${PIPESTATUS[0]}

step "roofline: synthetic batches, the sweep's level shapes (limit ${t_gpu} s)"
timeout "$t_gpu" python3 scripts/bench_gpu.py $quick --part "synthetic,replay$sweep" 2>&1 | tee "$out/gpu_bench.md"

step "whole-model searches, NumPy against CuPy, every row with DP (limit ${t_search} s)"
timeout "$t_search" python3 scripts/bench_search.py --backends numpy,cupy --rows "$rows" 2>&1 | tee -a "$out/gpu_bench.md"

step "done"
exit "$status"
