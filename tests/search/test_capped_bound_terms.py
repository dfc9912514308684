"""The lower bound of a simulated search stopped at a cap, term by term, against brute force.

A stopped search bounds the best score by the least of: what the walk proved about the
splits it did not simulate (the last completed pass's cut, or the stopped pass's frontier),
the low times of the splits it simulated but did not rank, and the first score, each with
a relative slack for rounding.  The cap tests of ``test_simulated.py`` check that bound is
at most the true best; these pin two terms they leave loose: the last completed pass's
cut where the cap is met outside any pass (no frontier), and the slack."""
from __future__ import annotations

import math
import random

import numpy as np
from test_simulated import brute_simulated, decimal_model, shaped_model

from gpuknap import best_splits


def _start_poorly(monkeypatch) -> None:
    """The walk starts from the worst of its first splits, with a beam of 1 (a stopped search
    then often has not found the best)."""
    import gpuknap.search._simulated as search_simulated
    import gpuknap.search._simulated_score as simulated_score

    real = search_simulated.first_bound

    def poor(B, top, earlier=None):
        pool, low, high = real(B, top, earlier)
        worst = np.argsort(high, kind="stable")[-1:]
        return pool[worst], low[worst], high[worst]

    monkeypatch.setattr(search_simulated, "BEAM", 1)
    monkeypatch.setattr(search_simulated, "first_bound", poor)
    monkeypatch.setattr(simulated_score, "first_bound", poor)


def test_a_search_capped_while_moving_layers_keeps_the_bound_of_its_passes(monkeypatch):
    """Every pass stops at once to move layers between stages, and the cap on simulated splits
    is 0: the search stops while adding the splits those moves reach, outside any pass (no
    frontier of a pass to bound the rest).  Its lower bound is then what the walk had proved
    before (at least the least bound of any split): finite, positive, at most the true best
    (brute force) and the first score; not -inf."""
    import gpuknap.search._simulated as search_simulated

    monkeypatch.setattr(search_simulated, "MAX_SIMULATED", 0)
    monkeypatch.setattr(search_simulated, "LONG_PASS", 0)
    monkeypatch.setattr(search_simulated, "EARLY_PASS", 0)
    _start_poorly(monkeypatch)
    stops = []  # per stop: whether the splits being added came from the moves (their times given)
    add = search_simulated._Found.add

    def recorded(self, splits, B, times=None):
        try:
            return add(self, splits, B, times)
        except search_simulated.Unfinished:
            stops.append(times is not None)
            raise

    monkeypatch.setattr(search_simulated._Found, "add", recorded)
    moved = 0
    for seed in range(20):
        rng = random.Random(9800 + seed)
        p = 2 + seed % 5
        model = shaped_model(rng, rng.randint(p, min(p + 7, 12)), p)
        want = brute_simulated(model, p, 1)
        for top in (1, 3):
            stops.clear()
            got = best_splits(model, p, top, "simulated", 1, backend="numpy")
            if got.exact:
                assert [(s, c) for c, s, _ in got] == want[:top], (seed, top)
                continue
            assert math.isfinite(got.lower_bound) and 0 < got.lower_bound, (seed, top, got.lower_bound)
            assert got.lower_bound <= want[0][0] <= got[0][1], (seed, top)
            moved += stops == [True]
    assert moved  # (some searches did stop outside a pass, where the bound of the passes is all there is)


def test_a_capped_bound_keeps_its_slack_for_rounding(monkeypatch):
    """Equal layers with times in tenths and few micro-batches: many splits simulate a few
    units in the last place apart.  Stopped at a cap of 4 simulated splits with only the best
    found ranked exactly, the search's lower bound is at most the true best (brute force)
    though the bounds it comes from may round above a split's time; and some of those bounds
    are that close to the true best (within the slack), so a bound without it would be over."""
    import gpuknap.search._simulated as search_simulated

    monkeypatch.setattr(search_simulated, "MAX_SIMULATED", 4)
    monkeypatch.setattr(search_simulated, "RANKED", 1)
    _start_poorly(monkeypatch)
    close = 0
    for seed in range(80):
        rng = random.Random(9800 + seed)
        p = 2 + seed % 5
        model = decimal_model(rng, rng.randint(p, 12))
        want = brute_simulated(model, p, 1)
        for top in (1, 3):
            got = best_splits(model, p, top, "simulated", 1, backend="numpy")
            if got.exact:
                assert [(s, c) for c, s, _ in got] == want[:top], (seed, top)
                continue
            best = want[0][0]
            assert got.lower_bound <= best <= got[0][1], (seed, top, got.lower_bound, best)
            close += got.lower_bound < got[0][1] and best - got.lower_bound <= 2 * search_simulated.SLACK * best
    assert close  # (the slack is what keeps those bounds at most the true best)
