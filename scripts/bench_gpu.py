"""GPU benchmark (issue 3): the min-plus pass on CuPy against NumPy on the same batch.

Usage: python scripts/bench_gpu.py [--rows R] [--buckets W] [--steps S] [--options O] [--numpy-only]
Prints a markdown table: rows, buckets, options, layer steps, time, cell updates
per second, effective bandwidth (16 bytes per cell update: one read of the
previous row, one write) against the H200's 4.8 TB/s, and the speed-up over NumPy.
CuPy and NumPy results are checked to be bit-identical.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpuknap import LayerOption  # noqa: E402
from gpuknap.engine import (
    Backend,
    FrontTable,  # noqa: E402
    cupy_available,
    get_backend,
)
from gpuknap.engine._backend import NUMPY  # noqa: E402
from gpuknap.engine._batch import Knapsack, build_chunk, plan_chunks  # noqa: E402
from gpuknap.engine._solve import run_chunk  # noqa: E402

H200_BANDWIDTH = 4.8e12
BYTES_PER_CELL = 16


def make_batch(rows, buckets, steps, options, seed=0):
    """``rows`` distinct chains of ``steps`` layers, each of its own kind with ``options`` options."""
    rng = np.random.default_rng(seed)
    fronts = {}
    for r in range(rows):
        mem = np.sort(rng.integers(1, max(2, 2 * buckets // steps), options))
        times = np.sort(rng.uniform(1, 10, options))[::-1]
        fronts[r] = [LayerOption(f"o{j}", float(m), float(t), 0.0) for j, (m, t) in enumerate(zip(mem, times))]
    table = FrontTable(fronts, 1.0)
    problems = [Knapsack((((r, 1), steps),), buckets - 1, r) for r in range(rows)]
    return table, problems


def time_backend(backend, chunk, repeat):
    best, out = float("inf"), None
    for _ in range(repeat):
        if backend.is_gpu:
            backend.xp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = run_chunk(backend, chunk)
        if backend.is_gpu:
            backend.xp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--buckets", type=int, default=65536)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--options", type=int, default=4)
    ap.add_argument("--numpy-only", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    table, problems = make_batch(args.rows, args.buckets, args.steps, args.options)
    entries = plan_chunks(problems, 2**62, 1.0)
    assert len(entries) == 1
    chunk = build_chunk(entries[0], table)
    cells = chunk.cells
    ok, why = cupy_available()
    print(f"# {platform.node()} {platform.machine()}; numpy {np.__version__}; cupy: {'yes' if ok else why}")
    print("| backend | rows | buckets | options | layer steps | time (s) | cell updates/s | effective GB/s | % of 4.8 TB/s | speed-up vs NumPy |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    t_np, ref = time_backend(NUMPY, chunk, 1 if not args.numpy_only else args.repeat)
    rows = [("numpy", t_np)]
    if ok and not args.numpy_only:
        cupy_kernel = get_backend("cupy")
        run_chunk(cupy_kernel, chunk)  # compile and warm up
        t_k, got = time_backend(cupy_kernel, chunk, args.repeat)
        assert np.array_equal(got, ref), "CuPy kernel results differ from NumPy"
        cupy_xp = Backend("cupy", cupy_kernel.xp, "segments")
        t_x, got_x = time_backend(cupy_xp, chunk, args.repeat)
        assert np.array_equal(got_x, ref), "CuPy xp results differ from NumPy"
        rows += [("cupy (CUDA kernel)", t_k), ("cupy (plain xp code)", t_x)]
    for name, t in rows:
        rate = cells / t
        gbs = rate * BYTES_PER_CELL / 1e9
        print(f"| {name} | {args.rows:,} | {args.buckets:,} | {args.options} | {args.steps} | {t:.4f} | {rate:.3e} | "
              f"{gbs:,.1f} | {100 * gbs * 1e9 / H200_BANDWIDTH:.1f} | {t_np / t:.1f}x |")
    print(f"\nresults bit-identical across backends: {'checked' if len(rows) > 1 else 'numpy only'}")


if __name__ == "__main__":
    main()
