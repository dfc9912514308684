"""Hypothesis strategies: small fronts, groups and budgets in tiny byte units."""
from __future__ import annotations

from hypothesis import strategies as st

from gpuknap import LayerOption, Layers, Stage

KINDS = ("a", "b", "c")


@st.composite
def options(draw, dyadic=True):
    """One LayerOption whose memory is >= 0 for every in-flight count 1..4."""
    per = draw(st.integers(0, 12))
    held = draw(st.integers(0, 10))
    if dyadic:
        fwd = draw(st.integers(0, 40)) / 4
        bwd = draw(st.integers(0, 40)) / 4
    else:
        fwd = draw(st.floats(0, 50, allow_nan=False, allow_subnormal=False))
        bwd = draw(st.floats(0, 50, allow_nan=False, allow_subnormal=False))
    excess = ()
    if draw(st.booleans()):
        k = draw(st.integers(1, 4))
        excess = ((k, draw(st.integers(0, k * per + held))),)
    return LayerOption(draw(st.sampled_from("NSCF")), per, fwd, bwd, held, excess)


@st.composite
def fronts(draw, dyadic=True, max_options=4):
    return {k: draw(st.lists(options(dyadic), min_size=1, max_size=max_options)) for k in KINDS}


@st.composite
def groups(draw, max_layers=5, max_groups=3):
    gs = draw(st.lists(
        st.builds(Layers, st.sampled_from(KINDS), st.integers(0, 3), st.integers(1, 4)),
        min_size=0, max_size=max_groups))
    total = sum(g.count for g in gs)
    if total > max_layers:
        gs = gs[:1] if gs and gs[0].count <= max_layers else []
    return gs


budgets = st.one_of(st.integers(-5, 150), st.integers(-2, 40).map(lambda n: n * 4))
buckets = st.sampled_from([1, 2, 3, 4, 7])


@st.composite
def candidates(draw, max_stages=4):
    stages = draw(st.lists(
        st.builds(Stage, groups(max_layers=6), budgets, st.sampled_from([0.0, 0.5, 3.0])),
        min_size=1, max_size=max_stages))
    return stages
