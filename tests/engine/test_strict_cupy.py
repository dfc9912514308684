"""The CuPy path off the GPU: the strict stand-in (tests/strict_cupy.py) stays strict, the
kernel's launcher holds its guards, and the GPU scripts (scripts/bench_gpu.py,
scripts/bench_search.py's backend table: what scripts/gpu_check.sh runs) go through
every code path they take on a GPU, at toy sizes.  Times printed here are the CPU's
and mean nothing; what is checked is that every row runs and matches the CPU."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import strict_cupy as cp

from gpuknap.engine import _backend, _kernels
from gpuknap.engine._passes import Segment, option_tables, pass_level_xp

pytestmark = cp.needs_cxx
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")


def test_arrays_refuse_numpy_as_cupy_does():
    a = cp.asarray(np.arange(4.0))
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)
    for mixed in (lambda: a + np.ones(4), lambda: np.ones(4) + a, lambda: a[np.array([0, 1])],
                  lambda: cp.concatenate([a, np.ones(2)]), lambda: cp.minimum(a, np.ones(4))):
        with pytest.raises(TypeError):
            mixed()
    assert np.array_equal((a + 1.0).get(), np.arange(4.0) + 1.0)  # scalars are fine
    assert np.array_equal(cp.asnumpy(a[cp.asarray(np.array([3, 0]))]), [3.0, 0.0])


def _level(seed=0, rows=5, width=40):
    rng = np.random.default_rng(seed)
    prev = rng.uniform(0, 9, (3, width + 7))
    parent = rng.integers(0, 3, rows).astype(np.int64)
    segs = [Segment(0, 2, np.array([0, 3]), np.array([1.5, 0.25])), Segment(2, rows, np.array([1, 60]),
                                                                                 np.array([0.1, 0.3]))]
    return prev, parent, segs


def test_kernel_arguments_are_checked_like_its_c_signature():
    prev, parent, segs = _level()
    w, t = option_tables(segs, 5)
    kernel = _kernels._kernel(cp)
    out = cp.empty((5, 40))
    good = [cp.asarray(prev), np.int64(prev.shape[1]), cp.asarray(parent), cp.asarray(w), cp.asarray(t),
            np.int32(w.shape[1]), out, np.int64(5), np.int64(40)]
    kernel((1, 5), (256,), tuple(good))
    assert np.array_equal(out.get(), pass_level_xp(np, prev, parent, 40, segs))
    bad = {3: cp.asarray(w.astype(np.int64)),  # wrong dtype
           2: cp.asarray(parent)[::-1],  # not C-contiguous
           0: prev,  # a NumPy array
           1: int(prev.shape[1])}  # a Python int where the source says long long: passed as np.int64 only
    for i, arg in bad.items():
        args = list(good)
        args[i] = arg
        with pytest.raises((TypeError, ValueError)):
            kernel((1, 5), (256,), tuple(args))
    with pytest.raises(ValueError, match="grid"):
        kernel((1, 65536), (256,), tuple(good))
    with pytest.raises(ValueError, match="block"):
        kernel((1, 5), (2048,), tuple(good))


def test_the_launcher_makes_its_arguments_the_kernels_own():
    """A caller handing int64 weights, a non-contiguous parent or a float32 table still
    gets the NumPy pass's answer (CuPy would read them as raw pointers)."""
    prev, parent, segs = _level(1)
    w, t = option_tables(segs, 5)
    odd_parent = cp.asarray(np.repeat(parent, 2))[::2]
    got = _kernels.minplus_pass(cp, cp.asarray(prev), odd_parent, cp.asarray(w.astype(np.int64)),
                                cp.asarray(t), 40)
    assert np.array_equal(got.get(), pass_level_xp(np, prev, parent, 40, segs))


def test_rows_wider_than_32_bit_weights_are_refused_before_any_pass(monkeypatch):
    from gpuknap.engine import FrontTable, LayerOption
    from gpuknap.engine import _solve
    from gpuknap.engine._batch import Knapsack

    table = FrontTable({"a": [LayerOption("x", 2.0, 1.0, 2.0), LayerOption("y", 1.0, 1.0, 3.0)]}, 1.0)
    problems = [Knapsack(((("a", 1), 3),), 60, 0)]
    want = _solve.solve_knapsacks(problems, table, _backend.NUMPY, None, 1)
    monkeypatch.setattr(_solve, "MAX_TABLE_WIDTH", 50)
    assert np.array_equal(_solve.solve_knapsacks(problems, table, _backend.NUMPY, None, 1), want)  # no tables
    passes = []
    monkeypatch.setattr(_solve, "run_chunk", lambda *a, **k: passes.append(1))
    for backend in (cp.backend(), _backend.Backend("numpy", np, "tables")):
        with pytest.raises(ValueError, match="61 buckets is wider .* use a larger bucket"):
            _solve.solve_knapsacks(problems, table, backend, None, 1)
    assert not passes
    monkeypatch.setattr(_kernels, "MAX_WIDTH", 50)  # the launcher's own guard
    prev, parent, segs = _level(2, width=60)
    w, t = option_tables(segs, 5)
    with pytest.raises(ValueError, match="wider than the CUDA kernel"):
        _kernels.minplus_pass(cp, cp.asarray(prev), cp.asarray(parent), cp.asarray(w), cp.asarray(t), 60)


def test_the_memory_limit_counts_what_cupys_pool_keeps(monkeypatch):
    backend = cp.backend()
    before = backend.default_max_bytes()
    monkeypatch.setattr(cp._POOL, "free_bytes", lambda: 2**28)
    assert backend.default_max_bytes() == before + int(2**28 * _backend.GPU_FREE_SHARE)


@pytest.fixture
def as_cupy(monkeypatch):
    """``import cupy`` gives the stand-in, and backend selection sees a GPU, for one test."""
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.syspath_prepend(SCRIPTS)
    _backend._cupy_status.cache_clear()
    yield
    monkeypatch.undo()
    _backend._cupy_status.cache_clear()


def test_gpu_benchmark_runs_every_part_and_matches_the_cpu(as_cupy, monkeypatch, capsys):
    import bench_gpu

    assert _backend.get_backend("auto").is_gpu  # "auto" takes the GPU when one is there
    monkeypatch.setattr(bench_gpu, "SYNTHETIC_QUICK", [(6, 300, 3, 4), (3, 300, 3, 64)])
    monkeypatch.setattr(bench_gpu, "COPY_BYTES_QUICK", 2**16)
    monkeypatch.setattr(bench_gpu, "sweep_grid", lambda quick: {"stages": [2, 4], "tensor_parallel": [1],
                                                                "micro_batch_size": [1], "interleave": [1]})
    monkeypatch.setattr(sys, "argv", ["bench_gpu.py", "--quick", "--reps", "2"])
    bench_gpu.main()
    out = capsys.readouterr().out
    assert "cupy: yes" in out and "measured device-to-device copy" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert len(rows) == 2 and all(line.endswith("| yes |") for line in rows), out  # synthetic: bit-identical
    assert out.count("| the ") == 2  # the sweep's levels, cut as the CPU and as the GPU plans them
    assert "| cupy |" in out and "NO" not in out


def test_search_benchmark_compares_real_dp_on_both_backends(as_cupy, monkeypatch, capsys):
    import bench_search

    monkeypatch.setattr(bench_search, "DP_CASES", [(48, 4, 8, 12)])
    monkeypatch.setattr(bench_search, "timed", lambda fn, repeat: (0.0, fn()))
    bench_search.backend_rows(["numpy", "cupy"], 1)
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("| 48 | 4 | 8 | 12 |") and row.endswith("| yes |"), row
    assert int(row.split("|")[5].replace(",", "")) > 0  # knapsacks solved: real DP
