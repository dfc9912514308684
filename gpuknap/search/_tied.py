"""Exact top-k walks by bottleneck, in the order of :func:`._ties.tie_key`.

The ``slowest`` and ``1f1b`` scores are functions of a split's bottleneck
``tau`` (its slowest stage) and its total (the sum of its stage times):
``tau`` and ``(M - 1) tau + total``.  Splits are taken bottleneck by
bottleneck, in increasing order, from the least bottleneck any split attains.
For each, a dynamic program over stages gives, for every (stage, first layer),
the best way to finish the split with every stage ``<= tau`` (and with one
stage ``== tau``) in the order the tie rule uses after the score:

1. the least total (exact integers, :class:`._exact.ExactTimes`);
2. among those, whether one without an idle stage (time 0) exists;
3. the largest least stage time, with and without idle stages allowed.

(Each is a monotone combination of the stage before and the best of the
stages after, so the program is exact.)  A best-first walk cut by those
values then visits only partial splits whose best completion can still
enter the top k -- a better key ``(score, idle, total, spread)``, or an
equal one with counts that sort first.  The scan stops when the least score
of the next bottleneck exceeds the k-th best.
"""
from __future__ import annotations

import heapq
import math
from typing import Callable

import numpy as np

from ..engine import report
from ._exact import ExactTimes, Wide
from ._segments import SegmentTable


class Finish:
    """The best finishes from every (stage, first layer): least ``total`` (Wide), whether every
    least-total finish has an idle stage (``idle``), and the largest least stage time over all
    of them (``low``) and over those without an idle stage (``low_ok``, ``-inf`` if none)."""

    def __init__(self, total: Wide, idle: np.ndarray, low: np.ndarray, low_ok: np.ndarray):
        self.total, self.idle, self.low, self.low_ok = total, idle, low, low_ok

    @classmethod
    def empty(cls, T: SegmentTable, X: ExactTimes) -> "Finish":
        shape = (T.p + 1, T.n1)
        return cls(Wide.infinite(shape, X.band), np.ones(shape, dtype=bool), np.full(shape, -math.inf),
                   np.full(shape, -math.inf))

    def pull(self, T: SegmentTable, s: int) -> tuple:
        return (self.total[s].pull(T), T.pull(self.idle[s], True), T.pull(self.low[s], -math.inf),
                T.pull(self.low_ok[s], -math.inf))

    def set_row(self, s: int, sources: list) -> None:
        """Row s from candidate finishes ``(allowed [n1, w], t [n1, w], t exact (Wide), next pulled)``."""
        totals, best = _least([(ok, t_x, nxt[0]) for ok, _, t_x, nxt in sources])
        self.total[s] = best
        any_ok = np.zeros(best.hi.shape, dtype=bool)
        low = np.full(best.hi.shape, -math.inf)
        low_ok = np.full(best.hi.shape, -math.inf)
        for (ok, t, _, (_, idle, nlow, nlow_ok)), total in zip(sources, totals):
            tied = (total.hi == best.hi[:, None]) & (total.lo == best.lo[:, None]) & (best.hi < best.inf_hi)[:, None]
            clean = tied & (t > 0) & ~idle
            any_ok |= clean.any(axis=1)
            low = np.maximum(low, np.where(tied, np.minimum(t, nlow), -math.inf).max(axis=1, initial=-math.inf))
            low_ok = np.maximum(low_ok, np.where(clean, np.minimum(t, nlow_ok), -math.inf).max(axis=1,
                                                                                              initial=-math.inf))
        self.idle[s], self.low[s], self.low_ok[s] = ~any_ok, low, low_ok


def _least(sources: list) -> tuple[list, Wide]:
    """``(each source's totals, their least per row)`` from ``(allowed, t exact, next total pulled)``."""
    totals = [(t_x + nxt).where(ok) for ok, t_x, nxt in sources]
    best = totals[0].min_rows()
    for other in totals[1:]:
        best = best.minimum(other.min_rows())
    return totals, best


def least_total(T: SegmentTable, X: ExactTimes) -> int | None:
    """The least total of any split (no bound on its stages), exact; None if there is none.  The
    ``total`` of :func:`finishes` at ``tau = inf`` without the rest of it (a third of the work)."""
    total = Wide.infinite((T.p + 1, T.n1), X.band)
    total.hi[T.p, T.n1 - 1] = 0
    for s in range(T.p - 1, -1, -1):
        t = T.band[s]
        total[s] = _least([(t <= math.inf, X.band[s], total[s + 1].pull(T))])[1]
    return total.value(0, 0)


def finishes(T: SegmentTable, X: ExactTimes, tau: float) -> tuple[Finish, Finish]:
    """The best finishes with every stage ``<= tau`` (``free``) and with one ``== tau`` (``hit``)."""
    free, hit = Finish.empty(T, X), Finish.empty(T, X)
    for f in (free,):
        f.total.hi[T.p, T.n1 - 1] = 0
        f.idle[T.p, T.n1 - 1] = False
        f.low[T.p, T.n1 - 1] = f.low_ok[T.p, T.n1 - 1] = math.inf
    for s in range(T.p - 1, -1, -1):
        t, t_x = T.band[s], X.band[s]
        under, exact = t <= tau, t == tau
        free_next, hit_next = free.pull(T, s + 1), hit.pull(T, s + 1)
        free.set_row(s, [(under, t, t_x, free_next)])
        hit.set_row(s, [(exact, t, t_x, free_next), (under, t, t_x, hit_next)])
    return free, hit


def top_tied(T: SegmentTable, top: int, primary: Callable[[int, int], int],
             floor: Callable[[int, int], int]) -> list[tuple]:
    """The best ``top`` splits by ``(primary(tau_x, total_x), idle, total, spread, counts)``, as
    ``(counts, score)`` with the score the primary value (exact integers in the table's unit)
    rounded once to a float.  ``floor(tau_x, least_total)``: the least primary of any split with
    bottleneck ``tau`` (the scan stops once it exceeds the k-th best)."""
    X = ExactTimes(T)
    p = T.p
    least_sum = least_total(T, X)
    if least_sum is None:
        return []
    heap: list[tuple] = []  # the best k as negated keys: heap[0] is the worst

    def worst() -> tuple:
        item = heap[0]
        return (-item[0], -item[1], -item[2], -item[3]), tuple(-c for c in item[4])

    def beaten(key: tuple, prefix: tuple) -> bool:
        """Can no split with this best key and counts prefix enter the top k?"""
        if len(heap) < top:
            return False
        w_key, w_counts = worst()
        if key != w_key:
            return key > w_key
        return prefix > w_counts[:len(prefix)]

    def offer(key: tuple, counts: tuple) -> None:
        item = (-key[0], -int(key[1]), -key[2], -key[3], tuple(-c for c in counts))
        if len(heap) < top:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)

    taus = T.values()
    first = T.first_feasible(taus)
    for i in range(first, len(taus)):
        tau = float(taus[i])
        report("bottlenecks", i, len(taus))
        tau_x = X.value(tau)
        if len(heap) >= top and floor(tau_x, least_sum) > worst()[0][0]:
            break  # every later bottleneck scores more than the k-th best
        if not T.cover(tau)[1][0, 0]:
            continue  # no split has this bottleneck exactly
        free, hit = finishes(T, X, tau)
        counts: list[int] = []

        def walk(s: int, a: int, total: int, idle: bool, least: float, hit_yet: bool) -> None:
            if s == p:
                offer((primary(tau_x, total), idle, total, tau_x - X.value(least)), tuple(counts))
                return
            options = []
            for b in T.end_range(a):
                t = float(T.band[s, a, b - a - 1])
                if not t <= tau:
                    continue
                now = hit_yet or t == tau
                after = free if now else hit
                rest = after.total.value(s + 1, b)
                if rest is None:
                    continue
                t_x = X.band.value(s, a, b - a - 1)
                sub = total + t_x + rest
                idle_now = idle or t == 0.0
                if idle_now or after.idle[s + 1, b]:
                    flag, mn = True, min(least, t, float(after.low[s + 1, b]))
                else:
                    flag, mn = False, min(least, t, float(after.low_ok[s + 1, b]))
                key = (primary(tau_x, sub), flag, sub, tau_x - X.value(mn))
                options.append((key, b, t, t_x, now, idle_now))
            options.sort(key=lambda o: (o[0], o[1]))
            for key, b, t, t_x, now, idle_now in options:
                counts.append(b - a)
                if not beaten(key, tuple(counts)):
                    walk(s + 1, b, total + t_x, idle_now, min(least, t), now)
                counts.pop()

        walk(0, 0, 0, False, math.inf, False)
    best = sorted((-item[0], -item[1], -item[2], -item[3], tuple(-c for c in item[4])) for item in heap)
    return [(key[4], X.to_float(key[0])) for key in best]
