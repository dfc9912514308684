"""The fused CPU pass (Numba) against the NumPy pass, bit for bit, and against the
recurrence cell by cell; how the backends choose it and fall back without it."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest
from test_rank import random_model_batch

from gpuknap import rank
from gpuknap.engine import BackendUnavailable, get_backend, numba_available
from gpuknap.engine import _backend as backend_module
from gpuknap.engine._backend import NUMPY
from gpuknap.engine._batch import Knapsack, build_chunk, plan_chunks
from gpuknap.engine._passes import Segment, pass_level_xp
from gpuknap.engine._solve import run_chunk

NUMBA_OK, NUMBA_WHY = numba_available()
needs_numba = pytest.mark.skipif(not NUMBA_OK, reason=f"no fused CPU pass here: {NUMBA_WHY}")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Level:
    def __init__(self, width, segments):
        self.width, self.segments = width, segments


def bits(a: np.ndarray) -> np.ndarray:
    """The float64 bit patterns (``-0.0`` and ``0.0`` differ here, unlike ``==``)."""
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64)


def random_level(rng: np.random.Generator, rows_prev: int, width_prev: int, rows: int, width: int):
    """A previous level with ``inf`` cells (whole prefixes and scattered ones), parents in
    any order, segments with zero weights, repeated and unsorted weights, weights at and
    past the width, 1 to 9 options (groups of four and what is left), ``inf`` times."""
    prev = rng.uniform(0, 100, (rows_prev, width_prev))
    prev[rng.random(prev.shape) < 0.05] = np.inf
    for r in range(rows_prev):
        prev[r, :rng.integers(0, width_prev // 2 + 1)] = np.inf
    prev[0] = np.inf  # a row with no finite cell
    parent = rng.integers(0, rows_prev, rows)
    cuts = sorted(set(rng.integers(1, rows, min(rows - 1, 4)).tolist())) if rows > 1 else []
    segments = []
    for a, b in zip([0] + cuts, cuts + [rows]):
        n = int(rng.integers(1, 10))
        w = rng.integers(0, max(2, width + 3), n)
        w[rng.random(n) < 0.3] = 0
        if n > 2:
            w[1] = w[0]
        t = rng.uniform(0, 10, n)
        t[rng.random(n) < 0.1] = np.inf
        segments.append(Segment(int(a), int(b), w.astype(np.int64), t))
    return prev, parent, Level(width, segments)


def brute(prev, parent, level) -> np.ndarray:
    """The recurrence, cell by cell (independent of both passes)."""
    out = np.full((len(parent), level.width), np.inf)
    for seg in level.segments:
        for r in range(seg.start, seg.stop):
            for c in range(level.width):
                for w, t in zip(seg.weights.tolist(), seg.times.tolist()):
                    if w <= c:
                        out[r, c] = min(out[r, c], prev[parent[r], c - w] + t)
    return out


@needs_numba
@pytest.mark.parametrize("tile", [1, 3, 8, 2048])
@pytest.mark.parametrize("parallel", [0, 1 << 62])
def test_fused_pass_equals_numpy_bit_for_bit_on_random_levels(monkeypatch, tile, parallel):
    from gpuknap.engine import _cpu

    monkeypatch.setattr(_cpu, "TILE", tile)
    monkeypatch.setattr(_cpu, "PARALLEL_WORK", parallel)  # every level on threads, or none
    monkeypatch.setattr(_cpu, "BUSY_PARALLEL_WORK", parallel)
    rng = np.random.default_rng(tile * 7 + bool(parallel))
    for case in range(12):
        width = int(rng.choice([1, 2, tile - 1 or 1, tile, tile + 1, 3 * tile + 5, 97]))
        width_prev = width + int(rng.integers(0, 4))
        prev, parent, level = random_level(rng, int(rng.integers(1, 6)), width_prev, int(rng.integers(1, 9)),
                                           width)
        want = pass_level_xp(np, prev, parent, width, level.segments)
        got = _cpu.pass_level(prev, parent, level)
        assert got.shape == want.shape
        assert np.array_equal(bits(got), bits(want)), (case, width)
        if width <= 40:
            assert np.array_equal(bits(got), bits(brute(prev, parent, level)))


@needs_numba
def test_fused_pass_on_wide_levels_across_tiles_and_threads():
    """Widths that are not a multiple of the tile, large enough to run on threads."""
    from gpuknap.engine import _cpu

    rng = np.random.default_rng(5)
    for width in (_cpu.TILE * 3 + 17, 5000, 70_001):
        prev, parent, level = random_level(rng, 6, width + 10, 24, width)
        want = pass_level_xp(np, prev, parent, width, level.segments)
        assert np.array_equal(bits(_cpu.pass_level(prev, parent, level)), bits(want))


def random_chunks(seed: int, n: int = 80):
    from gpuknap.engine import FrontTable, LayerOption

    rng = random.Random(seed)
    fronts = {k: [LayerOption(f"{k}{j}", rng.randint(0, 60), rng.uniform(0, 3), rng.uniform(0, 3))
                  for j in range(rng.randint(1, 7))] for k in "abcd"}
    table = FrontTable(fronts, 1.0)
    problems = [Knapsack(tuple(((rng.choice("abcd"), rng.randint(1, 4)), rng.randint(1, 5))
                               for _ in range(rng.randint(1, 4))), rng.randint(0, 900), i) for i in range(n)]
    return [build_chunk(entries, table) for entries in plan_chunks(problems, 2**30, 1.0, target=200_000)]


@needs_numba
@pytest.mark.parametrize("seed", range(3))
def test_fused_chunks_equal_numpy_chunks(monkeypatch, seed):
    """Whole chunks: readouts bit for bit, in groups of levels, with buffers kept from one
    chunk to the next (of other sizes), progress counting every cell once."""
    from gpuknap.engine import _cpu

    monkeypatch.setattr(_cpu, "GROUP_WORK", 500)  # many groups of levels per chunk
    monkeypatch.setattr(_cpu, "PARALLEL_WORK", 0)  # every level on threads
    monkeypatch.setattr(_cpu, "BUSY_PARALLEL_WORK", 0)
    chunks = random_chunks(seed)
    assert len(chunks) > 1
    space = _cpu.Workspace()
    for chunk in chunks:
        cells = []
        got = _cpu.run_chunk(chunk, cells.append, space)
        assert np.array_equal(bits(got), bits(run_chunk(NUMPY, chunk)))
        assert sum(cells) == chunk.cells and len(cells) > 1 or len(chunk.levels) <= 1


@needs_numba
def test_numba_backend_ranks_like_numpy():
    rng = random.Random(11)
    fr, cands = random_model_batch(rng, 60)
    want = rank(cands, fr, 2, backend="numpy")
    got = rank(cands, fr, 2, backend="numba")
    assert np.array_equal(bits(got.slowest), bits(want.slowest))
    assert all(got.times(i) == want.times(i) for i in range(len(cands)))


def test_without_numba_auto_falls_back_to_numpy_and_numba_says_why(monkeypatch):
    monkeypatch.delenv("GPUKNAP_BACKEND", raising=False)
    monkeypatch.setattr(backend_module, "_numba_status", _Missing())
    monkeypatch.setattr(backend_module, "AUTO_FUSED", backend_module.Backend("numba", np, "fused", 0))
    with pytest.raises(BackendUnavailable, match="backend 'numba' is unavailable: Numba is not installed"):
        get_backend("numba")
    auto = get_backend("auto")
    assert auto.fused(10**12) is None  # every batch takes the NumPy pass
    rng = random.Random(2)
    fr, cands = random_model_batch(rng, 30)
    assert np.array_equal(rank(cands, fr, 1, backend=auto).slowest, rank(cands, fr, 1, backend="numpy").slowest)
    assert backend_module.numba_available() == (False, _Missing.reason)


class _Missing:
    reason = "Numba is not installed or failed to import (ModuleNotFoundError: No module named 'numba')"

    def __call__(self):
        return None, self.reason

    def cache_info(self):
        class Info:
            currsize = 1
        return Info()


def test_auto_loads_the_fused_pass_only_for_batches_that_pay_for_it(monkeypatch):
    monkeypatch.delenv("GPUKNAP_BACKEND", raising=False)
    auto = get_backend("auto")
    if not NUMBA_OK or auto.name != "numba":
        pytest.skip("the fused pass is not what 'auto' takes here")
    assert auto.fused_work == backend_module.AUTO_FUSED_WORK > 0
    assert get_backend("numba").fused(1) is not None  # asked for by name: always


@needs_numba
def test_a_small_search_on_auto_never_loads_the_fused_pass():
    """In a fresh process, ``best`` on the shipped demo (a batch under ``AUTO_FUSED_WORK``) runs
    on the NumPy pass and never imports Numba (loading it cost 0.4-0.7 s of a 0.3 s command:
    each level's pass used to load it whatever the batch); ``backend="numba"`` asked for by name
    loads it for the same search, and both give the same answer."""
    code = ("import sys, io, contextlib; from gpuknap.cli._main import main; out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out): main(['best', '--backend', sys.argv[1], '--json'])\n"
            "print('numba' in sys.modules); print(out.getvalue())")
    env = {k: v for k, v in os.environ.items() if k != "GPUKNAP_BACKEND"}
    runs = {b: subprocess.run([sys.executable, "-c", code, b], check=True, cwd=ROOT, env=env, capture_output=True,
                              text=True).stdout.split("\n", 1) for b in ("auto", "numba")}
    assert runs["auto"][0] == "False" and runs["numba"][0] == "True"
    assert runs["auto"][1].replace('"numba"', '"auto"') == runs["numba"][1].replace('"numba"', '"auto"')


def test_import_never_imports_numba():
    code = "import sys, gpuknap; gpuknap.rank; assert 'numba' not in sys.modules, 'numba imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@needs_numba
def test_single_stage_solvers_on_the_fused_pass_equal_numpy(monkeypatch):
    """pp_lite and choose call ``pass_level``, which takes the fused pass once it is loaded:
    the same choices and times as on the plain NumPy pass."""
    from gpuknap import pp_lite
    from gpuknap.engine import _cpu
    from gpuknap.engine import _passes as passes

    rng = random.Random(4)
    fr, cands = random_model_batch(rng, 40)
    monkeypatch.setattr(passes, "FUSED", None)
    want = [pp_lite(c, fr, 2) for c in cands]
    monkeypatch.setattr(passes, "FUSED", _cpu)
    monkeypatch.setattr(passes, "FUSED_WORK", 0)  # every level
    calls = []
    real = _cpu.pass_level
    monkeypatch.setattr(_cpu, "pass_level", lambda *a: calls.append(1) or real(*a))
    assert [pp_lite(c, fr, 2) for c in cands] == want
    assert calls
