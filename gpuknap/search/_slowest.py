"""The ``slowest`` score: a split is as fast as its slowest stage.

On a table of segment times, ``count(tau)`` -- the number of splits whose
stages all take at most ``tau``, capped at k -- is a product of 0/1 matrices
(:meth:`SegmentTable.count`); a binary search over the distinct segment
times finds ``tau_k``, the k-th best score.  The splits scoring below
``tau_k`` (fewer than k) and the lexicographically first splits scoring
exactly ``tau_k`` are then walked depth-first with "can the rest still be
covered" tables, so every step leads to an answer.  Ties are broken by the
counts in lexicographic order.

Also here: a split's exact score for ``slowest`` and ``1f1b`` as a fraction
(:func:`exact_score`), the value splits are ranked by.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from fractions import Fraction
from typing import Any, Iterator

import numpy as np

from ._segments import SegmentTable


def exact_score(times: Any, score: str, micro_batches: int) -> Fraction:
    """A split's score, exactly: ``slowest``, or ``(M - 1) * slowest + sum(times)``
    for the 1F1B iteration time.  Splits are ranked by this exact value."""
    slowest = Fraction(max(times))
    if score == "slowest":
        return slowest
    return (micro_batches - 1) * slowest + sum(map(Fraction, times))


def score_of(times: Any, score: str, micro_batches: int) -> float:
    """A split's score as reported: the exact score rounded once to a float."""
    return float(exact_score(times, score, micro_batches))


def _walk_lex(T: SegmentTable, tau: float, need_hit: bool, limit: int) -> list[tuple]:
    """Splits with all times <= tau (and one == tau if ``need_hit``), lexicographic, at most ``limit``."""
    p = T.p
    ok, hit = T.cover(tau)
    out: list[tuple] = []
    counts: list[int] = []

    def walk(s: int, a: int, hit_yet: bool) -> None:
        if len(out) >= limit:
            return
        if s == p:
            out.append(tuple(counts))
            return
        for b in T.end_range(a):
            t = T.at(s, a, b)
            if not t <= tau:
                continue
            now = hit_yet or t == tau or not need_hit
            if not (ok[s + 1, b] if now else hit[s + 1, b]):
                continue
            counts.append(b - a)
            walk(s + 1, b, now)
            counts.pop()
            if len(out) >= limit:
                return

    start_ok = hit[0, 0] if need_hit else ok[0, 0]
    if start_ok:
        walk(0, 0, False)
    return out


def _times_of(T: SegmentTable, counts: tuple) -> list[float]:
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    return [T.at(s, bounds[s], bounds[s + 1]) for s in range(len(counts))]


def top_slowest(T: SegmentTable, top: int) -> list[tuple]:
    """The best ``top`` splits by slowest stage, as ``(counts, score)``, ties by counts."""
    values = T.values()
    if len(values) == 0 or T.count(values[-1], 1) == 0:
        return []
    lo, hi = 0, len(values) - 1
    if T.count(values[-1], top) < top:
        lo = hi  # fewer than k splits in all: take every one
    while lo < hi:
        mid = (lo + hi) // 2
        if T.count(values[mid], top) >= top:
            hi = mid
        else:
            lo = mid + 1
    tau_k = values[lo]
    # Fewer than k splits score below tau_k (none when k is 1: nothing to walk).
    below = _walk_lex(T, values[lo - 1], False, top) if lo > 0 and top > 1 else []
    ranked = sorted(((max(_times_of(T, c)), c) for c in below))
    at_tau = _walk_lex(T, tau_k, True, top - len(ranked))
    return [(c, t) for t, c in ranked] + [(c, float(tau_k)) for c in at_tau]


@contextmanager
def deep_walks(stages: int) -> Iterator[None]:
    """Room for walks that recurse once per stage."""
    depth = sys.getrecursionlimit()
    sys.setrecursionlimit(max(depth, stages + 200))
    try:
        yield
    finally:
        sys.setrecursionlimit(depth)


class Slowest:
    """The ``slowest`` score for the certified rounds: a split using a segment slower than
    ``limit`` scores more than ``limit``."""

    name = "slowest"
    prunes = True

    def top(self, table: SegmentTable, k: int) -> list[tuple]:
        with deep_walks(table.p):
            return top_slowest(table, k)

    def reach(self, limit: float) -> float:
        return limit

    def limit_for(self, score: float) -> float:
        return score
