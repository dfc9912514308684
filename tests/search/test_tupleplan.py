"""The exact interleaved tables' stage problems built as arrays (search/_tupleplan.py),
against the problems model.stages poses one split at a time and the engine's verdicts,
on bytes and times that are not whole numbers, and on byte counts so large that the
exact sum needs more than 64 bits (the row-by-row fallback)."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
from test_interleaved_search import plans_match_loops

from gpuknap import LayerOption, PipelineModel
from gpuknap.engine import FrontTable, kept_bytes
from gpuknap.search import fastest_prefix, kind_index
from gpuknap.search._interleaved import plan_tuples
from gpuknap.search._tupleplan import _fastest_bytes, _sequential, tuples


def odd_model(rng, p, v, scale, same):
    """A model of H, B..., T whose bytes and times are fractions (``scale``: their size);
    ``same``: the first or the last layer of the middle kind too."""
    def opts(name, n):
        return [LayerOption(f"{name}{j}", rng.random() * scale, rng.random() / 3, rng.random() / 7,
                            rng.random() * scale) for j in range(n)]
    fronts = {"H": opts("h", rng.randint(1, 2)), "B": opts("b", rng.randint(1, 3)), "T": opts("t", rng.randint(1, 2))}
    head, tail = ("B" if same == "head" else "H"), ("B" if same == "tail" else "T")
    kinds = [head] + ["B"] * rng.randint(p * v, 12) + [tail]
    static = {kind: rng.random() * scale for kind in "HBT"}
    if scale == 1e9:  # whole bytes: tuples whose runs merge pose one problem, bit for bit
        static = {kind: float(rng.randint(1, 10**9)) for kind in "HBT"}
    capacity = rng.uniform(4, 12) * scale
    return PipelineModel(kinds, fronts, static, capacity, p * rng.randint(1, 3), rng.random() * scale)


@pytest.mark.parametrize("seed", range(12))
def test_stage_rows_equal_the_problems_posed_one_split_at_a_time(seed):
    rng = random.Random(900 + seed)
    p, v = rng.randint(2, 3), rng.randint(2, 3)
    scale = (1.0, 1e9, 3e18)[seed % 3]  # the last: sums beyond 64 bits once scaled
    model = odd_model(rng, p, v, scale, (None, "head", "tail")[seed // 3 % 3])
    assert plans_match_loops(rng, model, p, v, FrontTable(model.fronts, scale / 64, relaxed=seed % 2 == 1), (1,))


@pytest.mark.parametrize("seed", range(8))
def test_rounds_sharing_a_memo_pose_what_fresh_plans_pose(seed):
    """A search's rounds share one memo (tuples found again by their code, whatever the
    round's cap on layers): each key's time and problem equal those of a plan made afresh."""
    from gpuknap.search._tupleplan import TupleMemo

    rng = random.Random(700 + seed)
    p, v = rng.randint(1, 3), rng.randint(2, 3)
    model = odd_model(rng, p, v, (1.0, 1e9)[seed % 2], None)
    fronts = FrontTable(model.fronts, (1.0, 1e9)[seed % 2] / 64)
    fastest = fastest_prefix(model, fronts, kind_index(model), 1)
    table = model.in_flight_table(p, v)
    memo = TupleMemo()
    for _ in range(5):
        limit = rng.choice([math.inf, float(fastest[-1]) / p, float(fastest[-1]) / (2 * p)])
        most = rng.randint(v, model.layers)
        shared = plan_tuples(model, p, v, table, fronts, limit, fastest, most, memo)
        fresh = plan_tuples(model, p, v, table, fronts, limit, fastest, most)
        assert shared.keys == fresh.keys
        assert shared.time.tobytes() == fresh.time.tobytes()
        values = np.arange(len(fresh.problems), dtype=np.float64)  # stand-in times, one per problem
        by_problem = dict(zip(fresh.problems, values.tolist()))
        got = shared.key_times([by_problem[q] for q in shared.problems])
        assert got.tobytes() == fresh.key_times(values).tobytes()
        assert sorted(map(repr, shared.verdicts)) == sorted(map(repr, fresh.verdicts))


@pytest.mark.parametrize("seed", range(20))
def test_array_sums_equal_the_engine_sums(seed):
    rng = np.random.default_rng(seed)
    runs = int(rng.integers(1, 5))
    matrix = rng.integers(1, 40, size=(200, runs))
    kind = seed % 4
    if kind == 0:
        memories = rng.integers(0, 10**9, size=runs).astype(float).tolist()  # whole bytes
    elif kind == 1:
        memories = (rng.random(runs) * 1e6).tolist()  # fractions
    elif kind == 2:
        memories = (rng.random(runs) * 1e300).tolist()  # beyond 64 bits once scaled: row by row
    else:
        memories = [2.0**-60 * (1 + rng.random()) for _ in range(runs)]  # tiny, many binary places
    got = _fastest_bytes(matrix, memories)
    want = [kept_bytes(zip(row, memories)) for row in matrix.tolist()]
    assert got.tolist() == want
    times = (rng.random(runs) * 10.0 ** rng.integers(-3, 4)).tolist()
    seq = _sequential(matrix, times)
    for row, value in zip(matrix.tolist(), seq.tolist()):
        total = 0.0
        for t, n in zip(times, row):
            for _ in range(n):
                total += t
        assert value == total


def test_tuples_are_every_composition_in_lexicographic_order():
    import itertools

    for chunks, top in ((2, 5), (3, 7), (4, 6)):
        want = [c for c in itertools.product(range(1, top + 1), repeat=chunks) if sum(c) <= top]
        assert tuples(chunks, top).tolist() == [list(c) for c in want]


def test_tuples_whose_runs_merge_pose_one_problem():
    """Both chunks of a middle stage at one in-flight count: a tuple's problem is its
    total alone, so the rows pose one problem per total."""
    from gpuknap.search._tupleplan import StageRows

    option = [LayerOption("x", 3.0, 1.0, 2.0)]
    model = PipelineModel(["H"] + ["B"] * 8 + ["T"], {"H": option, "B": option, "T": option},
                          {"H": 5.0, "B": 7.0, "T": 11.0}, 1000.0, 6)
    rows = tuples(2, 6)
    stage = StageRows(model, 1, 3, 2, [[3, 3], [3, 3], [3, 1]], rows)
    made, into = stage.problems(np.arange(len(rows)))
    assert len(made) == 5 < len(rows)
    for q, total in zip([made[i] for i in into.tolist()], rows.sum(axis=1).tolist()):
        assert q.runs == ((("B", 3), total),) and q.budget == 1000.0 - 7.0 * total
