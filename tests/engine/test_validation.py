"""Bad input raises ValueError naming what is wrong."""
from __future__ import annotations

import math

import pytest

from gpuknap import (
    LayerOption,
    Layers,
    Stage,
    choose,
    least_times,
    pp_lite,
    rank,
    suffix_times,
)

FR = {"x": [LayerOption("a", 4, 1, 2), LayerOption("b", 1, 3, 3)]}


class Loose:
    """An option-like object the engine checks only when it uses it (a LayerOption refuses these
    numbers when built)."""

    def __init__(self, per, fwd, bwd, held=0.0):
        self.name, self.per, self.forward_time, self.backward_time, self.held = "a", per, fwd, bwd, held

    def memory(self, k):
        return k * self.per + self.held


@pytest.mark.parametrize("fronts, groups, match", [
    ({"x": [Loose(1, math.nan, 1)]}, [Layers("x", 1)], "forward_time"),
    ({"x": [Loose(1, 1, -2)]}, [Layers("x", 1)], "backward_time"),
    ({"x": [Loose(1, 1, 1, held=-5)]}, [Layers("x", 1)], "negative"),
    ({"x": [LayerOption("a", 1, 1, 1, excess=((1, 3),))]}, [Layers("x", 1)], "negative"),
    (FR, [Layers("y", 1)], "'y' is missing"),
    ({"x": []}, [Layers("x", 1)], "empty"),
    (FR, [Layers("x", 1, 0)], "in_flight"),
    (FR, [Layers("x", -1)], "count"),
    (FR, "x", "groups"),
    ({"x": [object()]}, [Layers("x", 1)], "not an option"),
])
def test_bad_input_everywhere(fronts, groups, match):
    with pytest.raises(ValueError, match=match):
        choose(groups, fronts, 100, 1)
    with pytest.raises(ValueError, match=match):
        least_times(groups, fronts, 100, 1)
    with pytest.raises(ValueError, match=match):
        pp_lite([Stage(groups, 100)], fronts, 1)
    with pytest.raises(ValueError, match=match):
        rank([[Stage(groups, 100)]], fronts, 1, backend="numpy")


@pytest.mark.parametrize("bucket", [0, -1, math.nan, math.inf, "1"])
def test_bad_bucket(bucket):
    with pytest.raises(ValueError, match="bucket"):
        choose([Layers("x", 1)], FR, 10, bucket)
    with pytest.raises(ValueError, match="bucket"):
        rank([[Stage([Layers("x", 1)], 10)]], FR, bucket)


def test_suffix_times_budget_length_and_counts():
    layers = [Layers("x", 1), Layers("x", 1)]
    with pytest.raises(ValueError, match="len\\(layers\\) \\+ 1"):
        suffix_times(layers, FR, [10, 10])
    with pytest.raises(ValueError, match="count must be 1"):
        suffix_times([Layers("x", 2)], FR, [10, 10])


def test_bad_budget_fixed_time_and_candidates():
    with pytest.raises(ValueError, match="budget"):
        choose([Layers("x", 1)], FR, math.nan)
    with pytest.raises(ValueError, match="fixed_time"):
        pp_lite([Stage([Layers("x", 1)], 10, math.nan)], FR)
    with pytest.raises(ValueError, match="non-empty"):
        pp_lite([], FR)
    with pytest.raises(ValueError, match=r"candidates\[1\]"):
        rank([[Stage([Layers("x", 1)], 10)], []], FR, backend="numpy")
    with pytest.raises(ValueError, match="max_bytes"):
        rank([[Stage([Layers("x", 1)], 10)]], FR, max_bytes=0)
    with pytest.raises(ValueError, match="backend"):
        rank([[Stage([Layers("x", 1)], 10)]], FR, backend="tpu")


def test_pp_lite_validates_every_stage_before_solving():
    stages = [Stage([Layers("x", 5)], -1), Stage([Layers("nope", 1)], 10)]
    with pytest.raises(ValueError, match="nope"):
        pp_lite(stages, FR)
