"""The CUDA kernel's source, compiled for the CPU by the strict CuPy stand-in
(tests/strict_cupy.py: a small CUDA shim, CUDA's unsigned block and thread
indices) and run over its whole launch grid, against the NumPy pass: checks the
kernel's indexing, padding and arithmetic without a GPU (the GPU run itself is
in test_backends)."""
from __future__ import annotations

import numpy as np
import pytest
import strict_cupy

from gpuknap.engine import _kernels
from gpuknap.engine._passes import Segment, option_tables, pass_level_xp

pytestmark = strict_cupy.needs_cxx


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("max_y", [None, 2])  # 2: rows loop over the grid's y dimension
def test_kernel_source_equals_numpy_pass(seed, max_y, monkeypatch):
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
    if max_y:
        monkeypatch.setattr(_kernels, "MAX_GRID_Y", max_y)
    cp = strict_cupy
    got = _kernels.minplus_pass(cp, cp.asarray(prev), cp.asarray(parent), cp.asarray(weights), cp.asarray(times),
                                width)
    assert np.array_equal(got.get(), want)
