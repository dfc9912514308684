"""Bulk ranking keeps no copy of the splits and little memory: a small code per stage."""
from __future__ import annotations

import gc
import os
import tracemalloc
import weakref

import numpy as np

import gpuknap
from gpuknap import pp_lite
from gpuknap.formats import load_spec

LLAMA = os.path.join(os.path.dirname(gpuknap.__file__), "examples", "llama2_70b.json")


def near_even(layers: int, stages: int, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base, extra = divmod(layers, stages)
    out = np.tile([base + (s >= stages - extra) for s in range(stages)], (count, 1)).astype(np.int64)
    rows = np.arange(count)
    for _ in range(20):
        i = rng.integers(0, stages - 1, count)
        d = rng.choice([-1, 1], count)
        ok = (out[rows, i] - d >= 1) & (out[rows, i + 1] + d >= 1)
        out[rows[ok], i[ok]] -= d[ok]
        out[rows[ok], i[ok] + 1] += d[ok]
    return out


def test_ranking_keeps_no_reference_to_the_splits_and_decodes_rows_on_demand():
    spec = load_spec(LLAMA)
    model = spec.model
    splits = near_even(model.layers, 8, 300, seed=1)
    ref = weakref.ref(splits)
    r = model.rank(splits, spec.bucket, "numpy")
    rows = splits.tolist()
    del splits
    gc.collect()
    assert ref() is None
    assert r._codes.dtype.itemsize <= 2
    for i in (0, 7, 299):
        want = pp_lite(model.stages(rows[i]), model.fronts, spec.bucket)
        assert r.choice(i) == want
        assert r.times(i) == (None if want is None else list(want.times))
        assert r.slowest[i] == (np.inf if want is None else want.slowest)
    table = r.stage_table()
    assert table.shape == (300, 8) and np.array_equal(table.max(axis=1), r.slowest)


def test_bulk_ranking_peaks_under_two_and_a_half_times_its_input():
    spec = load_spec(LLAMA)
    model = spec.model
    model.rank(near_even(model.layers, 16, 100, seed=2), spec.bucket, "numpy")  # caches, fronts
    splits = near_even(model.layers, 16, 200_000, seed=3)
    gc.collect()
    tracemalloc.start()
    try:
        r = model.rank(splits, spec.bucket, "numpy")
        _ = r.order
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * splits.nbytes, peak / splits.nbytes
    assert kept < 1.25 * splits.nbytes, kept / splits.nbytes
