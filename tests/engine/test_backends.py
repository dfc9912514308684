"""Backends: selection, laziness, and bit-identical results on every backend."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest
from conftest import CUPY_OK
from test_rank import assert_rank_equals_pp_lite, random_model_batch

import gpuknap
from gpuknap import rank
from gpuknap.engine import BackendUnavailable, get_backend
from gpuknap.engine._passes import Segment, option_tables, pass_level_xp, pass_level_tables


def test_import_never_imports_cupy():
    code = "import sys, gpuknap; gpuknap.rank; assert 'cupy' not in sys.modules, 'cupy imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_auto_and_env_override(monkeypatch):
    import importlib.util
    monkeypatch.delenv("GPUKNAP_BACKEND", raising=False)
    numba = importlib.util.find_spec("numba") is not None
    assert get_backend("auto").name == ("cupy" if CUPY_OK else "numba" if numba else "numpy")
    monkeypatch.setenv("GPUKNAP_BACKEND", "numpy")
    assert get_backend("auto").name == "numpy"
    assert get_backend().name == "numpy"
    monkeypatch.setenv("GPUKNAP_BACKEND", "bogus")
    with pytest.raises(ValueError, match="GPUKNAP_BACKEND"):
        get_backend("auto")


@pytest.mark.skipif(CUPY_OK, reason="CuPy with a GPU is present here")
def test_cupy_unavailable_says_why():
    with pytest.raises(BackendUnavailable, match="unavailable: CuPy"):
        get_backend("cupy")


def test_xp_pass_matches_table_pass(xp):
    rng = np.random.default_rng(0)
    prev = rng.uniform(0, 10, (5, 40))
    prev[1, :7] = np.inf
    parent = np.array([0, 0, 1, 3, 4, 2])
    segs = [Segment(0, 2, np.array([0, 3]), np.array([1.5, 0.25])),
            Segment(2, 5, np.array([1, 2, 50]), np.array([0.1, 0.2, 0.3])),
            Segment(5, 6, np.array([39]), np.array([2.0]))]
    w, t = option_tables(segs, 6)
    a = pass_level_xp(xp, xp.asarray(prev), xp.asarray(parent), 33, segs)
    b = pass_level_tables(xp, xp.asarray(prev), xp.asarray(parent), xp.asarray(w), xp.asarray(t), 33)
    a, b = (np.asarray(x.get() if hasattr(x, "get") else x) for x in (a, b))
    assert np.array_equal(a, b)
    # independent check of one cell
    want = min(prev[0, 10 - 0] + 1.5, prev[0, 10 - 3] + 0.25)
    assert a[0, 10] == want


def test_segments_reading_views_equal_gathered_rows(xp):
    """A segment whose parents are consecutive rows reads a view of them (``source``);
    the pass must equal the one that gathers every row, bit for bit."""
    rng = np.random.default_rng(1)
    prev = rng.uniform(0, 10, (7, 50))
    prev[2, :9] = np.inf
    parent = np.array([3, 4, 5, 0, 6, 2, 1, 2])
    opts = [(np.array([0, 4]), np.array([1.5, 0.25])), (np.array([1, 2, 60]), np.array([0.1, 0.2, 0.3])),
            (np.array([7]), np.array([2.0]))]
    bounds = [(0, 3), (3, 5), (5, 8)]
    plain = [Segment(a, b, *o) for (a, b), o in zip(bounds, opts)]
    viewed = [Segment(0, 3, *opts[0], source=3), Segment(3, 5, *opts[1]), Segment(5, 8, *opts[2])]
    every = [Segment(0, 3, *opts[0], source=3), Segment(3, 4, *opts[1], source=0),
             Segment(4, 5, *opts[1], source=6), Segment(5, 8, *opts[2])]
    got = [pass_level_xp(xp, xp.asarray(prev), xp.asarray(parent), 41, segs) for segs in (plain, viewed, every)]
    got = [np.asarray(x.get() if hasattr(x, "get") else x) for x in got]
    want = np.full((8, 41), np.inf)  # independent: the recurrence cell by cell
    for r, (a, b) in ((r, ab) for ab in bounds for r in range(*ab)):
        seg = opts[bounds.index((a, b))]
        for c in range(41):
            for w, t in zip(*seg):
                if c - w >= 0:
                    want[r, c] = min(want[r, c], prev[parent[r], c - w] + t)
    for g in got:
        assert np.array_equal(g, want)


def test_chunks_are_built_with_sources_that_match_their_parents():
    from gpuknap.engine import FrontTable, LayerOption
    from gpuknap.engine._batch import Knapsack, build_chunk, plan_chunks

    fronts = {"a": [LayerOption("x", 2.0, 1.0, 2.0), LayerOption("y", 1.0, 1.0, 3.0)],
              "b": [LayerOption("z", 3.0, 0.5, 0.5)]}
    table = FrontTable(fronts, 1.0)
    rng = random.Random(3)
    problems = [Knapsack(tuple((rng.choice("ab"), rng.randint(1, 3)) for _ in range(rng.randint(1, 3))),
                         rng.randint(5, 40), i) for i in range(60)]
    problems = [Knapsack(tuple(((k, 1), n) for k, n in p.runs), p.capacity, p.ident) for p in problems]
    seen = 0
    for entries in plan_chunks(problems, 2**30, 1.0):
        for level in build_chunk(entries, table).levels:
            for seg in level.segments:
                rows = level.parent[seg.start:seg.stop]
                consecutive = bool((np.diff(rows) == 1).all())
                assert seg.source == (int(rows[0]) if consecutive else -1)
                seen += seg.source >= 0
    assert seen  # the view path is exercised


def test_chunks_are_cut_to_the_target_and_only_rows_over_the_limit_are_refused():
    from gpuknap.engine._batch import Knapsack, plan_chunks, row_bytes

    caps = [10, 20, 1000, 30, 40]
    problems = [Knapsack(((("k%d" % i, 1), 2),), cap, i) for i, cap in enumerate(caps)]  # no shared steps
    chunks = plan_chunks(problems, 10**6, 1.0, target=row_bytes(45))
    assert sorted(ident for chunk in chunks for _, reads in chunk for _, ident in reads) == list(range(5))
    for chunk in chunks:
        need = sum(row_bytes(max(c for c, _ in reads)) for _, reads in chunk)
        assert need <= row_bytes(45) or len(chunk) == 1  # the 1000-bucket row alone in its chunk
    assert len(chunks) >= 3
    with pytest.raises(ValueError, match="bucket"):
        plan_chunks(problems, row_bytes(999), 1.0, target=row_bytes(45))


def test_cuts_at_the_target_recompute_little_of_a_shared_chain():
    """Prefixes of one deep chain, each with a branch, share almost every pass: cut at the
    target alone, each chunk would compute the chain again from the start (quadratic).
    Cuts at the target may recompute at most RECOMPUTE_SHARE of the chunk before them;
    the hard limit still cuts wherever it must."""
    from gpuknap.engine import FrontTable, LayerOption
    from gpuknap.engine._batch import (
        RECOMPUTE_SHARE,
        Knapsack,
        build_chunk,
        plan_chunks,
        row_bytes,
    )

    table = FrontTable({"a": [LayerOption("x", 2.0, 1.0, 2.0)], "b": [LayerOption("z", 3.0, 0.5, 0.5)],
                        "c": [LayerOption("w", 1.0, 0.5, 0.5)]}, 1.0)
    chain = [Knapsack(((("a", 1), n),), 50, n) for n in range(1, 41)]
    branch = [Knapsack(((("a", 1), n), (("b", 1), 2)), 50, 100 + n) for n in range(1, 41)]
    apart = [Knapsack(((("c", 1), 3), (("b", 1), n)), 50, 200 + n) for n in range(1, 41)]  # one long branch
    problems = chain + branch + apart
    whole = plan_chunks(problems, 10**9, 1.0)
    assert len(whole) == 1
    whole_cells = build_chunk(whole[0], table).cells
    cut = plan_chunks(problems, 10**9, 1.0, target=row_bytes(50) * 3)
    assert len(cut) > 1  # cut where little is shared ...
    assert sum(build_chunk(c, table).cells for c in cut) <= (1 + RECOMPUTE_SHARE) * whole_cells  # ... only there
    entries = whole[0]  # what cutting every 3 rows, whatever they share, would cost:
    assert sum(build_chunk(entries[i:i + 3], table).cells for i in range(0, len(entries), 3)) > 5 * whole_cells
    loose = [Knapsack(((("k%d" % i, 1), 2),), 50, 300 + i) for i in range(5)]  # nothing shared
    hard = plan_chunks(loose, row_bytes(50) * 3, 1.0)
    assert len(hard) > 1  # the limit still cuts ...
    assert len(plan_chunks(chain, row_bytes(50) * 3, 1.0)) == 1  # ... but a chain is one row per level
    assert max(lv.rows for lv in build_chunk(plan_chunks(chain, row_bytes(50) * 3, 1.0)[0], table).levels) == 1


def test_cache_sized_chunks_give_the_answers_of_one_chunk(monkeypatch):
    import gpuknap.engine._backend as backend_module

    rng = random.Random(7)
    fr, cands = random_model_batch(rng, 80)
    whole = rank(cands, fr, 1, backend="numpy")
    monkeypatch.setattr(backend_module, "CPU_CHUNK_BYTES", 20_000)  # many small chunks
    import gpuknap.engine._solve as engine_module
    chunks = []
    real = engine_module.run_chunk
    monkeypatch.setattr(engine_module, "run_chunk", lambda *a, **k: chunks.append(1) or real(*a, **k))
    cut = rank(cands, fr, 1, backend="numpy")
    assert len(chunks) > 5
    assert np.array_equal(whole.slowest, cut.slowest)
    for i in range(len(cands)):
        assert cut.times(i) == whole.times(i)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("max_bytes", [None, 60_000])
def test_every_backend_equals_numpy_and_pp_lite(backend, seed, max_bytes):
    rng = random.Random(100 + seed)
    fr, cands = random_model_batch(rng, 40 + 20 * seed)
    bucket = rng.choice([1, 3, 8])
    ref = rank(cands, fr, bucket, backend="numpy")
    got = assert_rank_equals_pp_lite(cands, fr, bucket, backend=backend, max_bytes=max_bytes)
    assert np.array_equal(ref.slowest, got.slowest)
    for i in range(len(cands)):
        assert got.times(i) == ref.times(i)


def test_public_names_are_exported():
    for name in ["MEGABYTE", "LayerOption", "Layers", "Assignment", "StageChoice", "Stage", "PipelineChoice",
                 "choose", "least_times", "suffix_times", "pp_lite", "rank", "Ranking"]:
        assert hasattr(gpuknap, name)
    assert gpuknap.MEGABYTE == 2**20


@pytest.mark.parametrize("score", ["slowest", "1f1b"])
def test_search_and_model_rank_are_identical_on_every_backend(backend, score):
    """best_splits (with the bucketing bound) and model.rank, plain and interleaved, give
    bit-identical results on every backend."""
    from gpuknap import LayerOption, PipelineModel, best_splits

    rng = random.Random(7)
    fr = {k: [LayerOption(f"{k}{j}", rng.randint(1, 40) * 2**20 // 3, rng.uniform(1, 9), rng.uniform(0, 5))
              for j in range(3)] for k in "abc"}
    kinds = [rng.choice("abc") for _ in range(30)]
    model = PipelineModel(kinds, fr, {k: 50 * 2**20 for k in "abc"}, 3 * 2**30, 6)
    want = best_splits(model, 5, 4, score, 2**20, backend="numpy", bound=True)
    assert len(want) == 4
    got = best_splits(model, 5, 4, score, 2**20, backend=backend, bound=True, max_bytes=2**20)
    assert [(c, s, lb) for c, s, _, lb in got] == [(c, s, lb) for c, s, _, lb in want]
    rows = [c for c, _, _, _ in want]
    assert np.array_equal(model.rank(rows, 2**20, backend).slowest, model.rank(rows, 2**20, "numpy").slowest)
    inter = [[1] * 9 + [21], [2] * 9 + [12]]
    table = [[3, 2], [2, 2], [2, 1], [1, 1], [1, 1]]
    a = model.rank(inter, 2**20, backend, in_flight=table, chunks=2)
    b = model.rank(inter, 2**20, "numpy", in_flight=table, chunks=2)
    assert np.array_equal(a.slowest, b.slowest) and a.times(1) == b.times(1)


def test_simulated_interleaved_and_sweep_are_identical_on_every_backend(backend):
    """The simulated score, the exact interleaved search and a sweep give the same answers
    on every backend (with small chunks, so the batches are cut)."""
    from gpuknap import MEGABYTE, best_splits, sweep
    from gpuknap.formats import load_spec

    demo = os.path.join(os.path.dirname(gpuknap.__file__), "examples", "demo.json")
    model = load_spec(demo, capacity="80GiB").model
    for kwargs in (dict(score="simulated"), dict(score="1f1b", interleave=2), dict(score="slowest", interleave=2)):
        want = best_splits(model, 8, 3, bucket=MEGABYTE, backend="numpy", **kwargs)
        got = best_splits(model, 8, 3, bucket=MEGABYTE, backend=backend, max_bytes=2**24, **kwargs)
        assert [(c, s) for c, s, _ in got] == [(c, s) for c, s, _ in want], kwargs
    llama = os.path.join(os.path.dirname(gpuknap.__file__), "examples", "llama2_70b.json")
    grid = {"stages": [2, 4], "tensor_parallel": [4, 8], "micro_batch_size": [1, 2], "interleave": [1, 2]}
    a = sweep(llama, grid, gpus=32, global_batch=64, backend="numpy")
    b = sweep(llama, grid, gpus=32, global_batch=64, backend=backend)
    assert a.rows == b.rows
