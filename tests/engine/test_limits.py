"""The work limit and progress reports: estimates are made before any pass, answers do not change."""
from __future__ import annotations

import os

import pytest
from paths import EXAMPLES

from gpuknap import (
    LayerOption,
    Layers,
    WorkTooLarge,
    best_splits,
    choose,
    least_times,
    work_limit,
)
from gpuknap.engine import DEFAULT_MAX_CELLS, max_cells, reporting
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
        with pytest.raises(WorkTooLarge, match="bucket of at least"):
            choose(GROUPS_SMALL, FR_SMALL, 10**6, 1)
        with pytest.raises(WorkTooLarge):
            least_times(GROUPS_SMALL, FR_SMALL, 10**6, 1)
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
