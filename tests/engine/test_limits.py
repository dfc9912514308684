"""The work limit and progress reports: estimates are made before any pass, answers do not change."""
from __future__ import annotations

import math
import os
import random
import re

import pytest
from paths import EXAMPLES

from gpuknap import (
    LayerOption,
    Layers,
    Stage,
    WorkTooLarge,
    best_splits,
    choose,
    least_times,
    pp_lite,
    rank,
    suffix_times,
    work_limit,
)
from gpuknap.engine import DEFAULT_MAX_CELLS, max_cells, reporting
from gpuknap.engine._problem import sequential_time
from gpuknap.formats import load_spec

DEMO = os.path.join(EXAMPLES, "demo.json")
FR_SMALL = {"x": [LayerOption("heavy", 10**5, 1, 1), LayerOption("light", 10, 1, 3)]}
GROUPS_SMALL = [Layers("x", 20)]


def test_work_limit_refuses_and_restores():
    model = load_spec(DEMO).model
    want = best_splits(model, 16, backend="numpy")
    with work_limit(1000):
        assert max_cells() == 1000
        with pytest.raises(WorkTooLarge, match="DP cells"):
            best_splits(model, 16, backend="numpy")
        with pytest.raises(WorkTooLarge):
            least_times(GROUPS_SMALL, FR_SMALL, 10**6, 1)
    with work_limit(10**5):  # over the 20 layer steps' set-up (4e4), the cells decide
        with pytest.raises(WorkTooLarge, match="bucket of at least") as refused:
            choose(GROUPS_SMALL, FR_SMALL, 10**6, 1)
        size, unit = re.search(r"bucket of at least ([0-9.]+) (KiB|bytes)", str(refused.value)).groups()
        assert choose(GROUPS_SMALL, FR_SMALL, 10**6, float(size) * (1024 if unit == "KiB" else 1)) is not None
    assert max_cells() == DEFAULT_MAX_CELLS
    with work_limit(10**12):
        again = best_splits(model, 16, backend="numpy")
    assert [(c, s) for c, s, _ in again] == [(c, s) for c, s, _ in want]


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "many", True])
def test_work_limit_checks_its_argument(bad):
    with pytest.raises(ValueError):
        with work_limit(bad):
            pass


def test_progress_reports_every_phase_and_finishes():
    seen = {}

    def listen(stage, done, total):
        assert 0 <= done <= total
        seen.setdefault(stage, []).append((done, total))

    with reporting(listen):
        best_splits(load_spec(DEMO).model, 16, top=3, score="1f1b", backend="numpy")
    assert {"segments", "DP passes", "bottlenecks", "plans"} <= set(seen)
    assert seen["DP passes"][-1][0] == seen["DP passes"][-1][1]
    passes = seen["DP passes"]  # one run per round of the search's limit: each rises to its total
    for (d0, t0), (d1, t1) in zip(passes, passes[1:]):
        assert d1 >= d0 or (d0 == t0 and d1 < d0)


def _added_one_by_one(total, t, n):
    for _ in range(n):
        total += t
    return total


def test_all_fastest_time_is_the_sum_added_layer_by_layer():
    """The all-fastest time (no DP) takes steps per power of two, not per layer: it equals the
    layer-by-layer float sum, ties (round half to even) and subnormal times included."""
    rng = random.Random(3)
    for _ in range(3000):
        start = rng.choice([0.0, rng.uniform(0, 1e6), rng.uniform(1, 2) * 2.0 ** rng.randint(-40, 40),
                            5e-324 * rng.randint(0, 99)])
        ulp = math.ulp(start)
        t = rng.choice([rng.uniform(0, 10) * 10.0 ** rng.randint(-6, 6), (rng.randint(0, 40) + 0.5) * ulp,
                        rng.randint(0, 9) * ulp, 5e-324 * rng.randint(0, 9), rng.uniform(0, 1e200)])
        n = rng.choice([rng.randint(0, 40), rng.randint(0, 5000)])
        assert sequential_time([start, t], [1, n]) == _added_one_by_one(start, t, n), (start.hex(), t.hex(), n)
    times, counts = [0.1, 3.7, 1e-3], [123_457, 98_765, 250_000]
    want = 0.0
    for t, n in zip(times, counts):
        want = _added_one_by_one(want, t, n)
    assert sequential_time(times, counts) == want


HUGE = 10**12  # layers: a count no model has (tokens, say, passed for layers)
FASTEST_FITS = {"a": [LayerOption("keep", 10, 1.0, 2.0), LayerOption("full", 1, 1.0, 3.0)]}
MUST_CHOOSE = {"a": [LayerOption("keep", 10, 1.0, 2.0), LayerOption("full", 0, 1.0, 3.0)]}


def test_huge_layer_counts_are_answered_or_refused_before_any_pass():
    """The all-fastest answer needs no pass at all; a knapsack over 10**12 layer steps is refused
    however narrow its rows, since a larger bucket cannot help: the message says so."""
    assert choose([Layers("a", HUGE)], FASTEST_FITS, math.inf).time == sequential_time([3.0], [HUGE])
    assert rank([[Stage([Layers("a", HUGE)], math.inf)]], FASTEST_FITS).slowest[0] == sequential_time([3.0], [HUGE])
    for solve in (lambda: choose([Layers("a", HUGE)], MUST_CHOOSE, 100, bucket=1),
                  lambda: least_times([Layers("a", HUGE)], MUST_CHOOSE, 0, bucket=1),
                  lambda: suffix_times([Layers("a", 1)] * 3, MUST_CHOOSE, [0] * 4, bucket=1),
                  lambda: rank([[Stage([Layers("a", HUGE)], 100)]], MUST_CHOOSE, bucket=1)):
        with work_limit(5_000):  # suffix_times: 3 steps of set-up, over this limit
            with pytest.raises(WorkTooLarge, match="DP passes over its layers.*a larger bucket does not change"):
                solve()



def _spread(n: int) -> dict:
    """``n`` useful options over the same 0-1000 bytes (the same DP widths whatever ``n``)."""
    return {"a": [LayerOption(f"o{j}", float(round(j * 1000 / (n - 1))), 1.0, float(2 * n - j)) for j in range(n)]}


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_cell_of_many_options_counts_for_more_than_one(backend):
    """A cell costs one addition per option: past 4 options (NumPy) or 32 (the compiled passes)
    a layer step's cells count options / 4 (or / 32) each, so a red team's 10,000 options per
    layer are refused instead of running for minutes.  Same widths, 4 x the options past the
    threshold: 4 x the cells; the set-up of the 6 passes is the same."""
    from gpuknap.engine import counting, get_backend

    try:
        per = get_backend(backend).options_per_cell
    except ValueError:
        pytest.skip(f"{backend} is not installed")
    spent = []
    for n in (4, 4 * per):
        with counting() as cells:
            rank([[Stage([Layers("a", 6)], 3000.0)]], _spread(n), 1.0, backend=backend)
        spent.append(cells[0] - 6 * 8_000)
    assert spent[1] == 4 * spent[0] > 0
    with work_limit(spent[1] + 6 * 8_000 - 1), pytest.raises(WorkTooLarge, match="bucket of at least"):
        rank([[Stage([Layers("a", 6)], 3000.0)]], _spread(4 * per), 1.0, backend=backend)
    single = []  # the single-stage solvers run NumPy: options / 4
    for n in (4, 16):
        with counting() as cells:
            choose([Layers("a", 6)], _spread(n), 3000.0, 1.0)
        single.append(cells[0] - 6 * 2_000)
    assert single[1] == 4 * single[0] > 0


def test_searches_pause_the_cycle_collector_and_restore_it(monkeypatch):
    """The cycle collector is paused inside a search, a sweep and a ranking (no collection runs
    there, however many objects they make) and its state is restored after, on success, on a
    refusal, and when it was paused before the call (then it stays paused)."""
    import gc

    import gpuknap.engine._solve as solve_module
    from gpuknap import sweep
    from gpuknap.engine import paused_collection

    spec = load_spec(DEMO)
    planned = []
    real_plan = solve_module.plan_chunks

    def plan(*args, **kwargs):
        planned.append(gc.isenabled())
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(solve_module, "plan_chunks", plan)
    best_splits(spec.model, 4, 2, "1f1b", spec.bucket, backend="numpy")
    spec.model.rank([[6] * 15 + [8], [5] * 15 + [23]], backend="numpy")
    sweep(os.path.join(EXAMPLES, "llama2_70b.json"), {"stages": [4, 8]}, gpus=64, global_batch=64, backend="numpy",
          bucket=16 * 2**20)
    assert planned and not any(planned)
    seen = []
    real = gc.callbacks[:]

    def watch(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(watch)
    try:
        assert gc.isenabled()
        gc.collect()
        seen.clear()
        with paused_collection():
            junk = [[i] for i in range(200_000)]  # would trigger collections with the collector running
            assert not gc.isenabled() and not seen
        assert gc.isenabled()
        del junk
        best_splits(spec.model, 4, 2, "1f1b", spec.bucket, backend="numpy")
        assert gc.isenabled()
        with pytest.raises(ValueError):
            spec.model.rank([[1, 2]])
        assert gc.isenabled()
        gc.disable()
        try:
            best_splits(spec.model, 4, 1, "slowest", spec.bucket, backend="numpy")
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        gc.callbacks[:] = real


@pytest.mark.parametrize("memory, max_bytes, advice", [
    (1e250, None, "bucket of at least"), (1e250, 10**30, "bucket of at least"), (1e25, 10**30, "bucket of at least"),
    (1e25, 2**70, "bucket of at least"), (1.7e308, 64, "a far larger bucket"), (1.7e308, 10**400, "bucket of at least")],
    ids=["1e250", "1e250-1e30", "1e25-1e30", "1e25-2^70", "max-64", "max-1e400"])
def test_rows_wider_than_any_array_are_refused_with_a_bucket(memory, max_bytes, advice):
    """A stage whose knapsack would be a row of more buckets than the engine's integer arrays
    hold is refused with a ValueError naming a bucket, whatever ``max_bytes`` allows (a
    capacity of 1e25 buckets under max_bytes=1e30 once ended in an OverflowError); where no
    float can say that bucket (memory near the largest float), it asks for a far larger one."""
    fronts = {"x": [LayerOption("heavy", memory, 1, 1), LayerOption("light", memory / 1e5, 1, 3)]}
    with pytest.raises(ValueError, match=advice):
        rank([[Stage([Layers("x", 3)], memory)]], fronts, bucket=1.0, backend="numpy", max_bytes=max_bytes)


_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_SINGLE = {
    "choose": lambda fr, budget, bucket: choose([Layers("x", 3)], fr, budget, bucket),
    "bound": lambda fr, budget, bucket: choose([Layers("x", 3)], fr, budget, bucket, bound=True),
    "pp_lite": lambda fr, budget, bucket: pp_lite([Stage([Layers("x", 3)], budget)], fr, bucket),
    "least_times": lambda fr, budget, bucket: least_times([Layers("x", 3)], fr, budget, bucket)(budget / 2),
    "suffix_times": lambda fr, budget, bucket: suffix_times([Layers("x", 1)] * 3, fr, [budget] * 4, bucket),
}


@pytest.mark.parametrize("solver", sorted(_SINGLE))
@pytest.mark.parametrize("memory, budget", [(1e25, 2.5e25), (1e200, 2.5e200), (1.7e308, 1.7e308), (1.7e308, 1e300)],
                         ids=["1e25", "1e200", "max", "max-1e300"])
def test_single_stage_rows_wider_than_any_array_are_refused_with_a_bucket_that_works(solver, memory, budget):
    """A single-stage solve whose DP row would be over 2**40 buckets is refused with a ValueError
    before anything is counted from that width (a stage memory near the largest float once ended in
    an OverflowError in ``choose`` and ``pp_lite``, and ``least_times`` advised the bucket it was
    given); the bucket it names is then accepted and gives an answer."""
    fr = {"x": [LayerOption("heavy", memory, 1, 1), LayerOption("light", memory / 1e5, 1, 3)]}
    solve = _SINGLE[solver]
    with pytest.raises(ValueError, match="wider than the solvers' limit of 2[*][*]40 buckets") as refused:
        solve(fr, budget, 1.0)
    size, unit = re.search(r"bucket of at least ([0-9.e+]+) (bytes|KiB|MiB|GiB)", str(refused.value)).groups()
    solve(fr, budget, float(size) * _UNITS[unit])  # accepted: neither refused nor crashing


def test_least_times_of_layers_past_any_float_answers_small_rooms():
    """``least_times`` of layers whose all-fastest bytes are past any float still answers rooms a
    row can hold (it once failed on the all-fastest bytes' bucket count, whatever the budget), and
    refuses an infinite budget, which no row holds, by name."""
    fr = {"x": [LayerOption("heavy", 1.7e308, 1, 1), LayerOption("light", 10, 1, 3)]}
    within = least_times([Layers("x", 3)], fr, 100, 1)
    assert within(100) == within(30) == 12 and within(29) == math.inf and within(-1) == math.inf
    assert within(100) == choose([Layers("x", 3)], fr, 100, 1).time
    with pytest.raises(ValueError, match="budget is inf"):
        least_times([Layers("x", 3)], fr, math.inf, 1)


_SLOW_FAST = {"a": [LayerOption("slow", 0.0, 1.0, 2.0), LayerOption("fast", 1.0, 0.5, 1.0)]}
_SLOW_FAST["b"] = _SLOW_FAST["a"]


@pytest.mark.parametrize("groups", [
    [Layers("a", 2**62), Layers("b", 2**62), Layers("a", 2**62), Layers("b", 2**62)],  # 2**64: wraps in int64
    [Layers("a", 2**61), Layers("b", 2**61)], [Layers("a", 2**63)], [Layers("a", 2**1014)], [Layers("a", 2**1030)]],
    ids=["sum-2^64", "sum-2^62", "2^63", "2^1014", "2^1030"])
@pytest.mark.parametrize("limit", [None, 10**400])
def test_stages_of_more_layer_steps_than_any_count_are_refused(groups, limit):
    """A stage whose layer steps the engine's 64-bit sums or the solvers' float counts cannot hold
    is refused with a ValueError by every solver, whatever the work limit allows: counts summing
    to 2**64 once wrapped to 0 in the plan, skipped the refusal and crashed the process; larger
    counts ended in OverflowError while the refusal was being written."""
    solvers = [lambda: rank([[Stage(groups, 10.0)]], _SLOW_FAST, 1, backend="numpy"),
               lambda: choose(groups, _SLOW_FAST, 10.0, 1),
               lambda: choose(groups, _SLOW_FAST, 10.0, 1, bound=True),
               lambda: pp_lite([Stage(groups, 10.0)], _SLOW_FAST, 1),
               lambda: least_times(groups, _SLOW_FAST, 10.0, 1)]
    for solve in solvers:
        with work_limit(limit or DEFAULT_MAX_CELLS):
            with pytest.raises(ValueError, match="DP passes over its layers|more than the (engine|solvers) count"):
                solve()


@pytest.mark.parametrize("bad", [0, 0.5, -1, math.inf, None, "1 GiB", True])
def test_single_stage_memory_checks_its_argument(bad):
    from gpuknap.engine import single_stage_memory
    with pytest.raises(ValueError, match="max_bytes"):
        with single_stage_memory(bad):
            pass


def test_a_refusal_that_no_bucket_can_lift_says_so():
    """Where rows of one bucket are already over a limit (the layers' passes nearly fill the work
    limit, or the table limit is under one row's bytes), the refusal says that a larger bucket
    does not change that, instead of naming a bucket that would be refused again (it once named
    31 bytes, then 93, 279 ... without end)."""
    from gpuknap.engine import single_stage_memory
    with pytest.raises(WorkTooLarge, match="a larger bucket does not change that"):
        least_times([Layers("a", 4_999_000)], _SLOW_FAST, 10.0, 1)
    with work_limit(10**7), pytest.raises(WorkTooLarge, match="a larger bucket does not change that"):
        suffix_times([Layers("a", 1)] * 4_999, _SLOW_FAST, [10.0] * 5_000, 1)
    fr = {"a": [LayerOption("s", 0.0, 1.0, 2.0), LayerOption("f", 1000.0, 0.5, 1.0)]}
    for limit in (1, 7, 20):
        with single_stage_memory(limit):
            with pytest.raises(ValueError, match="a larger bucket does not change that: raise --max-memory"):
                choose([Layers("a", 4)], fr, 2000.0, 1)
            with pytest.raises(ValueError, match="a larger bucket does not change that: raise --max-memory"):
                least_times([Layers("a", 4)], fr, 2000.0, 1)
    with single_stage_memory(64):  # one row of 2 buckets a layer does fit: the advice is a bucket, and it works
        with pytest.raises(ValueError, match="bucket of at least") as refused:
            choose([Layers("a", 4)], fr, 2000.0, 1)
        size, unit = re.search(r"bucket of at least ([0-9.e+]+) (bytes|KiB|MiB|GiB)", str(refused.value)).groups()
        assert choose([Layers("a", 4)], fr, 2000.0, float(size) * _UNITS[unit]) is not None


def test_a_max_bytes_over_the_memory_available_is_refused_before_any_pass(monkeypatch):
    """``max_bytes`` above what the machine has lets a chunk be planned that cannot be allocated
    (a red team's ``max_bytes=10**400`` ended in a MemoryError of 45 GiB): such a chunk is refused
    with a ValueError saying what to lower; within what is available, the same batch runs."""
    import gpuknap.engine._solve as solve_mod
    fr = {"a": [LayerOption("slow", 0.0, 1.0, 2.0), LayerOption("fast", 1000.0, 0.5, 1.0)]}
    stages = [[Stage([Layers("a", 3)], 999.0)]]
    want = rank(stages, fr, 1, backend="numpy").slowest
    monkeypatch.setattr(solve_mod, "available_host_bytes", lambda: 20_000)  # a row of 1,000 buckets: 32 KB
    with pytest.raises(ValueError, match="more than the 19.6 KiB this machine has available; lower max_bytes"):
        rank(stages, fr, 1, backend="numpy", max_bytes=10**400)
    assert list(rank(stages, fr, 1, backend="numpy").slowest) == list(want)  # the default: a share of what is free


@pytest.mark.parametrize("seed", range(4))
def test_single_stage_refusals_agree_with_trying_buckets(seed):
    """Random single-stage solves under small work and table limits (every way of keeping the
    traceback; ``choose`` with its bound, whose budget rounds up; ``pp_lite`` of several stages;
    the relaxed ``Planner``; infinite budgets for ``suffix_times``; lightest options with or
    without memory): a refusal that says no bucket helps is refused again at every bucket tried
    up to 2**40 times coarser, or finds that nothing fits there (a bucket past the budget), and a
    refusal that names a bucket is accepted at that bucket at once.  (Reviews found both wrong:
    "no bucket helps" where a coarser bucket kept every row, advice growing without end, advice
    for the plain knapsack that its bound then refused, and for one stage of several.)"""
    from gpuknap.engine import Planner, single_stage_memory
    rng = random.Random(seed)
    seen = {"none": 0, "named": 0}
    for _ in range(70):
        n = rng.choice([1, 2, 3, 5, 10, 30, 100])
        k = rng.choice([2, 3, 6, 12])
        first = rng.choice([0.0, float(rng.randint(1, 20))])
        fr = {"a": [LayerOption(f"o{j}", first + j * rng.randint(1, 50), float(k - j), 0.0) for j in range(k)]}
        budget = rng.choice([float(rng.randint(1, 60 * n)) + rng.choice([0.0, 0.5]), math.inf])
        name = rng.choice(["choose", "bound", "pp_lite", "relaxed", "least_times", "suffix_times"])
        name = name if budget < math.inf else "suffix_times"
        stages = [Stage([Layers("a", rng.choice([1, n]))], budget * rng.choice([1, 0.5, 7])) for _ in range(3)]
        solve = {"choose": lambda b: choose([Layers("a", n)], fr, budget, b),
                 "bound": lambda b: choose([Layers("a", n)], fr, budget, b, bound=True),
                 "pp_lite": lambda b: pp_lite(stages, fr, b),
                 "relaxed": lambda b: Planner(fr, b, relaxed=True)([Stage([Layers("a", n)], budget)]),
                 "least_times": lambda b: least_times([Layers("a", n)], fr, budget, b)(budget),
                 "suffix_times": lambda b: suffix_times([Layers("a", 1)] * n, fr, [budget] * (n + 1), b)[:-1]}[name]
        work, table = rng.randint(n * 2000 - 100, n * 4100 + 600), rng.choice([None, rng.randint(8, 3000)])

        def run(bucket):
            with work_limit(work), single_stage_memory(table or 2**31):
                return solve(bucket)
        try:
            run(1.0)
            continue
        except ValueError as refused:
            message = str(refused)
        if "does not change that" in message:
            seen["none"] += 1
            for power in range(1, 41):
                try:
                    got = run(2.0 ** power)
                except ValueError:
                    continue
                assert got is None or got == math.inf or (isinstance(got, list) and set(got) <= {math.inf}), \
                    (name, power, got)  # nothing fits at a bucket past the budget
        else:
            seen["named"] += 1
            size, unit = re.search(r"bucket of at least ([0-9.e+]+) (bytes|KiB|MiB|GiB)", message).groups()
            run(float(size) * _UNITS[unit])  # accepted
    assert seen["none"] and seen["named"], seen
