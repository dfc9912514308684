"""The batched solver against pp_lite per candidate."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import buckets, candidates, fronts

from gpuknap import LayerOption, Layers, Stage, pp_lite, rank


def assert_rank_equals_pp_lite(cands, fr, bucket, **kw):
    r = rank(cands, fr, bucket, **kw)
    assert len(r) == len(cands)
    for i, c in enumerate(cands):
        want = pp_lite(c, fr, bucket)
        if want is None:
            assert r.slowest[i] == math.inf
            assert r.times(i) is None and r.choice(i) is None
        else:
            assert r.slowest[i] == want.slowest
            assert r.times(i) == list(want.times)
            assert r.choice(i) == want
    keys = [(r.slowest[i], i) for i in range(len(cands))]
    assert [i for _, i in sorted(keys)] == r.order.tolist()
    return r


@settings(max_examples=150, deadline=None)
@given(fronts(dyadic=False), st.lists(candidates(), min_size=1, max_size=8), buckets)
def test_rank_equals_pp_lite_on_random_batches(fr, cands, bucket):
    assert_rank_equals_pp_lite(cands, fr, bucket, backend="numpy")


def random_model_batch(rng, n, kinds=("h", "b", "m", "t")):
    """Mixed batches: shared prefixes, repeated stages, several kinds and in-flight counts."""
    fr = {}
    for kd in kinds:
        opts = []
        for j in range(rng.randint(1, 4)):
            opts.append(LayerOption(f"{kd}{j}", rng.randint(0, 40), rng.uniform(0, 5), rng.uniform(0, 9),
                                    rng.randint(0, 30)))
        fr[kd] = opts
    cands = []
    for _ in range(n):
        p = rng.randint(1, 5)
        stages = []
        for s in range(p):
            gs = []
            for kd in rng.sample(kinds, rng.randint(1, 3)):
                gs.append(Layers(kd, rng.randint(0, 9), rng.choice([1, p - s, 3])))
            stages.append(Stage(gs, rng.choice([rng.randint(-20, 900), 300, 600]), rng.choice([0.0, 1.25])))
        cands.append(stages)
    return fr, cands


@pytest.mark.parametrize("seed", range(6))
def test_rank_equals_pp_lite_larger(seed):
    rng = random.Random(seed)
    fr, cands = random_model_batch(rng, 60)
    assert_rank_equals_pp_lite(cands, fr, rng.choice([1, 4, 16]), backend="numpy")


@pytest.mark.parametrize("max_bytes", [40_000, 200_000, None])
def test_rank_chunked_equals_unchunked(max_bytes):
    rng = random.Random(7)
    fr, cands = random_model_batch(rng, 50)
    a = rank(cands, fr, 1, backend="numpy")
    b = assert_rank_equals_pp_lite(cands, fr, 1, backend="numpy", max_bytes=max_bytes)
    assert np.array_equal(a.slowest, b.slowest)


def test_rank_refuses_a_row_wider_than_max_bytes_and_names_a_bucket():
    fr = {"x": [LayerOption("a", 1000, 1, 1), LayerOption("b", 10, 5, 5)]}
    cands = [[Stage([Layers("x", 4)], 3000)]]
    with pytest.raises(ValueError, match="bucket of at least") as err:
        rank(cands, fr, 1, backend="numpy", max_bytes=1000)
    suggested = int(str(err.value).split("bucket of at least ")[1].split()[0])
    r = rank(cands, fr, suggested, backend="numpy", max_bytes=1000)
    assert r.slowest[0] == pp_lite(cands[0], fr, suggested).slowest


def test_permuted_batch_gives_permuted_result():
    rng = random.Random(3)
    fr, cands = random_model_batch(rng, 40)
    a = rank(cands, fr, 4, backend="numpy")
    perm = list(range(len(cands)))
    rng.shuffle(perm)
    b = rank([cands[i] for i in perm], fr, 4, backend="numpy")
    assert np.array_equal(a.slowest[perm], b.slowest)


def test_rank_of_shared_stage_objects_equals_copies_and_pp_lite():
    """PipelineModel.stages reuses Stage objects; rank works on each object once and
    gives exactly what it gives for distinct copies and what pp_lite gives."""
    import dataclasses
    import os

    from gpuknap.formats import load_spec

    model = load_spec(os.path.join(os.path.dirname(__file__), "..", "..", "gpuknap", "examples", "demo.json")).model
    rng = np.random.default_rng(4)
    rows = []
    while len(rows) < 300:
        row = rng.integers(4, 9, size=15).tolist()
        if 1 <= 98 - sum(row) <= 9:
            rows.append(row + [98 - sum(row)])
    shared = [model.stages(r) for r in rows]
    assert shared[0][3] is model.stages(rows[0])[3]
    copies = [[dataclasses.replace(s) for s in c] for c in shared]
    a = rank(shared, model.fronts, backend="numpy")
    b = rank(copies, model.fronts, backend="numpy")
    assert np.array_equal(a.slowest, b.slowest)
    for i in range(0, 300, 37):
        want = pp_lite(shared[i], model.fronts)
        assert a.times(i) == (None if want is None else list(want.times)) == b.times(i)
    bad = [list(c) for c in shared]
    bad[7][2] = Stage([Layers("nope", 1)], 10)
    with pytest.raises(ValueError, match=r"candidates\[7\]\[2\]"):
        rank(bad, model.fronts, backend="numpy")
