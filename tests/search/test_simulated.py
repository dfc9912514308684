"""The simulated score: the batched simulator against the event simulator, and the exact
search against brute force over every split."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_model import compositions, random_model
from tie_rule import tie_rule

from gpuknap import best_splits, pp_lite
from gpuknap.schedule import iteration_times, simulate, timeline_of


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), st.booleans(), st.data())
def test_batched_simulator_equals_the_event_simulator(p, v, groups, p2p, data):
    m = p * data.draw(st.integers(1, 3)) if v > 1 else data.draw(st.integers(1, 9))
    schedule = "interleaved" if v > 1 else "1f1b"
    times = st.floats(0, 50, allow_nan=False).map(lambda x: round(x, 3))
    fwd = np.array(data.draw(st.lists(times, min_size=groups * p * v, max_size=groups * p * v))).reshape(groups, p, v)
    bwd = np.array(data.draw(st.lists(times, min_size=groups * p * v, max_size=groups * p * v))).reshape(groups, p, v)
    delay = 0.37 if p2p else 0.0
    got = iteration_times(fwd, bwd, m, schedule, delay)
    for g in range(groups):
        want = simulate(fwd[g].tolist(), bwd[g].tolist(), m, schedule, delay).iteration_time
        assert got[g] == want  # bit for bit: the same additions in the same order


def brute_simulated(model, p, bucket):
    found = []
    for counts in compositions(model.layers, p):
        choice = pp_lite(model.stages(counts), model.fronts, bucket)
        if choice is None:
            continue
        names = model.option_names(counts, choice)
        t, _ = timeline_of(model, counts, names)
        found.append(tie_rule(t.iteration_time, choice.times, counts))
    return [(key[0], key[-1]) for key in sorted(found)]


@pytest.mark.parametrize("beam", [1, 64])
@pytest.mark.parametrize("seed", range(16))
def test_simulated_search_equals_brute_force(seed, beam, monkeypatch):
    """With a beam of 1 the branch and bound does nearly all the work; with 64 the first
    bound often holds every feasible split."""
    import gpuknap.search._simulated as search_simulated

    monkeypatch.setattr(search_simulated, "BEAM", beam)
    rng = random.Random(500 + seed)
    model = random_model(rng, rng.randint(5, 13), tight=seed % 2 == 0)
    p = rng.randint(1, min(4, model.layers))
    want = brute_simulated(model, p, 1)
    for top in (1, 4, 9):
        got = best_splits(model, p, top, "simulated", 1, backend="numpy")
        assert [(s, c) for c, s, _ in got] == want[:top], top
        for counts, _, choice in got:
            assert choice == pp_lite(model.stages(counts), model.fronts, 1)


def test_simulated_search_walks_past_the_closed_form_order():
    """Many splits, close scores: the walk simulates beyond the closed-form seeds and
    still returns the brute-force order."""
    from gpuknap import LayerOption, PipelineModel

    rng = random.Random(7)
    kinds = [rng.choice("ab") for _ in range(14)]
    fronts = {"a": [LayerOption("a0", 1, 1.0, 2.0), LayerOption("a1", 3, 0.5, 1.0)],
              "b": [LayerOption("b0", 2, 3.0, 1.0), LayerOption("b1", 4, 1.5, 0.25)]}
    model = PipelineModel(kinds, fronts, {"a": 1, "b": 1}, 60, 6)
    want = brute_simulated(model, 4, 1)
    got = best_splits(model, 4, 20, "simulated", 1, backend="numpy")
    assert [(s, c) for c, s, _ in got] == want[:20]


def test_simulated_score_refuses_the_bound():
    from gpuknap import LayerOption, PipelineModel

    model = PipelineModel(["a"] * 4, {"a": [LayerOption("x", 1, 1.0, 1.0)]}, {"a": 0}, 100, 2)
    with pytest.raises(ValueError, match="simulated"):
        best_splits(model, 2, score="simulated", bound=True)


def shaped_model(rng, layers, p):
    """Random shapes: two to four kinds in any order, options whose forward times differ
    (recompute in the forward, so a stage's forward time depends on its plan), tight or
    roomy memory, 1 to 12 micro-batches."""
    from gpuknap import LayerOption, PipelineModel

    pool = ["head", "dense", "moe", "tail"][: rng.randint(2, 4)]
    fronts = {k: [LayerOption(f"{k}{j}", rng.randint(0, 10), rng.randint(1, 8) / 2, rng.randint(0, 12) / 4,
                              rng.randint(0, 3)) for j in range(rng.randint(1, 3))] for k in pool}
    kinds = [rng.choice(pool) for _ in range(layers)]
    return PipelineModel(kinds, fronts, {k: rng.randint(0, 4) for k in pool}, rng.choice([40, 60, 90, 400]),
                         rng.randint(1, 12), reserved=rng.randint(0, 4))


@pytest.mark.parametrize("seed", range(24))
def test_simulated_search_equals_brute_force_up_to_six_stages(seed):
    equals_brute_force(random.Random(4000 + seed), 2 + seed % 5)


def equals_brute_force(rng: random.Random, p: int) -> None:
    """The simulated search's top 1, 3 and 6 on a random shaped model equal brute force."""
    model = shaped_model(rng, rng.randint(p, min(p + 7, 12)), p)
    want = brute_simulated(model, p, 1)
    for top in (1, 3, 6):
        got = best_splits(model, p, top, "simulated", 1, backend="numpy")
        assert [(s, c) for c, s, _ in got] == want[:top], top



def improved_runs(seed: int, monkeypatch) -> int:
    """The search against brute force with every pass that ends without ending the search
    followed by the moves between any two stages and the finer grid (``EARLY_PASS`` 0, no
    pass stopped as long); how many times they ran."""
    import gpuknap.search._simulated as search_simulated

    calls = []
    transfers = search_simulated._transfers

    def counted(*args, **kwargs):
        calls.append(1)
        return transfers(*args, **kwargs)

    monkeypatch.setattr(search_simulated, "BEAM", 1)
    monkeypatch.setattr(search_simulated, "LONG_PASS", 10**9)
    monkeypatch.setattr(search_simulated, "EARLY_PASS", 0)
    monkeypatch.setattr(search_simulated, "_transfers", counted)
    equals_brute_force(random.Random(7000 + seed), 2 + seed % 5)
    return len(calls)


@pytest.mark.parametrize("seed", range(12))
def test_simulated_search_improved_after_a_pass_equals_brute_force(seed, monkeypatch):
    """The cuts redrawn between passes keep the search exact."""
    improved_runs(seed, monkeypatch)


def test_the_improved_runs_move_layers(monkeypatch):
    """The runs above do redraw their cuts between passes (else they would prove little)."""
    assert improved_runs(1, monkeypatch) > 0


def test_an_earlier_tables_cheap_bound_certifies_a_later_table():
    """The driver asks a score's ``upper`` only while no earlier bound certifies the limit: the
    splits behind a smaller table's bound are in every later table, so the second round goes
    straight to ``top`` (and its answer is certified as before)."""
    from gpuknap.search._rounds import certified_rounds

    class Table:
        def __init__(self, limit):
            self.limit, self.pruned = limit, True

    class Score:
        prunes = True

        def __init__(self):
            self.uppers, self.tops = [], []

        def upper(self, table, k):
            self.uppers.append(table.limit)
            return 10.0

        def top(self, table, k):
            self.tops.append(table.limit)
            return [((1,), 9.5)]

        def reach(self, limit):
            return limit

        def limit_for(self, score):
            return score

    score = Score()
    rounds = certified_rounds(score, 5.0, 1000.0, 1)
    limit = rounds.send(None)
    limit = rounds.send(Table(limit))  # 10 cannot be certified at 5: the next limit reaches it
    assert limit > 10.0
    with pytest.raises(StopIteration) as done:
        rounds.send(Table(limit))
    assert done.value.value == [((1,), 9.5)]
    assert score.uppers == [5.0] and score.tops == [limit]


@pytest.mark.parametrize("seed", range(8))
def test_tables_narrowed_by_the_segment_floor_equal_brute_force(seed, monkeypatch):
    """Rounds after the first leave out the segments whose floor is above the reach of the
    limit; searched against brute force, with a first limit low enough that later rounds
    run, and the cut checked to leave segments out."""
    import gpuknap.search._simulated_score as score

    cut = []
    rooms = score.segment_rooms

    def counted(before, *args):
        after = rooms(before, *args)
        cut.append(int(before.sum() - after.sum()))
        return after

    monkeypatch.setattr(score, "segment_rooms", counted)
    monkeypatch.setattr(score.Simulated, "first", lambda self, limit: limit)
    for offset in range(3):
        equals_brute_force(random.Random(8100 + 10 * seed + offset), 2 + (seed + offset) % 5)
    assert len(cut) > 0 and sum(cut) > 0


@pytest.mark.parametrize("rows, cells", [(3, 1), (10**6, 2**17)])
@pytest.mark.parametrize("seed", range(10))
def test_first_splits_moved_a_layer_keep_the_search_exact(seed, rows, cells, monkeypatch):
    """The first k-th best comes from the beam and from splits one layer away from the best
    found (only the best, its moves bounded and simulated a row at a time; or until each of
    the top has been moved); with a beam of 1 those moves give most of it.  The search stays
    equal to brute force."""
    import gpuknap.search._simulated as search_simulated

    monkeypatch.setattr(search_simulated, "BEAM", 1)
    monkeypatch.setattr(search_simulated, "NEIGHBOUR_ROWS", rows)
    monkeypatch.setattr(search_simulated, "MOVE_ROWS", cells)
    equals_brute_force(random.Random(9000 + seed), 2 + seed % 5)


def test_the_first_splits_are_distinct_and_simulated(monkeypatch):
    """What the search starts from (its k-th best is a cut) holds each split once, with its own
    simulated times: a split counted twice would draw the cut below the true k-th best."""
    import gpuknap.search._simulated as search_simulated

    start, seen = search_simulated._Found.__init__, []

    def checked(self, top, splits, low, high):
        B = bounds[-1]
        assert len(np.unique(splits, axis=0)) == len(splits)
        if len(splits):
            want_low, want_high = B.simulate(splits)
            assert np.array_equal(low, want_low) and np.array_equal(high, want_high)
        seen.append(len(splits))
        start(self, top, splits, low, high)

    search, bounds = search_simulated.search, []

    def kept(B, *args):
        bounds.append(B)
        return search(B, *args)

    monkeypatch.setattr(search_simulated._Found, "__init__", checked)
    monkeypatch.setattr(search_simulated, "search", kept)
    monkeypatch.setattr("gpuknap.search._simulated_score.search", kept)
    for seed in range(10):
        equals_brute_force(random.Random(9500 + seed), 2 + seed % 5)
    assert max(seen) > 20, seen


def test_a_long_pipeline_finds_its_next_best_splits_without_a_long_walk(monkeypatch):
    """Llama-2-70B on 40 stages of about two layers: the best split is alone, and the next
    ones (a stage of three layers and one of one, in many places) are a layer or two from it.
    Found first, they keep the walk short: the top 3 within 20,000 partial splits (the walk
    expanded 88,000 and simulated 3 million splits from a poorer second best before)."""
    import os

    import gpuknap.search._simulated as search_simulated
    from gpuknap import load_spec
    from paths import EXAMPLES

    monkeypatch.setattr(search_simulated, "MAX_EXPANDED", 20_000)
    spec = load_spec(os.path.join(EXAMPLES, "llama2_70b.json"))
    top3 = best_splits(spec.model, 40, 3, "simulated", spec.bucket, backend="numpy")
    top1 = best_splits(spec.model, 40, 1, "simulated", spec.bucket, backend="numpy")
    assert [c for c, _, _ in top3][:1] == [c for c, _, _ in top1]
    scores = [s for _, s, _ in top3]
    assert scores == sorted(scores) and len(scores) == 3
    for counts, value, _ in top3:  # each score is the schedule's time of its plan
        names = spec.model.option_names(counts, pp_lite(spec.model.stages(list(counts)), spec.model.fronts,
                                                         spec.bucket))
        assert timeline_of(spec.model, counts, names)[0].iteration_time == value


def decimal_model(rng: random.Random, layers: int):
    """Equal layers of one or two kinds with times in tenths (not binary fractions: sums
    in different orders round differently) and few micro-batches: many splits simulate to
    times a few units in the last place apart, which are not ties."""
    from gpuknap import LayerOption, PipelineModel

    pool = ["a", "b"][: rng.randint(1, 2)]
    fronts = {k: [LayerOption(f"{k}{j}", rng.randint(0, 6), rng.randint(1, 30) / 10, rng.randint(1, 30) / 10)
                  for j in range(rng.randint(1, 2))] for k in pool}
    kinds = [rng.choice(pool) for _ in range(layers)]
    return PipelineModel(kinds, fronts, {k: 0 for k in pool}, rng.choice([30, 1000]), rng.randint(1, 4))


@pytest.mark.parametrize("seed", range(30))
def test_simulated_search_splits_apart_by_rounding_equal_brute_force(seed):
    """Scores a rounding apart are compared as the floats they are: a split whose bound
    rounds a little above the k-th best found is still searched (the cut of every pass
    has the slack, not only the k-th best's)."""
    rng = random.Random(9900 + seed)
    p = rng.randint(2, 6)
    model = decimal_model(rng, rng.randint(p, 12))
    want = brute_simulated(model, p, 1)
    for top in (1, 3):
        got = best_splits(model, p, top, "simulated", 1, backend="numpy")
        assert [(s, c) for c, s, _ in got] == want[:top], top


def test_a_plateau_of_splits_a_rounding_apart_is_answered_not_proven(monkeypatch):
    """Llama-2-70B on 40 stages with 8 micro-batches: a great many splits simulate within a
    few units in the last place of one another, and an exact ranking must simulate them all;
    past ``MAX_SIMULATED`` the search stops (not left to run for minutes and gigabytes) and
    answers with the best splits it simulated, not exact, with a lower bound that no split of
    a random sample beats; each score is its split's schedule time."""
    import os

    import gpuknap.search._simulated as search_simulated
    from gpuknap import load_spec
    from paths import EXAMPLES

    monkeypatch.setattr(search_simulated, "MAX_SIMULATED", 5_000)
    spec = load_spec(os.path.join(EXAMPLES, "llama2_70b.json"), micro_batches=8)
    got = best_splits(spec.model, 40, 3, "simulated", spec.bucket, backend="numpy")
    assert not got.exact and "over 5,000 splits simulate within rounding" in got.why and len(got) == 3
    scores = [s for _, s, _ in got]
    assert scores == sorted(scores) and got.lower_bound <= scores[0] < got.lower_bound * 1.01
    for counts, value, _ in got:
        names = spec.model.option_names(counts, pp_lite(spec.model.stages(list(counts)), spec.model.fronts,
                                                         spec.bucket))
        assert timeline_of(spec.model, counts, names)[0].iteration_time == value
    rng = np.random.default_rng(7)  # splits near the even one: stages of 1 to 3 layers
    sim = []
    for counts in (c.tolist() for c in (rng.integers(1, 4, size=40) for _ in range(3000))
                   if c.sum() == spec.model.layers):
        choice = pp_lite(spec.model.stages(counts), spec.model.fronts, spec.bucket)
        if choice is not None and len(sim) < 40:
            sim.append(timeline_of(spec.model, counts, spec.model.option_names(counts, choice))[0].iteration_time)
    assert len(sim) == 40 and min(sim) >= got.lower_bound


@pytest.mark.parametrize("seed", range(12))
def test_splits_dropped_after_every_simulation_keep_the_search_exact(seed, monkeypatch):
    """The splits simulated are dropped once they cannot be in the top, now and then (a
    plateau keeps them all); dropped after every batch, the search is the same."""
    import gpuknap.search._simulated as search_simulated

    monkeypatch.setattr(search_simulated, "KEEP_ROWS", 0)
    monkeypatch.setattr(search_simulated, "BEAM", 1)
    equals_brute_force(random.Random(9700 + seed), 2 + seed % 5)


@pytest.mark.parametrize("cap, ranked", [(4, 256), (4, 1), (16, 1)])
def test_a_search_over_its_simulation_cap_answers_exactly_or_not_proven(cap, ranked, monkeypatch):
    """With the cap on simulated splits lowered to a few (and the walk started from a poor
    split), small random searches either answer exactly (brute force) or say they are not
    proven: then every split given is a real one with its own simulated time, in the tie
    rule's order, and the lower bound is at most the true best (brute force) and at most
    the first score."""
    import gpuknap.search._simulated as search_simulated

    import gpuknap.search._simulated_score as simulated_score

    monkeypatch.setattr(search_simulated, "MAX_SIMULATED", cap)
    monkeypatch.setattr(search_simulated, "BEAM", 1)
    monkeypatch.setattr(search_simulated, "RANKED", ranked)  # (the others found bound the answer by their lows)
    real = search_simulated.first_bound

    def poor(B, top, earlier=None):  # the walk starts from the worst first split: stopped, it is often not the best
        pool, low, high = real(B, top, earlier)
        worst = np.argsort(high, kind="stable")[-1:]
        return pool[worst], low[worst], high[worst]

    monkeypatch.setattr(search_simulated, "first_bound", poor)
    monkeypatch.setattr(simulated_score, "first_bound", poor)
    cut = exact = missed = 0
    for seed in range(40):
        rng = random.Random(9800 + seed)
        p = 2 + seed % 5
        model = shaped_model(rng, rng.randint(p, min(p + 7, 12)), p)
        want = brute_simulated(model, p, 1)
        times = {c: s for s, c in want}
        for top in (1, 3):
            got = best_splits(model, p, top, "simulated", 1, backend="numpy")
            if got.exact:
                assert [(s, c) for c, s, _ in got] == want[:top], (seed, top)
                exact += 1
                continue
            cut += 1
            assert f"over {cap} splits simulate" in got.why and 1 <= len(got) <= top
            assert all(times[c] == s for c, s, _ in got)  # each a feasible split with its own time
            order = [want.index((s, c)) for c, s, _ in got]
            assert order == sorted(order)
            assert got.lower_bound <= want[0][0] <= got[0][1]
            missed += want[0][0] < got[0][1]
    assert cut and exact and missed  # (a bound taken from the splits found would fail where they miss)


def test_the_command_line_says_a_capped_search_is_not_proven(monkeypatch, capsys):
    """``best --score simulated`` stopped at its cap prints its best splits, then one line
    saying they are not proven, why, and the lower bound; the JSON says ``exact: false`` with
    ``optimum_lower_bound``, and its first score is the text's."""
    import json
    import os

    import gpuknap.search._simulated as search_simulated
    from gpuknap.cli import main
    from paths import EXAMPLES

    monkeypatch.setattr(search_simulated, "MAX_SIMULATED", 5_000)
    args = ["best", os.path.join(EXAMPLES, "llama2_70b.json"), "--stages", "40", "--score", "simulated",
            "--micro-batches", "8", "--backend", "numpy", "--quiet"]
    assert main(args) == 0
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith("not proven optimal: the exact simulated search stopped at its cap (over 5,000 splits "
                           "simulate within rounding of the best)") and "no split is faster than" in last, last
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["exact"] is False and data["optimum_lower_bound"] <= data["results"][0]["score"]
    assert f"{data['optimum_lower_bound']:.6g}" in last


def test_a_capped_search_that_found_nothing_or_feeds_emit_refuses(monkeypatch, capsys):
    """A walk stopped before it simulated any split has no answer to give: it refuses (a red
    team's random model, beam of 2, one partial split). Settings for a framework are emitted
    from an exact search only: ``--emit`` refuses a capped search in one line, exit 2, and so
    does the constrained search through the API (it had called a capped answer exact)."""
    import os

    import gpuknap.search._simulated as search_simulated
    from gpuknap import load_spec
    from gpuknap.cli import main
    from gpuknap.search import constrained_splits
    from paths import EXAMPLES

    rng = random.Random(1898)
    p = rng.randint(2, 6)
    model = shaped_model(rng, rng.randint(p, min(p + 7, 12)), p)
    assert brute_simulated(model, p, 1)  # feasible splits exist
    monkeypatch.setattr(search_simulated, "BEAM", 2)
    monkeypatch.setattr(search_simulated, "MAX_EXPANDED", 1)
    with pytest.raises(ValueError, match="expand over 1 partial splits"):
        best_splits(model, p, 1, "simulated", 1, backend="numpy")
    monkeypatch.setattr(search_simulated, "BEAM", 64)
    monkeypatch.setattr(search_simulated, "MAX_EXPANDED", 30_000_000)
    monkeypatch.setattr(search_simulated, "MAX_SIMULATED", 5_000)
    path = os.path.join(EXAMPLES, "llama2_70b.json")
    for name in ("mindformers", "megatron"):
        assert main(["best", path, "--stages", "40", "--score", "simulated", "--micro-batches", "8", "--emit", name,
                     "--backend", "numpy", "--quiet"]) == 2
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and "simulate over 5,000 splits" in err[0] and not captured.out, err
    spec = load_spec(path, micro_batches=8)
    with pytest.raises(ValueError, match="simulate over 5,000 splits"):
        constrained_splits(spec.model, 40, "mindformers", 1, "simulated", spec.bucket, "numpy")
