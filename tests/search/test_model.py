"""Model level: stages of a split, model.rank, best_splits against brute force, plans."""
from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuknap import (
    MEGABYTE,
    LayerOption,
    Layers,
    PipelineModel,
    best_splits,
    choose,
    pp_lite,
)
from gpuknap.search import exact_score, score_of
from tie_rule import ranked


def compositions(n, p):
    for cuts in itertools.combinations(range(1, n), p - 1):
        b = (0, *cuts, n)
        yield tuple(b[i + 1] - b[i] for i in range(p))


def random_model(rng, layers, tight):
    kinds_pool = ["head", "dense", "moe", "tail"][: rng.randint(2, 4)]
    fronts, static = {}, {}
    for kd in kinds_pool:
        opts = [LayerOption(f"{kd}{j}", rng.randint(0, 12), rng.randint(1, 9) / 2, rng.randint(0, 12) / 4,
                            rng.randint(0, 4)) for j in range(rng.randint(1, 3))]
        fronts[kd] = opts
        static[kd] = rng.randint(0, 6)
    kinds = [rng.choice(kinds_pool) for _ in range(layers)]
    capacity = rng.randint(40, 90) if tight else 400
    return PipelineModel(kinds, fronts, static, capacity, rng.randint(1, 5), reserved=rng.randint(0, 5))


def brute(model, p, score, bucket):
    found = []
    for counts in compositions(model.layers, p):
        choice = pp_lite(model.stages(counts), model.fronts, bucket)
        if choice is not None:
            found.append((exact_score(choice.times, score, model.micro_batches), choice.times, counts))
    return ranked(found)  # ranked exactly (ties by the documented rule), reported rounded


@pytest.mark.parametrize("seed", range(30))
def test_best_splits_equals_brute_force(seed):
    rng = random.Random(seed)
    model = random_model(rng, rng.randint(4, 14), tight=seed % 2 == 0)
    p = rng.randint(1, min(4, model.layers))
    bucket = rng.choice([1, 2, 5])
    for score in ("slowest", "1f1b"):
        want = brute(model, p, score, bucket)
        for top in (1, 3, 7):
            got = best_splits(model, p, top, score, bucket, backend="numpy")
            assert [(s, c) for c, s, _ in got] == want[:top], (score, top)
            for counts, value, choice in got:
                assert choice == pp_lite(model.stages(counts), model.fronts, bucket)
                assert value == score_of(choice.times, score, model.micro_batches)


def test_infeasible_model_gives_empty_list():
    fr = {"x": [LayerOption("o", 10, 1, 1)]}
    model = PipelineModel(["x"] * 4, fr, {"x": 1}, 5, 2)
    assert best_splits(model, 2, 3, backend="numpy") == []
    assert best_splits(model, 2, 3, "1f1b", backend="numpy") == []


@pytest.mark.parametrize("score", ["slowest", "1f1b"])
@pytest.mark.parametrize("time", [1.0, 0.1])
def test_ties_broken_by_counts_lexicographically(score, time):
    fr = {"x": [LayerOption("o", 0, time, 0)]}
    model = PipelineModel(["x"] * 9, fr, {"x": 0}, 100, 3)
    got = best_splits(model, 4, 12, score, backend="numpy")
    assert [(s, c) for c, s, _ in got] == brute(model, 4, score, MEGABYTE)[:12]


@pytest.mark.parametrize("seed", range(8))
def test_model_rank_equals_pp_lite_per_row(seed):
    rng = random.Random(seed)
    model = random_model(rng, rng.randint(5, 30), tight=seed % 2 == 0)
    p = rng.randint(1, min(5, model.layers))
    rows = [rng.choice(list(compositions(model.layers, p))) for _ in range(60)]
    r = model.rank(np.array(rows), 2, backend="numpy")
    for i, row in enumerate(rows):
        want = pp_lite(model.stages(row), model.fronts, 2)
        assert r.slowest[i] == (math.inf if want is None else want.slowest)
        assert r.choice(i) == want


def test_model_rank_rejects_bad_rows_with_row_number():
    model = PipelineModel(["x"] * 4, {"x": [LayerOption("o", 1, 1, 1)]}, {"x": 0}, 100, 2)
    with pytest.raises(ValueError, match="row 1 has a count < 1"):
        model.rank([[2, 2], [4, 0]], backend="numpy")
    with pytest.raises(ValueError, match="row 2 sums to 5"):
        model.rank([[2, 2], [1, 3], [2, 3]], backend="numpy")
    with pytest.raises(ValueError, match="2-D"):
        model.rank([4], backend="numpy")


def test_stages_follow_1f1b_and_first_appearance():
    fr = {k: [LayerOption("o", 1, 1, 1)] for k in "abc"}
    model = PipelineModel(list("aabcb" "ca"), fr, {"a": 1, "b": 2, "c": 3}, 100, 2, reserved=10)
    st = model.stages([3, 4])
    assert st[0].groups == (Layers("a", 2, 2), Layers("b", 1, 2))
    assert st[1].groups == (Layers("c", 2, 1), Layers("b", 1, 1), Layers("a", 1, 1))
    assert st[0].budget == 100 - 10 - (2 * 1 + 2)
    assert st[1].budget == 100 - 10 - (2 * 3 + 2 + 1)


def test_interleaved_stages_and_plan():
    fr = {"x": [LayerOption("heavy", 4, 1, 1), LayerOption("light", 1, 2, 2)]}
    model = PipelineModel(["x"] * 8, fr, {"x": 1}, 30, 4)
    # Megatron's interleaved schedule, P=2, v=2, M=4, worked by hand: stage 0 warms up with 4 forwards
    # (mb 0, 1 on chunk 0, then on chunk 1) and peaks at 4 on chunk 0 and 2 on chunk 1; stage 1
    # warms up with 2 (chunk 0) and peaks at 3 on chunk 0 and 1 on chunk 1.
    default = model.stages([2, 2, 2, 2], chunks=2)
    assert [[g.in_flight for g in st.groups] for st in default] == [[4, 2], [3, 1]]
    st = model.stages([1, 2, 3, 2], in_flight=[[3, 2], [2, 1]], chunks=2)
    assert st[0].groups == (Layers("x", 1, 3), Layers("x", 3, 2))
    assert st[1].groups == (Layers("x", 2, 2), Layers("x", 2, 1))
    assert st[0].budget == 30 - 4
    plan = model.plan([1, 2, 3, 2], bucket=1, in_flight=[[3, 2], [2, 1]], chunks=2)
    assert len(plan) == 8 and set(plan) <= {"heavy", "light"}
    r = model.rank([[1, 2, 3, 2]], 1, in_flight=[[3, 2], [2, 1]], chunks=2, backend="numpy")
    assert r.slowest[0] == pp_lite(st, fr, 1).slowest


def test_plan_lists_options_in_model_order_slowest_first():
    fr = {"x": [LayerOption("fast", 5, 1, 0), LayerOption("slow", 1, 3, 0)], "y": [LayerOption("y", 0, 1, 0)]}
    model = PipelineModel(["y", "x", "x", "x"], fr, {"x": 0, "y": 0}, 11, 1)
    plan = model.plan([4], bucket=1)
    assert plan[0] == "y"
    assert plan[1:] == ["slow", "fast", "fast"]  # 2 fast (10) + 1 slow (1) = 11 bytes


def test_best_splits_refuses_a_search_too_large_before_allocating():
    fr = {"x": [LayerOption("o", 0, 1, 1)]}
    model = PipelineModel(["x"] * 5000, fr, {"x": 0}, 10**12, 8)
    with pytest.raises(ValueError, match="segments"):
        best_splits(model, 8, backend="numpy")


def test_best_splits_on_a_long_model_agrees_with_rank():
    rng = random.Random(5)
    fr = {"x": [LayerOption("a", 8, 1, 1), LayerOption("b", 2, 2, 1.5)], "y": [LayerOption("c", 3, 1, 0)]}
    kinds = [rng.choice("xy") for _ in range(400)]
    model = PipelineModel(kinds, fr, {"x": 2, "y": 1}, 700, 6)
    got = best_splits(model, 6, 3, "1f1b", 4, backend="numpy")
    assert len(got) == 3
    r = model.rank(np.array([c for c, _, _ in got]), 4, backend="numpy")
    for i, (counts, value, choice) in enumerate(got):
        assert r.choice(i) == choice
        assert value == score_of(choice.times, "1f1b", 6)
    # no random split beats the reported best
    cuts = np.sort(np.array([rng.sample(range(1, 400), 5) for _ in range(3000)]), axis=1)
    rows = np.diff(np.concatenate([np.zeros((3000, 1), int), cuts, np.full((3000, 1), 400)], axis=1), axis=1)
    rr = model.rank(rows, 4, backend="numpy")
    ok = np.isfinite(rr.slowest)
    scores = [score_of(rr.times(i), "1f1b", 6) for i in np.flatnonzero(ok)]
    assert not scores or min(scores) >= got[0][1]


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_classification_equals_per_segment_problems(seed):
    """classify() gives every segment exactly the canonical problem the per-segment path builds
    (kinds in first-appearance order, the same budget bits), and equal problems share an id."""
    from gpuknap.engine import canonical
    from gpuknap.search import classify, kind_index

    rng = random.Random(seed)
    model = random_model(rng, rng.randint(1, 40), tight=seed % 2 == 0)
    n = model.layers
    starts, ends, ks = [], [], []
    for _ in range(300):
        a = rng.randint(0, n - 1)
        starts.append(a)
        ends.append(rng.randint(a + 1, n))
        ks.append(rng.randint(1, 6))
    ids, problems = classify(model, kind_index(model), np.array(ks), np.array(starts), np.array(ends))
    seen = {}
    for i, (a, b, k) in enumerate(zip(starts, ends, ks)):
        groups = model.segment_groups(a, b, k)
        want = canonical(groups, model.budget_of(groups))
        assert problems[ids[i]] == want
        assert seen.setdefault(want, ids[i]) == ids[i]
    assert len(problems) == len(seen)


@pytest.mark.parametrize("seed", range(12))
def test_coverage_proves_infeasibility_only_when_brute_force_agrees(seed):
    from gpuknap.search import coverage

    rng = random.Random(100 + seed)
    model = random_model(rng, rng.randint(3, 12), tight=True)
    p = rng.randint(1, min(4, model.layers))
    held = coverage(model, p, 1)
    feasible = brute(model, p, "slowest", 1)
    assert held <= model.layers
    if held < model.layers:
        assert feasible == []
    assert best_splits(model, p, 1, "slowest", 1, backend="numpy") == [] or held == model.layers


@given(st.lists(st.lists(st.integers(0, 2**75), min_size=1, max_size=5), min_size=1, max_size=4).filter(
    lambda rows: len({len(r) for r in rows}) == 1), st.data())
@settings(max_examples=200, deadline=None)
def test_two_limb_integers_are_exact(rows, data):
    from gpuknap.search._closed_form import LIMB, MASK, Wide

    other = [[data.draw(st.integers(0, 2**75)) for _ in r] for r in rows]

    def wide(values):
        hi = np.array([[v >> LIMB for v in r] for r in values], dtype=np.int64)
        lo = np.array([[v & MASK for v in r] for r in values], dtype=np.int64)
        return Wide(hi, lo, 1 << 61)

    a, b = wide(rows), wide(other)
    total = a + b
    for i, r in enumerate(rows):
        assert [total.value(i, j) for j in range(len(r))] == [x + y for x, y in zip(r, other[i])]
        assert a.min_rows().value(i) == min(r)
        assert [a.minimum(b).value(i, j) for j in range(len(r))] == [min(x, y) for x, y in zip(r, other[i])]
    assert (a.where(np.zeros(a.hi.shape, dtype=bool))).value(0, 0) is None


def test_1f1b_exact_with_times_across_hundreds_of_binary_orders():
    """Times of 1e-200 next to 1.0 need integers far beyond two limbs: the search stays exact."""
    fr = {"x": [LayerOption("a", 3, 1e-200, 0.0), LayerOption("b", 1, 0.3, 1.7)],
          "y": [LayerOption("c", 2, 0.1, 0.2)]}
    model = PipelineModel(["x", "y", "x", "x", "y", "x", "y"], fr, {"x": 1, "y": 1}, 14, 3)
    for p in (2, 3):
        want = brute(model, p, "1f1b", 1)
        got = best_splits(model, p, 5, "1f1b", 1, backend="numpy")
        assert [(s, c) for c, s, _ in got] == want[:5]


def exact_bytes_stage(groups, fronts, budget):
    """Least time of a stage with memory counted in exact bytes (no buckets), by brute force."""
    layers = [(g.kind, g.in_flight) for g in groups for _ in range(g.count)]
    best = math.inf
    for combo in itertools.product(*[fronts[kd] for kd, _ in layers]):
        if sum(o.memory(k) for o, (_, k) in zip(combo, layers)) <= budget:
            best = min(best, math.fsum(o.forward_time + o.backward_time for o in combo))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_bound_never_exceeds_the_exact_bytes_optimum(seed):
    rng = random.Random(500 + seed)
    model = random_model(rng, rng.randint(3, 9), tight=True)
    p = rng.randint(1, min(3, model.layers))
    bucket = rng.choice([2, 3, 5])
    for score in ("slowest", "1f1b"):
        exact = []
        for counts in compositions(model.layers, p):
            times = [exact_bytes_stage(st.groups, model.fronts, st.budget) for st in model.stages(counts)]
            if all(map(math.isfinite, times)):
                exact.append(float(exact_score(times, score, model.micro_batches)))
        exact.sort()
        got = best_splits(model, p, 4, score, bucket, backend="numpy", bound=True)
        for i, (counts, value, choice, lower) in enumerate(got):
            assert lower <= value
            assert lower <= exact[i] * (1 + 1e-12)  # the i-th best with exact bytes scores at least this
        for stage in model.stages(got[0][0]) if got else []:
            c = choose(stage.groups, model.fronts, stage.budget, bucket, bound=True)
            if c is not None:
                assert c.lower_bound <= exact_bytes_stage(stage.groups, model.fronts, stage.budget) * (1 + 1e-12)
                assert c.lower_bound <= c.time


@pytest.mark.parametrize("seed", range(8))
def test_bound_equals_the_result_when_the_bucket_divides_everything(seed):
    rng = random.Random(900 + seed)
    model = random_model(rng, rng.randint(3, 12), tight=seed % 2 == 0)  # integer bytes
    p = rng.randint(1, min(4, model.layers))
    for score in ("slowest", "1f1b"):
        for counts, value, choice, lower in best_splits(model, p, 3, score, 1, backend="numpy", bound=True):
            assert lower == value
        for stage in model.stages(list(compositions(model.layers, p))[0]):
            c = choose(stage.groups, model.fronts, stage.budget, 1, bound=True)
            assert c is None or c.lower_bound == c.time


@pytest.mark.parametrize("seed", range(10))
def test_interleaved_model_rank_equals_pp_lite_per_row(seed):
    rng = random.Random(1300 + seed)
    model = random_model(rng, rng.randint(6, 16), tight=seed % 2 == 0)
    v = rng.choice([2, 3])
    p = rng.randint(1, max(1, min(3, model.layers // v)))
    in_flight = [[rng.randint(1, 4) for _ in range(v)] for _ in range(p)]
    rows = [rng.choice(list(compositions(model.layers, p * v))) for _ in range(40)]
    r = model.rank(rows, 1, backend="numpy", in_flight=in_flight, chunks=v)
    for i, row in enumerate(rows):
        want = pp_lite(model.stages(row, in_flight, v), model.fronts, 1)
        assert r.slowest[i] == (math.inf if want is None else want.slowest)
        assert r.times(i) == (None if want is None else list(want.times))
        assert r.choice(i) == want


@pytest.mark.parametrize("seed", range(16))
def test_exclusive_options_never_share_a_stage_and_the_search_stays_exact(seed):
    """best_splits(exclusive=[("SLCT", "COMM")]) equals brute force over every split where
    each stage is the better of its choices without SLCT and without COMM."""
    rng = random.Random(2000 + seed)
    names = ["NONE", "SLCT", "COMM", "BOTH", "FULL"]
    fr = {kd: [LayerOption(n, rng.randint(0, 12), rng.randint(1, 9) / 2, rng.randint(0, 12) / 4)
               for n in rng.sample(names, rng.randint(2, 5))] for kd in ("a", "b")}
    model = PipelineModel([rng.choice("ab") for _ in range(rng.randint(3, 9))], fr,
                          {"a": rng.randint(0, 4), "b": rng.randint(0, 4)}, rng.randint(30, 80), rng.randint(1, 4))
    p = rng.randint(1, min(3, model.layers))
    if not {"SLCT", "COMM"} <= {o.name for v in model.fronts.values() for o in v}:  # a name it lacks: refused
        with pytest.raises(ValueError, match="exclusive: unknown option name"):
            best_splits(model, p, 3, "slowest", 1, backend="numpy", exclusive=[("SLCT", "COMM")])
        return
    without = [{k: [o for o in v if o.name != drop] for k, v in fr.items()} for drop in ("SLCT", "COMM")]
    for score in ("slowest", "1f1b"):
        found = []
        for counts in compositions(model.layers, p):
            times = []
            for stage in model.stages(counts):
                ts = [pp_lite([stage], f, 1) for f in without if all(f.values())]
                ts = [c.times[0] for c in ts if c is not None]
                times.append(min(ts) if ts else math.inf)
            if all(map(math.isfinite, times)):
                found.append((exact_score(times, score, model.micro_batches), times, counts))
        want = ranked(found)[:3]
        got = best_splits(model, p, 3, score, 1, backend="numpy", exclusive=[("SLCT", "COMM")])
        assert [(s, c) for c, s, _ in got] == want
        for _, _, choice in got:
            for sc in choice.stages:
                used = {a.option.name for a in sc.assignments}
                assert not {"SLCT", "COMM"} <= used


@pytest.mark.parametrize("seed", range(16))
def test_pruned_search_equals_the_whole_table(seed, monkeypatch):
    """best_splits solves only segments whose fastest options fit a rising limit and
    stops once its top k are certified: the same top k (scores, counts, plans) as a
    search over every segment, on models where the first limit is often too low."""
    import gpuknap.search._plain as search_mod

    rng = random.Random(1000 + seed)
    model = random_model(rng, rng.randint(16, 40), tight=seed % 2 == 0)
    p = rng.randint(2, min(8, model.layers))
    calls = []
    real = search_mod.plan_segments

    def recording(*args):
        table = real(*args)
        calls.append((args[4], table.pruned))  # args[4]: the limit
        return table

    for score in ("slowest", "1f1b"):
        for top in (1, 5, 40):
            monkeypatch.setattr(search_mod, "plan_segments", recording)
            got = best_splits(model, p, top, score, 1, backend="numpy", bound=True)
            monkeypatch.setattr(search_mod, "plan_segments", lambda *a: real(*a[:4], math.inf, *a[5:]))
            want = best_splits(model, p, top, score, 1, backend="numpy", bound=True)
            assert got == want, (score, top)
    if seed % 2:  # roomy devices: the limit, not memory, leaves segments out
        assert any(pruned for _, pruned in calls)


def test_pruned_search_takes_more_rounds_when_memory_forces_slow_options():
    """Stages whose memory forces the slowest options score far above the fastest-options
    bound: the first limit certifies nothing, later ones do, and the answer is exact."""
    import gpuknap.search._plain as search_mod

    fronts = {"L": [LayerOption("slow", 1, 30.0, 0.0), LayerOption("fast", 40, 1.0, 0.0)]}
    model = PipelineModel(["L"] * 24, fronts, {"L": 0}, 200, 8)
    limits = []
    real = search_mod.plan_segments

    def recording(*args):
        limits.append(args[4])
        return real(*args)

    search_mod.plan_segments, old = recording, search_mod.plan_segments
    try:
        got = best_splits(model, 4, 3, "slowest", 1, backend="numpy")
    finally:
        search_mod.plan_segments = old
    assert len(limits) > 1
    want = brute(model, 4, "slowest", 1)[:3]
    assert [(s, c) for c, s, _ in got] == want


def test_problems_solved_in_an_earlier_round_are_taken_from_known():
    """solve_problems(..., known=): problems in ``known`` are not solved again (a planted
    value comes back), the others are solved as without it and added to it."""
    from gpuknap.engine import FrontTable, Solved, solve_problems
    from gpuknap.search import plan_segments

    rng = random.Random(5)
    model = random_model(rng, 20, tight=False)
    fronts = FrontTable(model.fronts, 1)
    plan = plan_segments(model, 3, fronts)
    assert len(plan.problems) > 10
    want = solve_problems(plan.problems, fronts, "numpy", None, plan.verdicts)
    known = Solved()
    half = len(plan.problems) // 2
    first = solve_problems(plan.problems[:half], fronts, "numpy", None, plan.verdicts[:half], known)
    assert len(known) == half and np.array_equal(first, want[:half])
    planted = plan.problems[0]
    known.times()[planted] = -1.0
    again = solve_problems(plan.problems, fronts, "numpy", None, plan.verdicts, known)
    assert again[0] == -1.0 and np.array_equal(again[1:], want[1:])
    assert len(known) == len(plan.problems)


def test_pruned_search_bounds_use_every_variants_fastest_option(monkeypatch):
    """With exclusive options the table is the least over variants, some of which lack the
    fastest option: the certificate must use the model's own fastest times, else splits
    are certified against a bound they do not have (this model failed so)."""
    import gpuknap.search._plain as search_mod

    fr = {"a": [LayerOption("NONE", 6, 3.0, 3.0), LayerOption("SLCT", 8, 0.5, 0.5), LayerOption("COMM", 3, 2.0, 3.0)]}
    model = PipelineModel(["a"] * 18, fr, {"a": 1}, 58, 3)
    got = best_splits(model, 4, 3, "1f1b", 1, backend="numpy", exclusive=[("SLCT", "COMM")])
    real = search_mod.plan_segments
    monkeypatch.setattr(search_mod, "plan_segments", lambda *a: real(*a[:4], math.inf, *a[5:]))
    want = best_splits(model, 4, 3, "1f1b", 1, backend="numpy", exclusive=[("SLCT", "COMM")])
    assert [(c, s) for c, s, _ in got] == [(c, s) for c, s, _ in want]


@pytest.mark.parametrize("seed", range(24))
def test_exclusive_options_against_brute_force_when_one_variant_cannot_cover(seed):
    """Exclusive options with kinds that lose their only light option in a variant: that
    variant alone cannot hold the model, yet its stages still count for the stages that
    fit it.  Every score against brute force over every split, each stage the fastest
    of the variants whose options cover its kinds."""
    from gpuknap.schedule import iteration_times, stage_forward_backward

    rng = random.Random(3000 + seed)
    fr = {"a": [LayerOption("NONE", rng.randint(4, 9), 2.0, 2.0), LayerOption("SLCT", 1, 2.5, 2.5)],
          "b": [LayerOption("NONE", rng.randint(4, 9), 1.5, 3.0), LayerOption("COMM", 1, 2.0, 3.5)]}
    if seed % 3 == 0:
        fr["b"] = [LayerOption("COMM", 2, 1.0, 2.0)]  # b runs COMM only: without COMM it cannot run at all
    model = PipelineModel([rng.choice("ab") for _ in range(rng.randint(6, 11))], fr, {"a": 1, "b": 1},
                          rng.randint(20, 45), rng.randint(2, 5))
    p = rng.randint(2, min(4, model.layers))
    without = [{k: [o for o in v if o.name != drop] for k, v in fr.items()} for drop in ("SLCT", "COMM")]
    m = model.micro_batches
    found = {"slowest": [], "1f1b": [], "simulated": []}
    for counts in compositions(model.layers, p):
        times, fb = [], []
        bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
        for s, stage in enumerate(model.stages(counts)):
            solved = [pp_lite([stage], f, 1) for f in without if all(f[g.kind] for g in stage.groups)]
            solved = [c for c in solved if c is not None]
            if not solved:
                break
            best = min(solved, key=lambda c: c.times[0])
            times.append(best.times[0])
            fb.append(stage_forward_backward(model, bounds[s], bounds[s + 1], best.stages[0]))
        else:
            for score in ("slowest", "1f1b"):
                found[score].append((exact_score(times, score, m), times, counts))
            sim = iteration_times(np.array([[[f] for f, _ in fb]]), np.array([[[b] for _, b in fb]]), m)[0]
            found["simulated"].append((sim, times, counts))
    for score, entries in found.items():
        want = ranked(entries)[:3]
        got = best_splits(model, p, 3, score, 1, backend="numpy", exclusive=[("SLCT", "COMM")])
        assert [(s, c) for c, s, _ in got] == want, score


@pytest.mark.parametrize("scale", [3, 10**6, 2**40])
def test_unique_rows_numbers_rows_as_np_unique_does(scale):
    """The packed unique of classify (dense table, 1-D unique, whole rows past 62 bits): each
    row's number and a representative of each number, as ``np.unique(axis=0)`` gives them."""
    from gpuknap.search._classify import _unique_rows

    rng = np.random.default_rng(scale % 1000)
    rows = rng.integers(0, scale, size=(500, 4), dtype=np.int64)
    rows[250:] = rows[rng.integers(0, 250, size=250)]  # repeats
    first, inverse = _unique_rows(rows)
    want, want_inverse = np.unique(rows, axis=0, return_inverse=True)
    assert np.array_equal(rows[first], want) and np.array_equal(inverse, want_inverse.ravel())
