"""The CUDA kernel's source, compiled for the CPU with a tiny CUDA shim and run over
its whole launch grid, against the NumPy pass: checks the kernel's indexing,
padding and arithmetic without a GPU (the GPU run itself is in test_backends)."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from gpuknap.engine._passes import Segment, option_tables, pass_level_xp

CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler to build the kernel source for the CPU")

SHIM = r"""
#include <cstring>
struct dim3_ { long long x, y, z; };
static dim3_ blockIdx, blockDim, threadIdx, gridDim;
#define __global__
#define __restrict__
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
static inline double __dadd_rn(double a, double b) { volatile double s = a + b; return s; }
"""

DRIVER = r"""
extern "C" void launch(long long gx, long long gy, long long threads,
                       const double* prev, long long prev_width, const long long* parent,
                       const int* weights, const double* times, int n_options, double* out,
                       long long rows, long long width) {
    gridDim.x = gx; gridDim.y = gy; blockDim.x = threads;
    for (long long by = 0; by < gy; ++by)
        for (long long bx = 0; bx < gx; ++bx)
            for (long long tx = 0; tx < threads; ++tx) {
                blockIdx.x = bx; blockIdx.y = by; threadIdx.x = tx;
                minplus_pass(prev, prev_width, parent, weights, times, n_options, out, rows, width);
            }
}
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    import importlib.util
    import pathlib
    spec = importlib.util.find_spec("gpuknap.engine._kernels")
    text = pathlib.Path(spec.origin).read_text()
    source = text.split('_SOURCE = r"""', 1)[1].split('"""', 1)[0]
    threads = int(text.split("THREADS = ", 1)[1].split()[0])
    max_y = int(text.split("MAX_GRID_Y = ", 1)[1].split()[0])
    src = tmp_path_factory.mktemp("kernel") / "kernel.cpp"
    lib = src.with_suffix(".so")
    src.write_text(SHIM + source + DRIVER)
    subprocess.run([CXX, "-O1", "-ffp-contract=off", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib)), threads, max_y


def run_kernel(kernel, prev, parent, weights, times, width, max_y=None):
    lib, threads, grid_y = kernel
    rows, n_opt = weights.shape
    out = np.full((rows, width), -1.0)
    gx = (width + threads - 1) // threads
    gy = min(rows, max_y or grid_y)
    p = lambda a: a.ctypes.data_as(ctypes.c_void_p)
    lib.launch(ctypes.c_longlong(gx), ctypes.c_longlong(gy), ctypes.c_longlong(threads),
               p(prev), ctypes.c_longlong(prev.shape[1]), p(parent), p(weights), p(times), ctypes.c_int(n_opt),
               p(out), ctypes.c_longlong(rows), ctypes.c_longlong(width))
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("max_y", [None, 2])  # 2: rows loop over the grid's y dimension
def test_kernel_source_equals_numpy_pass(kernel, seed, max_y):
    rng = np.random.default_rng(seed)
    prev_rows, prev_width = int(rng.integers(1, 6)), int(rng.integers(1, 700))
    prev = rng.uniform(0, 50, (prev_rows, prev_width)).round(1)
    prev[rng.random(prev.shape) < 0.2] = np.inf
    rows = int(rng.integers(1, 9))
    width = int(rng.integers(1, prev_width + 1))
    parent = rng.integers(0, prev_rows, rows).astype(np.int64)
    segments, a = [], 0
    while a < rows:
        b = int(rng.integers(a + 1, rows + 1))
        n = int(rng.integers(1, 5))
        ws = np.sort(rng.integers(0, width + 3, n))
        segments.append(Segment(a, b, ws, rng.uniform(0, 9, n)))
        a = b
    weights, times = option_tables(segments, rows)
    want = pass_level_xp(np, prev, parent, width, segments)
    got = run_kernel(kernel, np.ascontiguousarray(prev), parent, weights, times, width, max_y)
    assert np.array_equal(got, want)
