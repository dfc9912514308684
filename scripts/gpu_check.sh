#!/usr/bin/env bash
# One prepared command for a GPU machine (CuPy and pytest already installed):
# the CuPy tests (exact against NumPy and pp_lite), then the GPU benchmark table.
# Usage: bash scripts/gpu_check.sh   (writes gpu_check.log and gpu_bench.md to $OUT or ./)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import cupy; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount())"
python3 -m pytest -q -p no:cacheprovider tests/engine/test_backends.py tests/engine/test_rank.py 2>&1 | tee "$out/gpu_check.log"
status=${PIPESTATUS[0]}
python3 scripts/bench_gpu.py --rows 1024 --buckets 65536 --steps 24 2>&1 | tee "$out/gpu_bench.md"
# whole-model search (issue 10 models) on NumPy and CuPy, same answers
python3 scripts/bench_search.py --skip-baseline --backends numpy,cupy --rows 4 2>&1 | tee -a "$out/gpu_bench.md"
python3 scripts/bench_gpu.py --rows 8192 --buckets 65536 --steps 8 --repeat 2 2>&1 | tee -a "$out/gpu_bench.md"
# the sweep (issue 13): CuPy against NumPy on the same grid, identical rows
python3 scripts/bench_sweep.py --backends numpy,cupy --dask-workers 0 2>&1 | tee -a "$out/gpu_bench.md"
exit $status
