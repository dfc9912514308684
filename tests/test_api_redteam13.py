"""The Python API red team, round 13 (rt13): the plan functions validate what they are given,
option names are distinct within a kind, options are checked when built, NumPy scalars warn
nothing, and a batch of simulated pipelines is bounded as a whole.

Each test compares with an expectation computed apart (a brute-force sum, the event simulator,
float64 copies of float32 inputs) or names the field a ValueError must carry."""
from __future__ import annotations

import dataclasses
import math
import os
import random
import warnings
from typing import Any, Callable

import numpy as np
import pytest
from paths import EXAMPLES

import gpuknap.costs as C
from gpuknap import (MEGABYTE, LayerOption, Layers, PipelineModel, Stage, WorkTooLarge, best_splits, choose, pp_lite,
                     work_limit)
from gpuknap import schedule as S
from gpuknap.formats import emit, framework, load_spec, restrict
from gpuknap.schedule import _simulate

MB = MEGABYTE
LLAMA = os.path.join(EXAMPLES, "llama2_70b.json")  # a cost model: 82 layers (embedding, 80 dense, output)
DEMO = os.path.join(EXAMPLES, "demo.json")  # a measured profile: HEAD, 96 BODY, TAIL


@pytest.fixture(scope="module")
def llama():
    m = load_spec(LLAMA).model
    counts, _, choice = best_splits(m, 8)[0]
    return m, list(counts), m.option_names(list(counts), choice)


def _raises(call: Callable[[], Any], *words: str) -> str:
    """``call`` raises a ValueError holding every word, on one line, warning nothing on the way."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError) as info:
            call()
    text = str(info.value)
    assert "\n" not in text, text
    for word in words:
        assert word in text, (word, text)
    return text


# ---- finding 1: two options of one kind with one name -------------------------------------------

def test_a_model_refuses_two_options_of_one_name_in_a_kind():
    fr = {"body": [LayerOption("X", 900 * MB, 10, 20), LayerOption("X", 100 * MB, 10, 80)]}
    _raises(lambda: PipelineModel(("body",) * 4, fr, {"body": 0}, 1000 * MB, 4),
            "fronts['body'][1].name", "'X'", "fronts['body'][0]", "names must differ")
    ok = PipelineModel(("body",) * 4, {"body": [fr["body"][0], dataclasses.replace(fr["body"][1], name="Y")]},
                       {"body": 0}, 1000 * MB, 4)
    _raises(lambda: dataclasses.replace(ok, fronts=fr), "fronts['body'][1].name")
    # one name in two kinds is fine: a plan names each layer's option within its kind
    both = PipelineModel(("a", "b"), {"a": [LayerOption("X", 1, 1, 1)], "b": [LayerOption("X", 1, 2, 2)]},
                         {"a": 0, "b": 0}, 100.0, 2)
    assert S.chunk_times(both, [1, 1], ["X", "X"]).forward == [[1.0], [2.0]]


@pytest.mark.parametrize("seed", range(6))
def test_the_timeline_runs_the_options_the_plan_chose(seed):
    """The report's case, with distinct names: the closed form from the simulated split's chunk
    times equals ``(M - 1) max + sum`` of the stage times the engine chose."""
    rng = random.Random(seed)
    fr = {k: [LayerOption(f"{k}{j}", rng.randint(1, 9) * MB, rng.randint(1, 9), rng.randint(1, 30))
              for j in range(rng.randint(1, 4))] for k in "ab"}
    kinds = [rng.choice("ab") for _ in range(rng.randint(4, 10))]
    m = PipelineModel(kinds, fr, {"a": 0, "b": MB}, rng.randint(15, 40) * MB, rng.randint(1, 6))
    counts = [len(kinds) // 2, len(kinds) - len(kinds) // 2]
    choice = pp_lite(m.stages(counts), m.fronts, MB)
    solved = S.of_split(m, counts, MB)
    if choice is None:
        assert solved is None
        return
    times = list(choice.times)
    assert solved[2] == pytest.approx((m.micro_batches - 1) * max(times) + sum(times), rel=1e-12)
    assert solved[0].iteration_time == S.simulate(solved[1].forward, solved[1].backward, m.micro_batches).iteration_time


# ---- finding 2: the plan functions validate counts, chunks, names and span ---------------------

def _plan_calls(m: PipelineModel, counts: list, names: list) -> dict:
    return {"estimate": lambda c=counts, n=names, k=1: C.estimate(m, c, n, k),
            "run_of": lambda c=counts, n=names, k=1: C.run_of(m, c, n, k, 100.0),
            "timeline_of": lambda c=counts, n=names, k=1: S.timeline_of(m, c, n, k),
            "chunk_times": lambda c=counts, n=names, k=1: S.chunk_times(m, c, n, k),
            "of_plan": lambda c=counts, n=names, k=1: S.of_plan(m, c, n, k)}


@pytest.mark.parametrize("call", ["estimate", "run_of", "timeline_of", "chunk_times", "of_plan"])
def test_the_plan_functions_refuse_a_plan_of_another_model(llama, call):
    m, counts, names = llama
    f = _plan_calls(m, counts, names)[call]
    f()  # the plan itself is fine
    _raises(lambda: f(c=[1] * 8), "counts sum to 8", "82 layers")
    _raises(lambda: f(k=3), "chunks=3", "got 8")
    for chunks in (0, -1, True, 1.5, "2"):
        _raises(lambda k=chunks: f(k=k), "chunks")
    _raises(lambda: f(c=counts[:-1] + [counts[-1] - 1, 1, 0]), "counts[")
    _raises(lambda: f(c="12"), "counts")
    _raises(lambda: f(n=names[:-1]), "names", "82 entries", "got 81")
    _raises(lambda: f(n="NONE"), "names")
    _raises(lambda: f(n=None), "names")
    bogus = list(names)
    bogus[40] = "BOGUS"
    _raises(lambda: f(n=bogus), "names[40]", "'BOGUS'", "'dense'")
    wrong_kind = list(names)
    wrong_kind[0] = "NONE"  # an option of another kind
    _raises(lambda: f(n=wrong_kind), "names[0]", "'NONE'", "'embedding'")
    unhashable = list(names)
    unhashable[3] = ["NONE"]
    _raises(lambda: f(n=unhashable), "names[3]")


@pytest.mark.parametrize("span", [math.nan, -5.0, math.inf, "1", None, True, 1 + 2j])
def test_run_of_refuses_a_span_that_is_no_time(llama, span):
    m, counts, names = llama
    _raises(lambda: C.run_of(m, counts, names, 1, span), "span")


def test_the_plan_functions_refuse_what_is_no_model(llama):
    _, counts, names = llama
    for call in (lambda: C.estimate(None, counts, names), lambda: C.run_of("m", counts, names, 1, 1.0),
                 lambda: S.chunk_times(None, counts, names), lambda: S.timeline_of(object(), counts, names),
                 lambda: S.of_split(None, counts, MB), lambda: S.of_plan(5, counts, names)):
        _raises(call, "model")


def test_a_measured_profile_is_validated_before_estimate_says_none():
    m = load_spec(DEMO).model  # no cost model
    counts, _, choice = best_splits(m, 16)[0]
    names = m.option_names(list(counts), choice)
    assert C.estimate(m, list(counts), names) is None
    _raises(lambda: C.estimate(m, [1, 1], names), "counts sum to 2")
    _raises(lambda: C.estimate(m, list(counts), names[1:]), "names")
    _raises(lambda: C.run_of(m, list(counts), names, 1, 10.0), "model", "cost model")


def test_of_split_validates_counts_and_ignores_a_table_of_another_shape(llama):
    m, counts, _ = llama
    _raises(lambda: S.of_split(m, counts, MB, chunks=0), "chunks")
    _raises(lambda: S.of_split(m, [1] * 8, MB), "counts sum to 8")
    _raises(lambda: S.of_split(m, counts, math.nan), "bucket")
    _raises(lambda: S.of_split(m, counts, MB, p2p=-1.0), "p2p")
    _raises(lambda: S.of_plan(m, counts, m.plan(counts), p2p=math.nan), "p2p")
    _raises(lambda: S.simulated_plans(m, [(counts, m.plan(counts)), ([41, 41], m.plan(counts))]), "plans[1]")
    want = S.of_split(m, counts, MB)
    for table in (5, "ab", [[1, 2]], [[1]] * 3):
        assert S.of_split(m, counts, MB, in_flight=table)[2] == want[2]


@pytest.mark.parametrize("seed", range(5))
def test_chunk_times_sum_each_layers_named_option(seed):
    """Against a sum written apart: each layer's option found by a scan of its kind's options."""
    rng = random.Random(100 + seed)
    fr = {k: [LayerOption(f"{k}{j}", rng.randint(0, 9), rng.randint(1, 40) / 8, rng.randint(0, 80) / 8)
              for j in range(rng.randint(1, 4))] for k in "abc"}
    chunks = rng.choice([1, 2])
    p = rng.randint(1, 3)
    kinds = [rng.choice("abc") for _ in range(rng.randint(p * chunks, 12))]
    m = PipelineModel(kinds, fr, dict.fromkeys("abc", 0), 1e9, 4 * p)
    cuts = sorted(rng.sample(range(1, len(kinds)), p * chunks - 1))
    counts = [b - a for a, b in zip([0] + cuts, cuts + [len(kinds)])]
    names = [rng.choice(fr[k]).name for k in kinds]
    got = S.chunk_times(m, counts, names, chunks)
    layer = 0
    for i, n in enumerate(counts):
        s, c = i % p, i // p
        fwd = bwd = rec = 0.0
        for _ in range(n):
            option = [o for o in fr[kinds[layer]] if o.name == names[layer]][0]
            fwd += option.forward_time
            bwd += option.backward_time
            rec += option.backward_time - min(o.backward_time for o in fr[kinds[layer]])
            layer += 1
        assert (got.forward[s][c], got.backward[s][c], got.recompute[s][c]) == (fwd, bwd, rec)


# ---- finding 5: NumPy float32 values warn nothing ----------------------------------------------

def test_float32_values_warn_nothing_and_answer_as_their_float64_copies():
    """The report's repro under warnings-as-errors, against the same values as Python floats."""
    f32 = np.float32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = pp_lite([Stage([Layers("b", 2, 1)], 1e10, f32(2.5))], {"b": [LayerOption("N", 1e6, 1, 2)]})
        want = pp_lite([Stage([Layers("b", 2, 1)], 1e10, 2.5)], {"b": [LayerOption("N", 1e6, 1, 2)]})
        assert got.times == want.times == (8.5,)
        option = LayerOption("N", f32(1e6), f32(1.1), f32(2.3), f32(7))
        same = LayerOption("N", float(f32(1e6)), float(f32(1.1)), float(f32(2.3)), float(f32(7)))
        got = choose([Layers("b", 2, 1)], {"b": [option]}, 1e10)
        want = choose([Layers("b", 2, 1)], {"b": [same]}, 1e10)
        assert (got.time, got.memory) == (want.time, want.memory)
        m = PipelineModel(("b",) * 4, {"b": [option]}, {"b": f32(3)}, f32(1e9), np.int64(4))
        assert best_splits(m, 2)[0][1] == best_splits(dataclasses.replace(m, fronts={"b": [same]}), 2)[0][1]


# ---- finding 6: a batch of pipelines is bounded as a whole -------------------------------------

def test_iteration_times_refuses_a_batch_over_the_work_limit_naming_what_fits():
    rng = np.random.default_rng(6)
    fwd, bwd = rng.random((11, 2, 1)), rng.random((11, 2, 1))
    ops = 2 * 2 * 1 * 4
    with work_limit(10 * ops):
        got = S.iteration_times(fwd[:10], bwd[:10], 4)
        text = _raises(lambda: S.iteration_times(fwd, bwd, 4), "forward", "11 pipelines", f"{ops} schedule operations",
                       "at most 10 pipelines", "work_limit")
    assert [float(t) for t in got] == [S.simulate(f, b, 4).iteration_time for f, b in zip(fwd[:10], bwd[:10])]
    with pytest.raises(WorkTooLarge) as info:
        with work_limit(10 * ops):
            S.iteration_times(fwd, bwd, 4)
    assert info.value.cells == 11 * ops and str(info.value) == text


def test_a_huge_broadcast_batch_is_refused_before_it_is_read():
    one = np.ones((1, 64, 1))
    huge = np.broadcast_to(one, (10**9, 64, 1))  # 512 GB if it were ever read
    _raises(lambda: S.iteration_times(huge, huge, 256), "1,000,000,000 pipelines", "32,768", "at most")
    bad = np.broadcast_to(np.full((1, 64, 1), np.nan), (10**9, 64, 1))
    _raises(lambda: S.iteration_times(bad, huge, 256), "pipelines")  # the size first: its values are not read


def test_the_packages_own_simulations_are_not_refused_by_the_batch_limit(llama, monkeypatch):
    """The searches, one pipeline's time and a found list's plans are bounded by their own limits:
    none of them goes through the public batch check."""
    m, counts, names = llama
    demo = load_spec(DEMO).model
    before = (C.estimate(m, counts, names).iteration_time, best_splits(demo, 4, 3, score="simulated"),
              best_splits(demo, 4, 2, score="simulated", interleave=2), S.simulated_plans(m, [(counts, names)] * 3),
              S.iteration_time(np.ones((20, 1)), np.ones((20, 1)), 8))

    def refuse(batch: int, ops: int) -> None:
        raise AssertionError("the public batch check was called")

    monkeypatch.setattr(_simulate, "check_batch", refuse)
    with pytest.raises(AssertionError):
        S.iteration_times(np.ones((1, 2, 1)), np.ones((1, 2, 1)), 4)
    after = (C.estimate(m, counts, names).iteration_time, best_splits(demo, 4, 3, score="simulated"),
             best_splits(demo, 4, 2, score="simulated", interleave=2), S.simulated_plans(m, [(counts, names)] * 3),
             S.iteration_time(np.ones((20, 1)), np.ones((20, 1)), 8))
    assert after == before


# ---- finding 7: the emitters check the model, the names and the notes --------------------------

def test_emit_and_restrict_refuse_what_is_no_plan_of_the_model(llama):
    m, counts, names = llama
    text = emit("megatron", m, counts, names=names, notes=["found by a test"])
    assert "# found by a test" in text.splitlines()
    bogus = list(names)
    bogus[5] = "BOGUS"
    for fw in ("megatron", "mindformers"):
        _raises(lambda f=fw: emit(f, m, counts, names=bogus), "names[5]", "'BOGUS'", "'dense'")
        _raises(lambda f=fw: emit(f, m, counts, names=["BOGUS"] * len(names)), "names[0]", "'embedding'")
        _raises(lambda f=fw: emit(f, m, counts, names=names, notes="abc"), "notes", "str")
        _raises(lambda f=fw: emit(f, m, counts, names=names, notes=5), "notes")
        _raises(lambda f=fw: emit(f, None, counts, names=names), "model must be a PipelineModel")
        _raises(lambda f=fw: restrict(None, f), "model must be a PipelineModel")
        _raises(lambda f=fw: restrict("llama", f), "model must be a PipelineModel")
    _raises(lambda: framework.framework_plan(None, counts, names), "model")
    _raises(lambda: framework.framework_plan(m, counts, "NONE" * 82), "names")


# ---- finding 8: LayerOption checks its fields when built ---------------------------------------

BAD_FIELDS = [
    (dict(name=None), "LayerOption.name"), (dict(name=""), "LayerOption.name"), (dict(name=5), "LayerOption.name"),
    (dict(per_micro_batch=math.nan), "LayerOption.per_micro_batch must be finite, got nan"),
    (dict(per_micro_batch=-1), "LayerOption.per_micro_batch must be >= 0"),
    (dict(per_micro_batch=math.inf), "LayerOption.per_micro_batch"),
    (dict(per_micro_batch="1"), "LayerOption.per_micro_batch"), (dict(per_micro_batch=[1]), "LayerOption.per_micro_batch"),
    (dict(per_micro_batch=None), "LayerOption.per_micro_batch"), (dict(per_micro_batch=10**400), "per_micro_batch"),
    (dict(held_once=math.nan), "LayerOption.held_once"), (dict(held_once=-5), "LayerOption.held_once must be >= 0"),
    (dict(held_once=np.float32("inf")), "LayerOption.held_once"),
    (dict(forward_time=math.nan), "LayerOption.forward_time"), (dict(forward_time=-1.0), "LayerOption.forward_time"),
    (dict(forward_time=1e300), "LayerOption.forward_time must be from 0 to 1e+200"),
    (dict(backward_time=math.inf), "LayerOption.backward_time"), (dict(backward_time="2"), "LayerOption.backward_time"),
    (dict(backward_time=True), "LayerOption.backward_time"),
    (dict(excess=((4, 1), (4, 5))), "LayerOption.excess[1] in_flight 4 is also that of excess[0]"),
    (dict(excess=((np.int64(2), 1), (2, 5))), "excess[1]"),
]


@pytest.mark.parametrize("fields, words", BAD_FIELDS, ids=[repr(f) for f, _ in BAD_FIELDS])
def test_layer_option_refuses_a_bad_field_when_built(fields, words):
    base = dict(name="X", per_micro_batch=10.0, forward_time=1.0, backward_time=2.0)
    _raises(lambda: LayerOption(**{**base, **fields}), words)
    _raises(lambda: dataclasses.replace(LayerOption(**base), **fields), words)


def test_layer_option_takes_numpy_scalars_and_ints_as_before():
    option = LayerOption("X", np.uint8(3), np.int64(2), np.float32(0.25), np.float64(4.0), excess=((np.int64(2), 1),))
    assert option.memory(2) == 2 * 3 + 4 - 1 and option.memory(3) == 3 * 3 + 4
    assert option.time == 2.25 and LayerOption("Y", 0, 0, 0).time == 0
    assert choose([Layers("b", 3, 2)], {"b": [option]}, 100).time == 3 * 2.25


# ---- finding 9: a pair of one option twice -----------------------------------------------------

def test_exclusive_refuses_a_pair_of_one_option():
    m = load_spec(DEMO).model
    _raises(lambda: best_splits(m, 16, exclusive=[("NONE", "NONE")]), "exclusive", "('NONE', 'NONE')", "twice")
    _raises(lambda: best_splits(m, 16, exclusive=[("SLCT", "COMM"), ["BOTH", "BOTH"]]), "exclusive", "twice")
    assert best_splits(m, 16, exclusive=[("SLCT", "COMM")])  # two options still kept apart


# ---- finding 11 and 4 (schedule): one rule for the simulators' inputs --------------------------

@pytest.mark.parametrize("dtype", [complex, bool, "U3", object])
def test_iteration_times_refuses_what_is_no_real_time(dtype):
    bad = np.ones((1, 2, 1), dtype=dtype)
    _raises(lambda: S.iteration_times(bad, np.ones((1, 2, 1)), 4), "forward", "real times")
    _raises(lambda: S.iteration_times(np.ones((1, 2, 1)), bad, 4), "backward")
    _raises(lambda: S.bound_iteration_times(bad, np.ones((1, 2, 1)), 4), "forward")


@pytest.mark.parametrize("p", [2, 20])
def test_simulate_and_iteration_time_take_what_iteration_times_takes(p):
    """float32 arrays, integer arrays and NumPy scalars, as their float64 copies (both of
    iteration_time's simulators: the event one below WAVES_FROM, the waves past it)."""
    rng = np.random.default_rng(p)
    fwd, bwd = rng.random((p, 1)).astype(np.float32), rng.integers(0, 5, (p, 1))
    want = S.simulate(fwd.astype(np.float64).tolist(), bwd.astype(np.float64).tolist(), 8).iteration_time
    assert want == float(S.iteration_times(fwd[None], bwd[None], 8)[0])
    assert S.simulate(fwd, bwd, 8).iteration_time == want
    assert S.iteration_time(fwd, bwd, 8) == want
    scalars = [[np.float32(f[0])] for f in fwd], [[np.int64(b[0])] for b in bwd]
    assert S.simulate(*scalars, 8).iteration_time == want == S.iteration_time(*scalars, 8)
    for bad in (np.bool_(True), 1 + 1j, np.complex64(1)):
        _raises(lambda b=bad: S.simulate([[b]] * p, bwd, 8), "forward[0][0]")
        _raises(lambda b=bad: S.iteration_time([[b]] * p, bwd, 8), "forward")


def test_summary_refuses_what_is_no_timeline():
    for t in (None, "x", 5):
        _raises(lambda t=t: S.summary(t, "x"), "t must be a Timeline")
    assert "iteration time 4" in S.summary(S.simulate([[1.0]], [[1.0]], 2), "one stage")


def test_options_without_a_name_are_looked_up_as_the_model_names_them():
    """A review's finding: option-like objects without ``name`` (which a model accepts and names by
    ``str``) were looked up by None, blaming a ``names`` the caller never gave."""
    from gpuknap.schedule import of_split
    from gpuknap.search import PipelineModel

    class Opt:
        def __init__(self, f, b, m):
            self.forward_time, self.backward_time, self.m = f, b, m

        def memory(self, k):
            return self.m * k

    model = PipelineModel(["body"] * 8, {"body": [Opt(1.0, 2.0, 1e6)]}, {"body": 0.0}, capacity=1e9, micro_batches=8)
    *_, simulated = of_split(model, [4, 4], 1e6)
    assert simulated == (8 - 1) * 12.0 + 2 * 12.0  # the 1F1B closed form of two equal stages of 4 x (1 + 2)
