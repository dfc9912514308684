"""Shared set-up of the benchmarks: the demo profile and random plausible splits."""
from __future__ import annotations

import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpuknap.engine import INFEASIBLE, MEGABYTE, FrontTable, canonical, verdict  # noqa: E402  # noqa: E402
from gpuknap.formats import sapp_ppb  # noqa: E402

DEMO = os.path.join(ROOT, "..", "shared", "cases", "sapp_ppb_demo.json")
if not os.path.exists(DEMO):
    DEMO = os.path.join(ROOT, "gpuknap", "examples", "sapp_ppb_demo.json")
STAGES, MICRO_BATCHES, CAPACITY = 16, 32, "56000MB"


def demo_model():
    return sapp_ppb.load(DEMO, CAPACITY, MICRO_BATCHES)


def stage_bounds(model, stages):
    """Per stage, the most layers it can hold with a feasible choice, whatever its position.

    A stage is feasible only if a contiguous run of that many layers fits with its
    lightest options; we take, per stage index, the largest n such that some start
    gives a feasible stage (a search driver's usual memory pre-filter).
    """
    table = FrontTable(model.fronts, MEGABYTE)
    inflight = model.default_in_flight(stages)
    bounds = []
    for s in range(stages):
        best = 0
        for n in range(1, model.layers - stages + 2):
            ok = False
            for start in range(s, model.layers - (stages - s) + 2 - n):
                g = model.segment_groups(start, start + n, inflight[s][0])
                if verdict(canonical(g, model.budget_of(g)), table).kind != INFEASIBLE:
                    ok = True
                    break
            if ok:
                best = n
        bounds.append(best)
    return bounds


def random_splits(model, stages, count, seed=0):
    """``count`` splits drawn uniformly among those with every stage within its bound
    (vectorised: stage by stage, each row draws its count from the exact
    conditional distribution given the layers left)."""
    rng = np.random.default_rng(seed)
    bounds = stage_bounds(model, stages)
    n_layers = model.layers
    ways = np.zeros((stages + 1, n_layers + 1), dtype=object)  # ways[s][r]: stages s.. take r layers
    ways[stages][0] = 1
    for s in range(stages - 1, -1, -1):
        for r in range(n_layers + 1):
            ways[s][r] = sum(ways[s + 1][r - n] for n in range(1, min(bounds[s], r) + 1))
    if ways[0][n_layers] == 0:
        raise ValueError("no split fits the stage bounds")
    out = np.empty((count, stages), dtype=np.int64)
    left = np.full(count, n_layers, dtype=np.int64)
    for s in range(stages):
        top = max(bounds[s], 1)
        cdf = np.ones((n_layers + 1, top))
        for r in range(n_layers + 1):
            total = ways[s][r]
            if total == 0:
                continue
            acc = 0
            for n in range(1, top + 1):
                if n <= r:
                    acc += ways[s + 1][r - n]
                cdf[r, n - 1] = float(acc) / float(total) if n <= r else 1.0
        u = rng.random(count)
        pick = (u[:, None] >= cdf[left]).sum(axis=1) + 1
        out[:, s] = pick
        left -= pick
    assert (left == 0).all()
    return out
