"""The pipeline schedule simulator against closed forms, the contract's in-flight table and its own rules."""
from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuknap.schedule import in_flight_table, order, simulate


@pytest.mark.parametrize("p, m", [(1, 1), (1, 5), (4, 4), (4, 9), (8, 3), (6, 32)])
def test_equal_stages_take_m_plus_p_minus_one_rounds(p, m):
    t = simulate([[1.25]] * p, [[2.5]] * p, m)
    assert math.isclose(t.iteration_time, (m + p - 1) * 3.75, rel_tol=1e-12)
    assert math.isclose(t.bubble, (p - 1) / (m + p - 1), rel_tol=1e-12)


@pytest.mark.parametrize("p, m", [(1, 3), (4, 2), (4, 8), (16, 32), (7, 5)])
def test_plain_1f1b_keeps_the_contracts_in_flight_counts(p, m):
    assert in_flight_table(p, 1, m) == [[min(p - s, m)] for s in range(p)]


def test_interleaved_with_one_chunk_is_plain_1f1b():
    rng = random.Random(3)
    for _ in range(20):
        p, m = rng.randint(1, 6), rng.randint(1, 12)
        f = [[rng.uniform(0.5, 2)] for _ in range(p)]
        b = [[x[0] * 2.1] for x in f]
        assert simulate(f, b, m, "interleaved") == simulate(f, b, m, "1f1b")


def test_the_closed_form_1f1b_score_is_never_below_the_simulation():
    """Without p2p time, (M - 1) * slowest + sum of stage times was an upper bound in every case
    tried; the largest overestimate is reported in docs/schedule.md."""
    rng = random.Random(0)
    worst = 0.0
    for _ in range(600):
        p, m = rng.randint(1, 8), rng.randint(1, 32)
        f = [rng.uniform(0.5, 2.0) for _ in range(p)]
        b = [x * rng.uniform(1.5, 3.0) for x in f]
        sim = simulate([[x] for x in f], [[x] for x in b], m).iteration_time
        times = [x + y for x, y in zip(f, b)]
        closed = (m - 1) * max(times) + sum(times)
        assert closed >= sim * (1 - 1e-12)
        worst = max(worst, closed / sim - 1)
    assert worst < 0.25


def test_interleaving_shrinks_the_bubble_of_equal_stages():
    p, m = 4, 8
    plain = simulate([[2.0]] * p, [[4.0]] * p, m)
    inter = simulate([[1.0, 1.0]] * p, [[2.0, 2.0]] * p, m, "interleaved")
    assert inter.iteration_time < plain.iteration_time and inter.bubble < plain.bubble
    assert sum(op.end - op.start for op in inter.ops) == pytest.approx(sum(op.end - op.start for op in plain.ops))


def test_interleaved_needs_micro_batches_divisible_by_stages():
    for schedule in ("interleaved", "interleaved-legacy"):
        with pytest.raises(ValueError, match="multiple of stages"):
            order(schedule, 4, 2, 6)
    for m, near in ((6, "4 or 8 would do"), (3, "4 would do"), (9, "8 or 12 would do")):  # the nearest that do
        with pytest.raises(ValueError, match=near):
            order("interleaved", 4, 2, m)


@pytest.mark.parametrize("bad", [{"forward": []}, {"forward": [[1.0], [1.0, 2.0]]}, {"forward": [[-1.0]]},
                                 {"forward": [[math.nan]]}, {"micro_batches": 0}, {"p2p": -1},
                                 {"schedule": "gpipe"}])
def test_bad_arguments_raise_value_error(bad):
    args = {"forward": [[1.0]], "backward": [[2.0]], "micro_batches": 2, "schedule": "1f1b", "p2p": 0.0, **bad}
    if "forward" in bad and bad["forward"] and len(bad["forward"]) == 2:
        args["backward"] = [[2.0], [2.0, 1.0]]
    with pytest.raises(ValueError):
        simulate(**args)


@st.composite
def cases(draw):
    p = draw(st.integers(1, 5))
    v = draw(st.integers(1, 3))
    m = p * draw(st.integers(1, 4)) if v > 1 else draw(st.integers(1, 10))
    times = st.floats(0.0, 5.0, allow_nan=False)
    f = [[draw(times) for _ in range(v)] for _ in range(p)]
    b = [[draw(times) for _ in range(v)] for _ in range(p)]
    return f, b, m, ("interleaved" if v > 1 else draw(st.sampled_from(["1f1b", "interleaved"]))), draw(
        st.sampled_from([0.0, 0.5]))


@given(cases())
@settings(max_examples=200, deadline=None)
def test_every_operation_waits_for_its_input_and_stages_run_one_at_a_time(case):
    f, b, m, schedule, p2p = case
    t = simulate(f, b, m, schedule, p2p)
    p, v = len(f), len(f[0])
    assert len(t.ops) == 2 * p * v * m
    end = {(op.kind, op.chunk * p + op.stage, op.micro_batch): op for op in t.ops}
    assert len(end) == len(t.ops)  # every operation exactly once
    for op in t.ops:
        vs = op.chunk * p + op.stage
        want = f[op.stage][op.chunk] if op.kind == "F" else b[op.stage][op.chunk]
        assert math.isclose(op.end - op.start, want, abs_tol=1e-9)
        if op.kind == "F" and vs > 0:
            assert op.start >= end[("F", vs - 1, op.micro_batch)].end + p2p - 1e-9
        if op.kind == "B":
            dep = end[("B", vs + 1, op.micro_batch)] if vs < p * v - 1 else end[("F", vs, op.micro_batch)]
            assert op.start >= dep.end + (p2p if vs < p * v - 1 else 0) - 1e-9
    for s in range(p):
        mine = sorted((op.start, op.end) for op in t.ops if op.stage == s)
        assert all(a[1] <= b_[0] + 1e-9 for a, b_ in zip(mine, mine[1:]))
    assert 0 <= t.bubble <= 1
