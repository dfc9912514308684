"""Results and models keep their own copies of what they were given, and bad arguments of every
kind are ValueErrors naming them (a red-team round of 2026-12-02).  References are ``pp_lite`` and
``PipelineModel`` runs on the original inputs, not stored numbers."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from gpuknap import LayerOption, Layers, PipelineModel, Stage, best_splits, load_spec, pp_lite, rank

FAST, SLOW = LayerOption("FAST", 10, 1, 1), LayerOption("SLOW", 1, 1, 9)


def test_a_ranking_does_not_follow_later_edits_of_its_inputs():
    cand = [Stage([Layers("a", 2)], 100.0)]
    fronts = {"a": [FAST, SLOW]}
    want = pp_lite([Stage([Layers("a", 2)], 100.0)], {"a": [FAST, SLOW]}, 1)
    r = rank([cand], fronts, 1, backend="numpy")
    cand[0] = Stage([Layers("a", 2)], 5.0)
    fronts["a"] = [SLOW]
    fronts.clear()
    assert r.choice(0).times == want.times == tuple(r.times(0))
    m = PipelineModel(("a",) * 4, {"a": [FAST, SLOW]}, {"a": 0}, 45.0, 4)
    table = [[4], [1]]
    want = pp_lite(m.stages([2, 2], [[4], [1]]), m.fronts, 1)
    r = m.rank(np.array([[2, 2]]), bucket=1, backend="numpy", in_flight=table)
    table[0][0] = 1
    assert r.choice(0).times == want.times and r.slowest[0] == max(want.times)


def test_a_model_keeps_its_own_static_and_fronts():
    static, options = {"a": 0.0}, [LayerOption("A", 10, 1, 1)]
    m = PipelineModel(("a",) * 4, {"a": options}, static, 100.0, 4)
    first = [s.budget for s in m.stages([2, 2])]
    static["a"] = 30.0
    options.append(LayerOption("B", 1, 5, 5))
    assert [s.budget for s in m.stages([1, 3])] == first == [100.0, 100.0]
    assert len(m.fronts["a"]) == 1


@pytest.mark.parametrize("fixed", [-5.0, 1e300])
def test_a_stage_time_outside_0_to_1e200_is_refused(fixed):
    stage = Stage([Layers("a", 2)], 100.0, fixed)
    for call in (lambda: pp_lite([stage], {"a": [FAST]}, 1), lambda: rank([[stage]], {"a": [FAST]}, 1)):
        with pytest.raises(ValueError, match="fixed_time must be from 0 to 1e"):
            call()


def test_bools_are_not_numbers_or_counts():
    with pytest.raises(ValueError, match="per_micro_batch"):
        LayerOption("A", True, 1, 1)
    with pytest.raises(ValueError, match="held_once"):
        LayerOption("A", 1, 1, 1, held_once=True)
    with pytest.raises(ValueError, match="excess"):
        LayerOption("A", 10, 1, 1, excess=((True, 5),))
    m = PipelineModel(("a",) * 4, {"a": [LayerOption("A", 10, 1, 2)]}, {"a": 1}, 1000.0, 4)
    for call in (lambda: m.stages([True, 3]), lambda: m.plan([True, 3])):
        with pytest.raises(ValueError, match=r"counts\[0\]"):
            call()
    with pytest.raises(ValueError, match="bound must be True or False"):
        best_splits(m, 2, bound="no", backend="numpy")


def test_wrong_types_are_value_errors_naming_the_argument(tmp_path):
    m = PipelineModel(("a",) * 4, {"a": [FAST, SLOW]}, {"a": 0}, 45.0, 4)
    for call in (lambda: m.stages([2, 2], in_flight=5), lambda: best_splits(m, 2, in_flight=5, backend="numpy"),
                 lambda: m.rank(np.array([[2, 2]]), in_flight=5, backend="numpy")):
        with pytest.raises(ValueError, match="in_flight"):
            call()
    with pytest.raises(ValueError, match="path"):
        load_spec(None)
    r = rank([[Stage([Layers("a", 2)], 100.0)]], {"a": [FAST]}, 1, backend="numpy")
    for bad in ("0", None, 1.0, True):
        with pytest.raises(ValueError, match="candidate index must be an integer"):
            r.times(bad)
        with pytest.raises(ValueError, match="candidate index must be an integer"):
            r.choice(bad)
    with pytest.raises(IndexError):
        r.times(5)


def test_absurd_memory_never_fits_and_warns_nothing():
    m = PipelineModel(("a",) * 4, {"a": [LayerOption("A", 1, 1, 1, held_once=1e308)]}, {"a": 0}, 100.0, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert best_splits(m, 2, backend="numpy") == []


def test_an_options_excess_is_its_own_tuple():
    excess = [(1, 5)]
    option = LayerOption("A", 10, 1, 1, excess=excess)
    excess[0] = (1, 0)
    assert option.excess == ((1, 5),) and option.memory(1) == 5 and hash(option)


def test_a_models_mappings_cannot_be_edited_through_it():
    """Its stages are cached: an edit through the model would leave one Ranking contradicting
    itself (slowest from the new budgets, choices from the old), so edits raise instead."""
    import pickle  # noqa: PLC0415

    m = PipelineModel(("a",) * 4, {"a": [FAST, SLOW]}, {"a": 5}, 45.0, 4)
    before = m.rank(np.array([[2, 2]]), bucket=1, backend="numpy")
    for edit in (lambda: m.static.__setitem__("a", 0), lambda: m.fronts.__setitem__("a", (FAST,)),
                 lambda: m.static.pop("a"), lambda: m.fronts.clear()):
        with pytest.raises((TypeError, AttributeError)):
            edit()
    after = m.rank(np.array([[2, 2]]), bucket=1, backend="numpy")
    assert after.slowest.tolist() == before.slowest.tolist() == [max(before.choice(0).times)]
    again = pickle.loads(pickle.dumps(m))  # sweeps send models to workers
    assert again == m and dict(again.static) == {"a": 5} and again.fronts["a"] == (FAST, SLOW)


def test_a_rankings_arrays_and_attributes_are_its_own():
    r = rank([[Stage([Layers("a", 2)], 100.0)], [Stage([Layers("a", 2)], 5.0)]], {"a": [FAST, SLOW]}, 1)
    want = r.slowest.tolist()
    for name in ("slowest", "order"):
        with pytest.raises(AttributeError):
            setattr(r, name, [0.0, 0.0])
        with pytest.raises(ValueError):
            getattr(r, name).setflags(write=True)
    assert r.slowest.tolist() == want and r.order.tolist() == [int(i) for i in np.argsort(want, kind="stable")]
    m = PipelineModel(("a",) * 4, {"a": [FAST, SLOW]}, {"a": 5}, 45.0, 4)
    empty = m.rank(np.zeros((0, 2), dtype=np.int64), bucket=1, backend="numpy")
    assert empty.stage_table().shape == (0, 2) and rank([], {"a": [FAST]}).stage_table().shape[0] == 0


def test_an_options_parts_are_its_own_pairs():
    parts = [["compute", 1.0], ["tp", 0.5]]
    o = LayerOption("x", 10, 1, 1, parts=parts)
    parts[0][1] = 99.0
    assert o.parts == (("compute", 1.0), ("tp", 0.5))


def test_a_work_limit_takes_numpy_integers():
    from gpuknap import work_limit  # noqa: PLC0415
    from gpuknap.engine import max_cells  # noqa: PLC0415

    with work_limit(np.int64(10**9)):
        assert max_cells() == 10**9 and type(max_cells()) is int
