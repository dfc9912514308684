"""Single-stage solvers against brute force and a plain DP."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    brute_choose,
    ceil_div,
    close,
    dp_stage_time,
    dp_suffix_times,
    opt_time,
)
from strategies import buckets, budgets, fronts, groups

from gpuknap import (
    LayerOption,
    Layers,
    Stage,
    choose,
    least_times,
    pp_lite,
    suffix_times,
)


def weight_of(choice, bucket):
    return sum(a.count * ceil_div(a.option.memory(a.layers.in_flight), bucket) for a in choice.assignments)


def check_choice_shape(choice, gs, budget):
    per_group = {}
    for a in choice.assignments:
        assert a.count > 0
        per_group.setdefault(id(a.layers), []).append(a)
    for g in gs:
        got = per_group.get(id(g), [])
        assert sum(a.count for a in got) == g.count
        times = [opt_time(a.option) for a in got]
        assert times == sorted(times, reverse=True)  # slower options first
    mem = sum(a.count * a.option.memory(a.layers.in_flight) for a in choice.assignments)
    assert math.isclose(choice.memory, mem, rel_tol=1e-12, abs_tol=1e-9)
    assert choice.memory <= budget
    assert close(choice.time, math.fsum(a.count * opt_time(a.option) for a in choice.assignments))


@settings(max_examples=400, deadline=None)
@given(fronts(), groups(), budgets, buckets)
def test_choose_equals_brute_force_exactly(fr, gs, budget, bucket):
    got = choose(gs, fr, budget, bucket)
    want = brute_choose(gs, fr, budget, bucket)
    if want is None:
        assert got is None
        return
    assert got is not None
    check_choice_shape(got, gs, budget)
    assert got.time == want[0]  # dyadic times: every sum is exact
    if want[1] is None:  # all-fastest fits in exact bytes
        assert got.memory == want[2]
    else:
        assert weight_of(got, bucket) == want[1]


@settings(max_examples=200, deadline=None)
@given(fronts(dyadic=False), groups(), budgets, buckets)
def test_choose_float_times_within_tolerance(fr, gs, budget, bucket):
    got = choose(gs, fr, budget, bucket)
    want = brute_choose(gs, fr, budget, bucket)
    assert (got is None) == (want is None)
    if got is not None:
        check_choice_shape(got, gs, budget)
        assert close(got.time, want[0])


@settings(max_examples=200, deadline=None)
@given(fronts(dyadic=False), groups(max_layers=12, max_groups=3), st.integers(0, 400), buckets)
def test_least_times_equals_choose_at_every_room(fr, gs, budget, bucket):
    within = least_times(gs, fr, budget, bucket)
    for room in list(range(-3, budget + 1, max(1, budget // 60))) + [budget]:
        c = choose(gs, fr, room, bucket)
        assert within(room) == (math.inf if c is None else c.time)
    fast = choose(gs, fr, math.inf, bucket)
    assert within(fast.memory) == fast.time
    assert within(fast.memory * 10 + 1e9) == fast.time


@settings(max_examples=150, deadline=None)
@given(fronts(dyadic=False), st.lists(st.sampled_from("abc"), max_size=7), st.integers(1, 4),
       st.data(), buckets)
def test_suffix_times_equal_bucketed_optimum_per_start(fr, kinds, k, data, bucket):
    layers = [Layers(kd, 1, k) for kd in kinds]
    bs = data.draw(st.lists(budgets, min_size=len(layers) + 1, max_size=len(layers) + 1))
    got = suffix_times(layers, fr, bs, bucket)
    want = dp_suffix_times(layers, fr, bs, bucket)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert close(g, w)


def test_suffix_times_has_no_exact_bytes_shortcut():
    fr = {"x": [LayerOption("F", 3, 1, 1), LayerOption("L", 0, 2, 2)]}
    # all-fastest needs 6 bytes and fits a 6-byte budget, but weighs 2 buckets of 4 > 1
    assert suffix_times([Layers("x", 1), Layers("x", 1)], fr, [6, 0, 0], 4)[0] == 6.0
    assert choose([Layers("x", 2)], fr, 6, 4).time == 4.0


@settings(max_examples=100, deadline=None)
@given(fronts(dyadic=False), st.lists(st.tuples(groups(max_layers=14), st.integers(-10, 300)), min_size=1, max_size=4),
       buckets)
def test_pp_lite_matches_plain_dp(fr, stages, bucket):
    stages = [Stage(g, b, 1.5) for g, b in stages]
    got = pp_lite(stages, fr, bucket)
    want = [dp_stage_time(s.groups, fr, s.budget, bucket) for s in stages]
    if any(math.isinf(w) for w in want):
        assert got is None
        return
    assert got is not None
    for t, w in zip(got.times, want):
        assert close(t, w + 1.5)
    assert got.slowest == max(got.times)


def test_dominated_options_are_never_chosen():
    fr = {"x": [LayerOption("good", 2, 1, 1), LayerOption("bad", 3, 2, 2), LayerOption("light", 1, 3, 3)]}
    c = choose([Layers("x", 3)], fr, 4, 1)
    assert {a.option.name for a in c.assignments} <= {"good", "light"}


def test_worked_tie_break_least_weight():
    # two ways to reach time 4: two "mid" layers (weight 4) or fast+slow (weight 5)
    fr = {"x": [LayerOption("slow", 0, 3, 0), LayerOption("mid", 2, 2, 0), LayerOption("fast", 5, 1, 0)]}
    c = choose([Layers("x", 2)], fr, 5, 1)
    assert c.time == 4 and weight_of(c, 1) == 4


def test_zero_layers_and_empty_groups():
    fr = {"x": [LayerOption("o", 1, 1, 1)]}
    assert choose([], fr, 0).time == 0.0
    assert choose([Layers("x", 0)], fr, 0).assignments == ()
    assert choose([Layers("x", 0)], fr, -1) is None


class DuckOption:
    """Not a LayerOption: anything with memory(k), forward_time and backward_time works."""

    def __init__(self, name, per, fwd, bwd):
        self.name, self.per, self.forward_time, self.backward_time = name, per, fwd, bwd

    def memory(self, k):
        return self.per * k + 1


def test_any_option_like_object_works_everywhere():
    from gpuknap import PipelineModel, best_splits, rank
    fr = {"x": [DuckOption("fast", 5, 1, 1), DuckOption("slow", 1, 2, 2)]}
    c = choose([Layers("x", 3, 2)], fr, 20, 1)
    assert c.time == 2 + 4 + 4 and c.memory == 11 + 3 + 3 and {a.option.name for a in c.assignments} == {"fast", "slow"}
    stages = [Stage([Layers("x", 3, 2)], 20), Stage([Layers("x", 2, 1)], 20)]
    assert rank([stages], fr, 1, backend="numpy").choice(0) == pp_lite(stages, fr, 1)
    model = PipelineModel(["x"] * 5, fr, {"x": 1}, 30, 2)
    assert best_splits(model, 2, 1, bucket=1, backend="numpy")[0][2] is not None
    assert set(model.plan([3, 2], bucket=1)) <= {"fast", "slow"}


@given(fronts(), groups(max_layers=12), budgets)
@settings(max_examples=100, deadline=None)
def test_checkpointed_traceback_gives_the_same_choice(fr, gs, budget):
    """Stages whose table of picks is too large keep checkpoints and recompute each
    block's picks: the choice is identical to the one-table traceback."""
    import gpuknap.engine._stage as stage_mod

    want = choose(gs, fr, budget, 1)
    old = stage_mod.traceback_block
    for stride in (1, 2, 3):  # as if the table were too large: blocks of `stride` layers
        stage_mod.traceback_block = lambda steps, width, n_options, bucket, weight=1.0, width_at=None: (min(stride, steps), np.uint8)  # recorded choices, blocks of stride
        try:
            got = choose(gs, fr, budget, 1)
        finally:
            stage_mod.traceback_block = old
        assert got == want


def test_verdicts_kept_on_their_table_equal_fresh_ones(monkeypatch):
    """A verdict kept on a FrontTable is the one computed afresh (each table keeps its own:
    the relaxed table rounds budgets up), and a table keeps at most VERDICTS_KEPT."""
    from gpuknap.engine import FrontTable, _problem

    rng = np.random.default_rng(3)
    monkeypatch.setattr(_problem, "VERDICTS_KEPT", 10)
    fronts = {k: [LayerOption(f"o{i}", float(rng.integers(1, 9)), 1.0 + i, 2.0 + i) for i in range(3)]
              for k in "AB"}
    tables = [FrontTable(fronts, 3.0), FrontTable(fronts, 3.0, relaxed=True)]
    for _ in range(60):
        groups = [Layers(k, int(rng.integers(1, 4)), int(rng.integers(1, 4))) for k in "AB"]
        problem = _problem.canonical(groups, float(rng.integers(0, 60)))
        for table in tables:
            first = _problem.verdict(problem, table)
            assert first == _problem._verdict(problem, table) == _problem.verdict(problem, table)
    assert all(len(table.verdicts) == 10 for table in tables)
