"""CUDA kernel for the min-plus pass (private; imported only with CuPy present).

One thread per cell ``(row, bucket)``: the minimum over the row's options of
``prev[parent[row], c - w] + t``.  Exactly one double addition per option and
an exact comparison, as the NumPy path does, so results are bit-identical.
The parent gather happens inside the kernel (no copy of the previous level).
"""
from __future__ import annotations

from functools import lru_cache

import cupy as cp

_SOURCE = r"""
extern "C" __global__
void minplus_pass(const double* __restrict__ prev, const long long prev_width,
                  const long long* __restrict__ parent,
                  const int* __restrict__ weights, const double* __restrict__ times,
                  const int n_options, double* __restrict__ out,
                  const long long rows, const long long width)
{
    const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const double* src = prev + parent[r] * prev_width;
        const int* w = weights + r * n_options;
        const double* t = times + r * n_options;
        double best = __longlong_as_double(0x7ff0000000000000LL);  /* +inf */
        for (int o = 0; o < n_options; ++o) {
            const long long wo = w[o];
            if (wo <= c) {
                const double v = __dadd_rn(src[c - wo], t[o]);
                if (v < best) best = v;
            }
        }
        out[r * width + c] = best;
    }
}
"""

THREADS = 256
MAX_GRID_Y = 65535


@lru_cache(maxsize=1)
def _kernel() -> cp.RawKernel:
    """Compiled once per process (CuPy also caches the binary on disk)."""
    return cp.RawKernel(_SOURCE, "minplus_pass")


def minplus_pass(prev: cp.ndarray, parent: cp.ndarray, weights: cp.ndarray, times: cp.ndarray, width: int) -> cp.ndarray:
    """Launch one level: ``prev [P, Wp]``, ``parent [R]`` int64, tables ``[R, O]``."""
    prev = cp.ascontiguousarray(prev, dtype=cp.float64)
    rows, n_options = weights.shape
    out = cp.empty((rows, width), dtype=cp.float64)
    if rows == 0 or width == 0:
        return out
    grid = ((width + THREADS - 1) // THREADS, min(rows, MAX_GRID_Y))
    _kernel()(grid, (THREADS,), (
        prev, cp.int64(prev.shape[1]), parent, weights, times, cp.int32(n_options),
        out, cp.int64(rows), cp.int64(width),
    ))
    return out
