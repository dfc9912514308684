"""CUDA kernel for the min-plus pass, beside its launcher (private).

One thread per cell ``(row, bucket)``: the minimum over the row's options of
``prev[parent[row], c - w] + t``.  Exactly one double addition per option and
an exact comparison, as the NumPy path does, so results are bit-identical.
The parent gather happens inside the kernel (no copy of the previous level).

This module never imports CuPy: the launcher is given the CuPy module by the
backend (:mod:`gpuknap.engine._backend`, the one place CuPy is imported).
"""
from __future__ import annotations

from typing import Any

from ._passes import MAX_TABLE_WIDTH as MAX_WIDTH

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


_compiled: dict = {}


def _kernel(cp: Any) -> Any:
    """Compiled once per process (CuPy also caches the binary on disk)."""
    kernel = _compiled.get(id(cp))
    if kernel is None:
        kernel = _compiled[id(cp)] = cp.RawKernel(_SOURCE, "minplus_pass")
    return kernel


def minplus_pass(cp: Any, prev: Any, parent: Any, weights: Any, times: Any, width: int) -> Any:
    """Launch one level on CuPy (the module ``cp``): ``prev [P, Wp]``, ``parent [R]`` int64,
    tables ``[R, O]``."""
    # CuPy passes an array to a kernel as its data pointer alone: dtypes and layout must be
    # the kernel's own (no copy when they already are)
    prev = cp.ascontiguousarray(prev, dtype=cp.float64)
    parent = cp.ascontiguousarray(parent, dtype=cp.int64)
    weights = cp.ascontiguousarray(weights, dtype=cp.int32)
    times = cp.ascontiguousarray(times, dtype=cp.float64)
    rows, n_options = weights.shape
    if width > MAX_WIDTH:
        raise ValueError(f"a row of {width:,} buckets is wider than the CUDA kernel's 32-bit weights allow "
                         f"({MAX_WIDTH:,}); use a larger bucket")
    out = cp.empty((rows, width), dtype=cp.float64)
    if rows == 0 or width == 0:
        return out
    grid = ((width + THREADS - 1) // THREADS, min(rows, MAX_GRID_Y))
    _kernel(cp)(grid, (THREADS,), (
        prev, cp.int64(prev.shape[1]), parent, weights, times, cp.int32(n_options),
        out, cp.int64(rows), cp.int64(width),
    ))
    return out
