"""The exact top-k splits for the ``simulated`` score: the simulated 1F1B iteration time.

A split's simulated score is the iteration time of Megatron's 1F1B schedule
(:func:`gpuknap.schedule.simulate`, no transfer time) run with each stage's
forward and backward times from its plan (the same numbers ``gpuknap timeline``
shows).  It is not a function of the stage times alone, so no dynamic program
over stages ranks it; instead a lower bound does the pruning:

    simulated >= max over s of  M * t_s + sum of t_j for j < s

(stage s runs M forwards and M backwards, its first forward waits for micro-batch
0 to cross stages 0..s-1, and the last backward still has to cross them back),
tight for equal stages, ``(M + P - 1) * t``; and, with ``T`` the sum of all
stage times and ``d_s = min(P - s - 1, M - 1)``,

    simulated >= T + (M - 1) * t_s - d_s * F_s

(stage s's first backward waits for micro-batch 0 to go forward through every
stage and back to s, and after it stage s still runs all M backwards and the
``M - d_s - 1`` forwards its warm-up left; its forward time ``F_s`` is at most
the sum of its layers' slowest forward options).  The search:

1. simulates the best splits of the closed-form 1F1B score (a good first
   k-th best ``tau``);
2. collects every split whose bounds are both at most ``tau``, stage by stage
   with all partial splits as arrays (a table of the largest prefix time each
   (stage, start) can still complete the first bound from, and the least sum
   of the stages still to come for the second), and simulates them all in
   batches (:func:`gpuknap.schedule.iteration_times`).

Every split left out has a bound, hence a simulated time, above the k-th best:
the answer is exact.  Ties are broken by the counts in lexicographic order.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..engine import report
from ..schedule import iteration_times
from ._closed_form import top_1f1b
from ._segments import SegmentTable
from ._slowest import deep_walks

#: Splits simulated per call of the batched simulator.
BATCH = 4096
#: Best splits of the closed-form score simulated first, for a k-th best ``tau``.
SEEDS = 64
#: Most splits one search may simulate before it refuses (the bound is too loose).
MAX_SIMULATED = 2_000_000
#: Relative slack between a bound and ``tau`` (the bound's sums may round differently).
SLACK = 1e-9


def _max_prefix(T: SegmentTable, m: int, tau: float) -> list[np.ndarray]:
    """Per stage s, ``[a, j]``: the largest prefix time (stages 0..s) with which stages
    s+1.. can complete a split after stage s took layers ``a:a+1+j``, every stage
    keeping ``M * t + prefix <= tau``."""
    cap = np.full((T.p + 1, T.n1), -math.inf)
    cap[T.p, T.n1 - 1] = math.inf
    for s in range(T.p - 1, -1, -1):
        band = T.band[s]
        nxt = T.pull(cap[s + 1], -math.inf)
        with np.errstate(invalid="ignore"):
            allowed = np.minimum(tau - m * band, nxt - band)
        allowed[~np.isfinite(band)] = -math.inf
        cap[s] = allowed.max(axis=1, initial=-math.inf)
    return [T.pull(cap[s + 1], -math.inf) for s in range(T.p)]


def _least_rest(T: SegmentTable) -> list[np.ndarray]:
    """Per stage s, ``[a, j]``: the least sum of stage times of stages s+1.. after stage s
    took layers ``a:a+1+j`` (``inf`` where they cannot complete the split)."""
    rest = np.full((T.p + 1, T.n1), math.inf)
    rest[T.p, T.n1 - 1] = 0.0
    for s in range(T.p - 1, -1, -1):
        rest[s] = (T.band[s] + T.pull(rest[s + 1], math.inf)).min(axis=1, initial=math.inf)
    return [T.pull(rest[s + 1], math.inf) for s in range(T.p)]


def _walk(T: SegmentTable, m: int, limit: float, slowest_forward: np.ndarray) -> np.ndarray:
    """Every split whose two bounds are at most ``limit``, as an integer array ``[N, P]``:
    stage by stage, all partial splits at once, each kept only while both bounds can
    still hold (the first exactly, by ``_max_prefix``; the second with the least
    sum of the stages still to come)."""
    cap, rest = _max_prefix(T, m, limit), _least_rest(T)
    pre = np.asarray(slowest_forward, dtype=np.float64)
    fmax = T.pull(pre, math.inf) - pre[:, None]  # [a, j]: the most forward time layers a:a+1+j can take
    a = np.zeros(1, dtype=np.int64)
    prefix, worst = np.zeros(1), np.full(1, -math.inf)
    steps = []
    for s in range(T.p):
        rows = T.band[s][a]
        d = min(T.p - s - 1, m - 1)
        after = prefix[:, None] + rows
        with np.errstate(invalid="ignore"):
            term = np.maximum(worst[:, None], (m - 1) * rows - d * np.minimum(rows, fmax[a]))
            ok = (np.isfinite(rows) & (prefix[:, None] + m * rows <= limit) & (after <= cap[s][a])
                  & (after + rest[s][a] + term <= limit))
        parent, j = np.nonzero(ok)
        if len(parent) > MAX_SIMULATED:
            raise ValueError(f"the simulated score would simulate over {MAX_SIMULATED:,} splits here; "
                             "use the 1f1b score (or fewer stages)")
        steps.append((parent, j + 1))
        a, prefix, worst = a[parent] + j + 1, after[parent, j], term[parent, j]
    counts = np.empty((len(a), T.p), dtype=np.int64)
    idx = np.arange(len(a))
    for s in range(T.p - 1, -1, -1):
        parent, n = steps[s]
        counts[:, s] = n[idx]
        idx = parent[idx]
    return counts


class _Simulator:
    """Simulated iteration times of splits ``[N, P]`` on a table (each distinct segment's
    forward and backward times asked once)."""

    def __init__(self, T: SegmentTable, m: int, stage_times: Callable[[int, int, int], tuple[float, float]]):
        self.T, self.m, self.stage_times = T, m, stage_times
        self.cache: dict[int, tuple] = {}

    def __call__(self, splits: np.ndarray) -> np.ndarray:
        T = self.T
        starts = np.concatenate((np.zeros((len(splits), 1), dtype=np.int64), np.cumsum(splits, axis=1)[:, :-1]), axis=1)
        keys = (np.arange(T.p)[None, :] * T.n1 + starts) * T.width + splits - 1
        unique, inverse = np.unique(keys, return_inverse=True)
        fb = np.empty((len(unique), 2))
        for u, key in enumerate(unique.tolist()):
            if key not in self.cache:
                rest, j = divmod(key, T.width)
                s, a = divmod(rest, T.n1)
                self.cache[key] = self.stage_times(s, a, a + j + 1)
            fb[u] = self.cache[key]
        per = fb[inverse.reshape(keys.shape)]  # [N, P, 2]
        return np.concatenate([iteration_times(per[i:i + BATCH, :, 0:1], per[i:i + BATCH, :, 1:2], self.m)
                               for i in range(0, len(splits), BATCH)] or [np.empty(0)])


def _seeds(T: SegmentTable, top: int, m: int, simulate: _Simulator) -> tuple[np.ndarray, np.ndarray, bool]:
    """The closed form's best splits on the table, their simulated times, and whether they are
    every feasible split of the table (the closed-form search found fewer than it was asked)."""
    seeds = np.array([c for c, _ in top_1f1b(T, max(top, SEEDS), m)], dtype=np.int64).reshape(-1, T.p)
    return seeds, simulate(seeds), len(seeds) < max(top, SEEDS)


def top_simulated(T: SegmentTable, top: int, micro_batches: int,
                  stage_times: Callable[[int, int, int], tuple[float, float]],
                  slowest_forward: np.ndarray, seeded: tuple | None = None) -> list[tuple]:
    """The exact ``top`` splits by simulated 1F1B time: ``[(counts, score)]``, best first.

    ``stage_times(s, a, b)`` gives the forward and backward time of stage s on
    layers ``a:b`` under its plan (asked once per distinct segment);
    ``slowest_forward`` the prefix sums over layers of the slowest forward time
    among each layer's options.  ``seeded``: ``(simulator, seeds)`` computed on
    this table already (:meth:`Simulated.upper`).
    """
    m = micro_batches
    simulate, (seeds, seed_times, every) = seeded if seeded else (None, (None, None, None))
    if simulate is None:
        simulate = _Simulator(T, m, stage_times)
        seeds, seed_times, every = _seeds(T, top, m, simulate)
    splits, scores = seeds, seed_times
    if not every:
        tau = float(np.sort(seed_times)[top - 1])
        splits = _walk(T, m, tau * (1 + SLACK), slowest_forward)
        report("simulated splits", 0, len(splits))
        scores = simulate(splits)
    order = np.lexsort(tuple(splits[:, s] for s in range(T.p - 1, -1, -1)) + (scores,))[:top]
    return [(tuple(splits[i].tolist()), float(scores[i])) for i in order.tolist()]


class Simulated:
    """The ``simulated`` score for the certified rounds: stage s alone is busy ``M * t_s``, so a
    split using a segment slower than ``limit`` simulates slower than ``M * limit``.

    ``stage_times(s, a, b)``: forward and backward time of stage s on layers ``a:b`` under its
    plan; ``slowest_forward``: prefix sums of each layer's slowest forward option.  The exact
    top k of a table costs a walk over every split its bounds admit, so :meth:`upper` first
    gives the rounds a cheap k-th best (the closed form's best splits, simulated): a table
    that cannot certify it is not searched exactly."""

    name = "simulated"
    prunes = True

    def __init__(self, micro_batches: int, stage_times: Callable[[int, int, int], tuple[float, float]],
                 slowest_forward: np.ndarray):
        self.m, self.stage_times, self.slowest_forward = micro_batches, stage_times, slowest_forward
        self._seeded: tuple = (None, None)

    def upper(self, table: SegmentTable, k: int) -> float:
        """An upper bound on the k-th best score (``inf`` when the table holds fewer than k splits)."""
        simulate = _Simulator(table, self.m, self.stage_times)
        with deep_walks(table.p):
            seeds, times, every = _seeds(table, k, self.m, simulate)
        self._seeded = (table, (simulate, (seeds, times, every)))
        return float(np.sort(times)[k - 1]) if len(times) >= k else math.inf

    def top(self, table: SegmentTable, k: int) -> list[tuple]:
        seeded = self._seeded[1] if self._seeded[0] is table else None
        with deep_walks(table.p):
            return top_simulated(table, k, self.m, self.stage_times, self.slowest_forward, seeded)

    def reach(self, limit: float) -> float:
        return self.m * limit

    def limit_for(self, score: float) -> float:
        return score / self.m
