"""best_splits(..., interleave=v): the exact search on HEAD / BODY / TAIL models and the
local search on other models, against brute force over every interleaved split."""
from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from test_model import compositions
from tie_rule import tie_rule

from gpuknap import LayerOption, PipelineModel, best_splits
from gpuknap.engine import Planner


def shape_model(rng, body_layers, p, tight):
    opts = lambda name, n: [LayerOption(f"{name}{j}", rng.randint(1, 9), rng.randint(1, 9) / 2,
                                        rng.randint(0, 12) / 4, rng.randint(0, 3)) for j in range(n)]
    fronts = {"H": opts("h", 1), "B": opts("b", rng.randint(1, 3)), "T": opts("t", rng.randint(1, 2))}
    kinds = ["H"] + ["B"] * body_layers + ["T"]
    capacity = rng.randint(60, 140) if tight else 2000
    return PipelineModel(kinds, fronts, {"H": 2, "B": 1, "T": 3}, capacity, p * rng.randint(1, 3), rng.randint(0, 4))


def score(times, kind, m, v):
    if kind == "slowest":
        return max(times)
    return ((v * m - 1) * max(times) + sum(times)) / v


def brute(model, p, v, kind):
    """Every split's stage times from model.stages (real positions); per (stage, total)
    the fastest tuple (then most even, then first); per-stage totals ranked."""
    plan = Planner(model.fronts, 1)
    best_tuple, every = {}, []
    for counts in compositions(model.layers, p * v):
        times = []
        for s, st in enumerate(model.stages(counts, None, v)):
            c = plan.stage(st)
            t = math.inf if c is None else c.time + st.fixed_time
            times.append(t)
            tup = tuple(counts[c_ * p + s] for c_ in range(v))
            key = (t, max(tup) - min(tup), tup)
            if math.isfinite(t) and key < best_tuple.get((s, sum(tup)), (math.inf,)):
                best_tuple[(s, sum(tup))] = key
        if all(map(math.isfinite, times)):
            every.append(score(times, kind, model.micro_batches, v))
    ranked = []
    for totals in compositions(model.layers, p):
        keys = [best_tuple.get((s, m)) for s, m in enumerate(totals)]
        if None in keys:
            continue
        counts = tuple(keys[s][2][c] for c in range(v) for s in range(p))
        times = [k[0] for k in keys]
        value = score(times, kind, model.micro_batches, v)
        ranked.append((tie_rule(value, times, totals), value, totals, counts))
    ranked.sort(key=lambda e: e[0])  # ties by the documented rule on the per-stage totals
    return [e[1:] for e in ranked], min(every, default=None)


@pytest.mark.parametrize("seed", range(14))
def test_exact_interleaved_search_equals_brute_force(seed):
    rng = random.Random(seed)
    p = rng.randint(1, 3)
    v = rng.choice([2, 3])
    model = shape_model(rng, rng.randint(10, 14 if p * v <= 6 else 12), p, tight=seed % 2 == 0)
    for kind in ("slowest", "1f1b"):
        ranked, optimum = brute(model, p, v, kind)
        for top in (1, 4):
            got = best_splits(model, p, top, kind, 1, backend="numpy", interleave=v)
            assert got.exact
            assert [c for c, _, _ in got] == [c for _, _, c in ranked[:top]], (kind, top)
            assert [s for _, s, _ in got] == pytest.approx([s for s, _, _ in ranked[:top]], rel=1e-12)
            if got:  # the best over every interleaved split, not only the representatives
                assert got[0][1] == pytest.approx(optimum, rel=1e-12)
                assert got.lower_bound == got[0][1]
            else:
                assert optimum is None


def hetero_model(rng, layers, p):
    fronts = {k: [LayerOption(f"{k}{j}", rng.randint(1, 8), rng.randint(1, 9) / 2, rng.randint(0, 8) / 4,
                              rng.randint(0, 3)) for j in range(rng.randint(1, 3))] for k in "xyz"}
    kinds = [rng.choice("xyz") for _ in range(layers)]
    return PipelineModel(kinds, fronts, {"x": 1, "y": 2, "z": 0}, rng.randint(80, 200), p * 2, 0)


def test_local_search_is_never_empty_and_within_five_percent():
    """Heterogeneous models: whenever some interleaved split fits, the local search returns
    splits (it moves infeasible starts towards fitting ones); its best is within 5% of the
    brute-force optimum, never below it, never worse than the best plain split of v * P
    stages placed round-robin, at or above its lower bound; every score exact."""
    cases = hits = 0
    for seed in range(40):
        rng = random.Random(100 + seed)
        p, v = rng.choice([(2, 2), (2, 3), (3, 2)])
        model = hetero_model(rng, rng.randint(10, 12), p)
        all_splits = np.array(list(compositions(model.layers, p * v)))
        times = model.rank(all_splits, 1, "numpy", None, v).stage_table()
        for score in ("slowest", "1f1b"):
            got = best_splits(model, p, 3, score, 1, backend="numpy", interleave=v)
            assert not got.exact
            values = [score_of_times(row, score, model.micro_batches, v) for row in times]
            optimum = min(values)
            if not math.isfinite(optimum):
                assert got == []
                continue
            cases += 1
            assert got, (seed, score)
            assert got.lower_bound <= optimum <= got[0][1] <= 1.05 * optimum, (seed, score)
            plain = best_splits(model, p * v, 1, "slowest", 1, backend="numpy")
            if plain and score == "slowest":
                rr = model.rank(np.array([plain[0][0]]), 1, "numpy", None, v).slowest[0]
                assert got[0][1] <= rr
            for counts, value, choice in got:  # every score exact for its split
                row = model.rank(np.array([counts]), 1, "numpy", None, v).stage_table()[0]
                assert value == pytest.approx(score_of_times(row, score, model.micro_batches, v), rel=1e-12)
            hits += got[0][1] == optimum
    assert cases >= 40
    print(f"local search found the optimum in {hits} of {cases} cases")


def score_of_times(times, kind, m, v):
    return max(times) if kind == "slowest" else score(times, kind, m, v)


def test_interleaved_refuses_what_it_does_not_do():
    model = PipelineModel(["a"] * 8, {"a": [LayerOption("x", 1, 1.0, 1.0)]}, {"a": 0}, 100, 4)
    for kwargs, words in ((dict(bound=True), "bound"),
                          (dict(interleave=0), "interleave")):
        with pytest.raises(ValueError, match=words):
            best_splits(model, 2, **{"interleave": 2, **kwargs})
    with pytest.raises(ValueError, match="at least"):
        best_splits(model, 4, interleave=3)


def plan_by_loops(model, p, chunks, table, limit, fastest, most):
    """The reference of plan_tuples: every tuple by itertools, its bound by a Python sum,
    its problem from model.stages at real positions (canonical, as the solvers see it)."""
    import itertools

    from gpuknap.engine import canonical

    n, last = model.layers, chunks * p - 1
    top = max(min(most, n - chunks * (p - 1)), chunks)
    keys, posed, pruned = [], {}, False
    for s in range(p):
        for counts in itertools.product(range(1, top - chunks + 2), repeat=chunks):
            if sum(counts) > top:
                continue
            low = 0.0
            for c, count in enumerate(counts):
                i = c * p + s
                a = 0 if i == 0 else n - count if i == last else 1
                low += float(fastest[a + count] - fastest[a])
            if low > limit + 1e-9 * (abs(limit) + fastest[-1]):
                pruned = True
                continue
            keys.append((s, sum(counts), counts))
            split = [1] * (p * chunks)  # the stage's tuple at its real positions, the rest filled around it
            for c, count in enumerate(counts):
                split[c * p + s] = count
            spare = n - sum(split)
            if spare < 0:
                continue
            other = next(j for j in range(p * chunks) if j % p != s) if p > 1 else None
            if other is None and spare:
                continue
            if other is not None:
                split[other] += spare
            st = model.stages(split, None, chunks)[s]
            posed[keys[-1]] = canonical(st.groups, st.budget)
    return keys, posed, pruned


@pytest.mark.parametrize("seed", range(10))
def test_tuple_plans_equal_the_loops_they_replace(seed):
    """plan_tuples enumerates tuples and bounds them with arrays: the same tuples, pruning
    flag and problems (the ones model.stages poses at real positions) as plain loops."""
    from gpuknap.engine import FrontTable

    rng = random.Random(300 + seed)
    p, v = rng.randint(2, 3), rng.randint(2, 3)
    model = shape_model(rng, rng.randint(p * v, 16), p, tight=seed % 2 == 0)
    if model.micro_batches % p:
        model = PipelineModel(model.kinds, model.fronts, model.static, model.capacity, p * 2, model.reserved)
    assert plans_match_loops(rng, model, p, v, FrontTable(model.fronts, 1), (1, 2))


def plans_match_loops(rng, model, p, v, fronts, shares):
    """plan_tuples against plan_by_loops at no limit and at ``F / (p * share)`` for each share,
    every key's problem and verdict checked (:func:`check_stage_rows`); the keys checked."""
    from gpuknap.search import fastest_prefix, kind_index
    from gpuknap.search._interleaved import plan_tuples

    fastest = fastest_prefix(model, fronts, kind_index(model), 1)
    table = model.in_flight_table(p, v)
    checked = 0
    for limit in (math.inf, *(float(fastest[-1]) / (p * share) for share in shares)):
        most = rng.randint(v, model.layers)
        plan = plan_tuples(model, p, v, table, fronts, limit, fastest, most)
        keys, posed, pruned = plan_by_loops(model, p, v, table, limit, fastest, most)
        assert plan.pruned == pruned and plan.keys == keys
        checked += check_stage_rows(model, p, v, table, fronts, plan, posed)
    return checked


def check_stage_rows(model, p, v, table, fronts, plan, posed):
    """Every key's problem as the arrays build it equals the one model.stages poses, and
    its verdict (arrays, then the knapsack's last steps) equals the engine's, times bit for bit."""
    from gpuknap.engine import FASTEST, KNAPSACK, verdict
    from gpuknap.search._tupleplan import StageRows

    checked = 0
    for s in range(p):
        counts = plan.every[plan.row[plan.stage == s]]
        rows = StageRows(model, s, p, v, table, counts)
        kind, time, capacity = rows.verdicts(fronts)
        made, into = rows.problems(np.arange(len(counts)))
        for j, (q, row) in enumerate(zip([made[i] for i in into.tolist()], counts.tolist())):
            key = (s, sum(row), tuple(row))
            if key in posed:
                assert posed[key] == q, key
                checked += 1
            want = verdict(q, fronts)
            assert kind[j] == want.kind, key
            if want.kind == FASTEST:
                assert time[j] == want.time, key
            if want.kind == KNAPSACK:
                assert capacity[j] == want.capacity, key
    return checked


def test_a_search_over_too_many_chunk_arrangements_is_refused_at_once():
    model = PipelineModel(["a"] * 300, {"a": [LayerOption("x", 1, 1.0, 1.0)]}, {"a": 0}, 10**6, 2)
    with pytest.raises(ValueError, match="chunk arrangements per stage"):
        best_splits(model, 2, 1, "1f1b", 1, backend="numpy", interleave=4)


@pytest.mark.parametrize("seed", range(4))
def test_exact_interleaved_search_certified_on_a_pruned_table(seed, monkeypatch):
    """Roomy devices: the first limit leaves tuples out and still certifies the answer."""
    from gpuknap.search import TupleSource

    rng = random.Random(40 + seed)
    model = shape_model(rng, 14, 3, tight=False)
    seen = []
    real = TupleSource.fill

    def recording(self, values):
        table = real(self, values)
        seen.append(table.pruned)
        return table

    monkeypatch.setattr(TupleSource, "fill", recording)
    for kind in ("slowest", "1f1b"):
        ranked, _ = brute(model, 3, 2, kind)
        got = best_splits(model, 3, 2, kind, 1, backend="numpy", interleave=2)
        assert [c for c, _, _ in got] == [c for _, _, c in ranked[:2]], kind
    assert seen and all(seen)  # every table searched was a pruned one


def brute_simulated(model, p, v):
    """Every interleaved split simulated (the event simulator on its plan), ranked by the rule."""
    from gpuknap.schedule import of_split

    found = []
    for counts in compositions(model.layers, p * v):
        solved = of_split(model, counts, 1, None, v)
        if solved is not None:
            t, times, _ = solved
            stage = [sum(f + b for f, b in zip(fs, bs)) for fs, bs in zip(times.forward, times.backward)]
            found.append((t.iteration_time, stage, counts))
    return found


@pytest.mark.parametrize("seed", range(14))
def test_simulated_interleaved_search_is_exact(seed):
    """score='simulated' with interleave on HEAD / BODY / TAIL models: the same top k as
    simulating every interleaved split (P up to 6), ties by the documented rule."""
    rng = random.Random(300 + seed)
    p, v = [(2, 2), (3, 2), (2, 3), (4, 2), (5, 2), (6, 2)][seed % 6]
    model = shape_model(rng, rng.randint(p * v, min(p * v + 5, 14)), p, tight=seed % 2 == 0)
    found = brute_simulated(model, p, v)
    got = best_splits(model, p, 4, "simulated", 1, backend="numpy", interleave=v)
    assert got.exact
    keys = sorted(tie_rule(t, stage, counts) for t, stage, counts in found)
    want = [(key[-1], key[0]) for key in keys[:4]]
    assert [(c, s) for c, s, _ in got] == [(c, pytest.approx(s, rel=1e-12)) for c, s in want]
    if got:
        assert got.lower_bound == got[0][1]


def test_simulated_interleaved_local_search_is_never_empty_and_close():
    """Other models (local search): every score is the event simulator's time for the split's
    plan, never below the brute-force optimum, within 5% of it, the lower bound below it."""
    from gpuknap.schedule import of_split

    for seed in range(8):
        rng = random.Random(700 + seed)
        p, v = rng.choice([(2, 2), (3, 2)])
        model = hetero_model(rng, rng.randint(8, 10), p)
        got = best_splits(model, p, 2, "simulated", 1, backend="numpy", interleave=v)
        assert not got.exact
        brute = [t for t, _, _ in brute_simulated(model, p, v)]
        if not brute:
            assert got == []
            continue
        for counts, value, _ in got:
            assert value == of_split(model, counts, 1, None, v)[0].iteration_time
        assert got.lower_bound <= min(brute) <= got[0][1] <= 1.05 * min(brute)


def excess_model(rng, body_layers, p):
    """HEAD / BODY / TAIL with ``excess`` tables that may make a layer lighter at a larger
    in-flight count (the contract allows any table)."""
    def option(name):
        per, held = rng.randint(0, 6), rng.randint(20, 100)
        excess = tuple(sorted({k: rng.randint(0, held - 1) for k in rng.sample(range(1, 7), rng.randint(0, 4))}
                              .items()))
        return LayerOption(name, per, rng.randint(1, 9) / 2, rng.randint(0, 12) / 4, held, excess)
    fronts = {"H": [option("h")], "B": [option(f"b{j}") for j in range(rng.randint(1, 3))], "T": [option("t")]}
    kinds = ["H"] + ["B"] * body_layers + ["T"]
    return PipelineModel(kinds, fronts, {"H": 1, "B": 1, "T": 1}, rng.randint(150, 500), p * rng.randint(1, 3))


@pytest.mark.parametrize("seed", range(16))
def test_exact_interleaved_search_with_any_excess_table(seed):
    """Bounds valid for any ``excess`` table: the exact search equals brute force even when a
    body layer's memory shrinks at larger in-flight counts (it dropped splits before)."""
    rng = random.Random(900 + seed)
    p, v = rng.choice([(2, 2), (2, 3), (3, 2)])
    model = excess_model(rng, rng.randint(8, 12), p)
    for kind in ("slowest", "1f1b"):
        ranked, optimum = brute(model, p, v, kind)
        got = best_splits(model, p, 3, kind, 1, backend="numpy", interleave=v)
        assert got.exact
        assert [c for c, _, _ in got] == [c for _, _, c in ranked[:3]], kind
        if optimum is not None:
            assert got[0][1] == pytest.approx(optimum, rel=1e-12)


def test_a_body_lighter_at_larger_in_flight_counts_keeps_its_splits():
    """The case reported: P=2, v=2, M=4, 16 layers, a body layer of 100 bytes at one micro-batch
    in flight and 10 at two to four, 400 bytes of device: splits fit (slowest 16)."""
    body = LayerOption("b", 0, 1.0, 2.0, held_once=100, excess=((2, 90), (3, 90), (4, 90)))
    fronts = {"H": [LayerOption("h", 0, 1.0, 1.0)], "B": [body], "T": [LayerOption("t", 0, 1.0, 1.0)]}
    model = PipelineModel(["H"] + ["B"] * 14 + ["T"], fronts, {"H": 0, "B": 0, "T": 0}, 400, 4)
    ranked, optimum = brute(model, 2, 2, "slowest")
    got = best_splits(model, 2, 3, "slowest", 1, backend="numpy", interleave=2)
    assert got.exact and got[0][1] == optimum
    assert [c for c, _, _ in got] == [c for _, _, c in ranked[:3]]


def test_even_candidate_is_megatron_even_split_unless_found_or_impossible():
    """Megatron's even split, counted independently here: decoder layers spread with the remainder
    on the last virtual stages, the embedding first and the output last."""
    from gpuknap.search import even_candidate

    opt = LayerOption("NONE", 1.0, 1.0, 0.0)  # (a model now checks its options when built)
    for body in (5, 7, 12):
        kinds = ["embedding"] + ["dense"] * body + ["output"]
        model = PipelineModel(kinds, {"embedding": [opt], "dense": [opt], "output": [opt]},
                              {"embedding": 0.0, "dense": 0.0, "output": 0.0}, 100.0, 4)
        for stages in (1, 2, 3):
            for chunks in (1, 2, 3):
                got = even_candidate(model, stages, chunks)
                parts = stages * chunks
                if chunks == 1 or parts > body:
                    assert got is None
                    continue
                want = [body // parts] * parts
                for i in range(body % parts):
                    want[parts - 1 - i] += 1
                want[0] += 1
                want[-1] += 1
                assert got == want and sum(got) == len(kinds)
                assert even_candidate(model, stages, chunks, [tuple(np.array(want))]) is None
                assert even_candidate(model, stages, chunks, [[1] * parts]) == want


def _neighbours(counts: tuple) -> set:
    """Every split one move away, enumerated apart: boundary shifts by 1 or 2, two boundaries by
    one each, one layer from any segment to any other."""
    k, out = len(counts), set()

    def add(row):
        if min(row) >= 1 and tuple(row) != tuple(counts):
            out.add(tuple(row))

    for i in range(k - 1):
        for d in (1, -1, 2, -2):
            row = list(counts)
            row[i] -= d
            row[i + 1] += d
            add(row)
    for i, j in itertools.combinations(range(k - 1), 2):
        for d, e in itertools.product((1, -1), repeat=2):
            row = list(counts)
            row[i] -= d
            row[i + 1] += d
            row[j] -= e
            row[j + 1] += e
            add(row)
    for i, j in itertools.permutations(range(k), 2):
        row = list(counts)
        row[i] -= 1
        row[j] += 1
        add(row)
    return out


def test_the_moves_of_a_split_are_all_its_neighbours_or_bounded():
    """Up to 81 segments a split's moves are all its neighbours; past that (a red team's 8 x 32
    = 256 segments had 200,000 moves, 70 s and 3.8 GB a step) at most MAX_MOVES, the nearest,
    every boundary shift among them."""
    from gpuknap.search._local import MAX_MOVES, _moves

    rng = np.random.default_rng(4)
    for k in (2, 5, 17, 40, 81):
        counts = tuple(int(c) for c in rng.integers(1, 5, k))
        assert set(_moves(counts)) == _neighbours(counts), k
    counts = tuple(int(c) for c in rng.integers(2, 6, 256))
    moves = set(_moves(counts))
    assert len(moves) <= MAX_MOVES and moves <= _neighbours(counts)
    for i in range(255):
        row = list(counts)
        row[i] -= 1
        row[i + 1] += 1
        assert tuple(row) in moves


def test_the_local_search_does_not_drop_a_work_refusal_of_its_plain_start(monkeypatch):
    """A red team found ``best_interleaved`` dropping any ``ValueError`` of the plain search it
    starts from (2026-12-03): a refusal over the work limit went unsaid while the local search ran
    on.  Work refusals now propagate; other refusals still leave the even start."""
    from gpuknap.engine import WorkTooLarge
    from gpuknap.search import _best

    model = hetero_model(random.Random(7), 12, 2)

    def refuse(*args, **kwargs):
        raise WorkTooLarge("the plain search needs 9e99 DP cells, over the work limit", 10**100)

    monkeypatch.setattr(_best, "plain_search", refuse)
    with pytest.raises(WorkTooLarge, match="the plain search needs"):
        best_splits(model, 2, interleave=2)

    def other(*args, **kwargs):
        raise ValueError("an in-flight table the plain search cannot use")

    monkeypatch.setattr(_best, "plain_search", other)
    assert best_splits(model, 2, interleave=2)  # the even start remains


def test_the_constrained_local_search_does_not_drop_a_work_refusal_of_its_plain_start(monkeypatch):
    """The framework-constrained interleaved search dropped a work refusal of its plain start the same
    way (a review, 2026-12-03): it propagates now."""
    from gpuknap.engine import WorkTooLarge
    from gpuknap.formats import load_spec
    from gpuknap.search import _constrained, constrained_splits

    def refuse(*args, **kwargs):
        raise WorkTooLarge("the plain search needs 9e99 DP cells, over the work limit", 10**100)

    monkeypatch.setattr(_constrained, "plain_constrained", refuse)
    spec = load_spec("gpuknap/examples/demo.json")
    with pytest.raises(WorkTooLarge, match="the plain search needs"):
        constrained_splits(spec.model, 4, "mindformers", 1, "slowest", spec.bucket, "numpy", interleave=2)
