"""The exact top-k splits for the 1F1B score ``(M - 1) * slowest + sum of stage times``.

Splits are grouped by their bottleneck ``tau``.  From the least bottleneck any
split attains (a binary search over counts), bottlenecks are taken in
increasing order; for each, a dynamic program over stages gives the exact
least sum of the remaining stages with every time ``<= tau`` (and with one
``== tau``), and a best-first walk cut by those sums collects the splits whose
bottleneck is exactly ``tau`` and that can still enter the top k (a better
score, or an equal one with counts that sort first).  The scan stops once
``(M - 1) * tau`` plus the least sum of any split exceeds the k-th best.
Bottlenecks no split attains exactly are skipped by a boolean cover test
before any sum is computed.

Sums are exact: every segment time (a float) is an integer times a power of
two, so all of them are integers in units of the smallest power.  Those
integers can exceed 64 bits (a time of 4.3 has 50 fractional bits, a sum of
64 stages of 1000 reaches 2**66), so the tables hold them as two int64 limbs,
``hi * 2**40 + lo``, added with a carry and compared limb by limb: exact, and
a few times the cost of plain int64 instead of Python integers in object
arrays.  Scores are Python integers, rounded once to a float when reported.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from ..engine import report
from ._segments import SegmentTable
from ._slowest import deep_walks

LIMB = 40
MASK = (1 << LIMB) - 1


class Wide:
    """Exact non-negative integers ``hi * 2**LIMB + lo`` in two arrays; ``hi >= inf_hi`` is infinity.

    With values beyond what two int64 limbs hold, ``hi`` is an object array of
    Python integers: slower, still exact.
    """

    __slots__ = ("hi", "lo", "inf_hi")

    def __init__(self, hi: np.ndarray, lo: np.ndarray, inf_hi: int):
        self.hi, self.lo, self.inf_hi = hi, lo, inf_hi

    @classmethod
    def infinite(cls, shape: tuple, like: "Wide") -> "Wide":
        return cls(np.full(shape, like.inf_hi, dtype=like.hi.dtype), np.zeros(shape, dtype=np.int64), like.inf_hi)

    def __getitem__(self, key) -> "Wide":
        return Wide(self.hi[key], self.lo[key], self.inf_hi)

    def __setitem__(self, key, value: "Wide") -> None:
        self.hi[key], self.lo[key] = value.hi, value.lo

    def __add__(self, other: "Wide") -> "Wide":
        lo = self.lo + other.lo
        hi = self.hi + other.hi + (lo >> LIMB)
        out = Wide(hi, lo & MASK, self.inf_hi)
        return out.clamp()

    def clamp(self) -> "Wide":
        """Every infinite entry as the one infinity (so sums of infinities stay in range)."""
        over = self.hi >= self.inf_hi
        if over.any():
            self.hi = np.where(over, self.inf_hi, self.hi)
            self.lo = np.where(over, 0, self.lo)
        return self

    def where(self, cond: np.ndarray) -> "Wide":
        """This value where ``cond``, infinity elsewhere."""
        return Wide(np.where(cond, self.hi, self.inf_hi), np.where(cond, self.lo, 0), self.inf_hi)

    def pull(self, table: SegmentTable) -> "Wide":
        """``self[a + 1 + j]`` per band cell ``(a, j)``, infinity past the last layer."""
        return Wide(table.pull(self.hi, self.inf_hi), table.pull(self.lo, 0), self.inf_hi)

    def min_rows(self) -> "Wide":
        """The least value of each row (last axis)."""
        hi = self.hi.min(axis=-1)
        lo = np.where(self.hi == hi[..., None], self.lo, MASK + 1).min(axis=-1)
        return Wide(hi, lo, self.inf_hi)

    def minimum(self, other: "Wide") -> "Wide":
        mine = (self.hi < other.hi) | ((self.hi == other.hi) & (self.lo <= other.lo))
        return Wide(np.where(mine, self.hi, other.hi), np.where(mine, self.lo, other.lo), self.inf_hi)

    def value(self, *index) -> int | None:
        """The entry as a Python integer, None for infinity."""
        hi = int(self.hi[index])
        return None if hi >= self.inf_hi else (hi << LIMB) + int(self.lo[index])


class ExactTimes:
    """Segment times as exact integers in units of ``1 / scale`` (a power of two)."""

    def __init__(self, T: SegmentTable):
        finite = np.isfinite(T.band)
        values = np.unique(T.band[finite])
        ratios = [v.as_integer_ratio() for v in values.tolist()]
        self.scale = max((d for _, d in ratios), default=1)
        ints = [n * (self.scale // d) for n, d in ratios]
        top = (T.p + 1) * (max(ints, default=0) + 1)  # above any sum of stage times
        if top < 1 << (LIMB + 60):
            inf_hi, hi_dtype = 1 << 61, np.int64
            his = np.array([v >> LIMB for v in ints], dtype=np.int64)
            los = np.array([v & MASK for v in ints], dtype=np.int64)
        else:  # times spanning hundreds of binary orders of magnitude: the high limb a Python integer
            inf_hi, hi_dtype = (4 * top >> LIMB) + 1, object
            his = np.array([v >> LIMB for v in ints] + [0], dtype=object)[:-1]
            los = np.array([v & MASK for v in ints], dtype=np.int64)
        where = np.searchsorted(values, T.band[finite])
        self.band = Wide(np.full(T.band.shape, inf_hi, dtype=hi_dtype), np.zeros(T.band.shape, dtype=np.int64),
                         inf_hi)
        self.band.hi[finite], self.band.lo[finite] = his[where], los[where]

    def value(self, x: float) -> int:
        n, d = x.as_integer_ratio()
        return n * (self.scale // d)

    def to_float(self, n: int) -> float:
        return int(n) / self.scale  # int / int is correctly rounded


def _suffix_min(T: SegmentTable, X: ExactTimes, tau: float) -> tuple[Wide, Wide]:
    """Exact least sum of stages s.. covering a.. with every time <= tau
    (``free``), and with at least one time == tau (``hit``); infinity if none."""
    shape = (T.p + 1, T.n1)
    free, hit = Wide.infinite(shape, X.band), Wide.infinite(shape, X.band)
    free.hi[T.p, T.n1 - 1] = 0
    for s in range(T.p - 1, -1, -1):
        band = X.band[s]
        under = band.where(T.band[s] <= tau)
        exact = band.where(T.band[s] == tau)
        free_next = free[s + 1].pull(T)
        free[s] = (under + free_next).min_rows()
        hit[s] = (exact + free_next).min_rows().minimum((under + hit[s + 1].pull(T)).min_rows())
    return free, hit


def top_1f1b(T: SegmentTable, top: int, micro_batches: int) -> list[tuple]:
    """The best ``top`` splits by exact 1F1B score, as ``(counts, score)``, ties by counts."""
    X = ExactTimes(T)
    p, m1 = T.p, micro_batches - 1
    free_all, _ = _suffix_min(T, X, math.inf)
    least_sum = free_all.value(0, 0)
    if least_sum is None:
        return []
    heap: list[tuple] = []  # the best k as (-score, negated counts): heap[0] is the worst

    def beaten(score: int, prefix: tuple) -> bool:
        """Can no split with this least score and counts prefix enter the top k?"""
        if len(heap) < top:
            return False
        worst = -heap[0][0]
        if score != worst:
            return score > worst
        return prefix > tuple(-c for c in heap[0][1][:len(prefix)])

    def offer(score: int, counts: tuple) -> None:
        item = (-score, tuple(-c for c in counts))
        if len(heap) < top:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)

    taus = T.values()
    first = T.first_feasible(taus)
    for i in range(first, len(taus)):
        tau = float(taus[i])
        report("bottlenecks", i, len(taus))
        tau_x = m1 * X.value(tau)
        if len(heap) >= top and tau_x + least_sum > -heap[0][0]:
            break  # every later bottleneck scores more than the k-th best
        if not T.cover(tau)[1][0, 0]:
            continue  # no split has this bottleneck exactly
        free, hit = _suffix_min(T, X, tau)
        counts: list[int] = []

        def walk(s: int, a: int, total: int, hit_yet: bool) -> None:
            if s == p:
                offer(tau_x + total, tuple(counts))
                return
            options = []
            for b in T.end_range(a):
                t = T.band[s, a, b - a - 1]
                if not t <= tau:
                    continue
                now = hit_yet or t == tau
                rest = free.value(s + 1, b) if now else hit.value(s + 1, b)
                if rest is not None:
                    t_x = X.band.value(s, a, b - a - 1)
                    options.append((total + t_x + rest, b, t_x, now))
            options.sort()
            for low, b, t_x, now in options:
                counts.append(b - a)
                if not beaten(tau_x + low, tuple(counts)):
                    walk(s + 1, b, total + t_x, now)
                counts.pop()

        walk(0, 0, 0, False)
    best = sorted((-neg, tuple(-c for c in cs)) for neg, cs in heap)
    return [(c, X.to_float(score)) for score, c in best]


class ClosedForm:
    """The ``1f1b`` score for the certified rounds.  Every layer takes at least its fastest
    time, so a split using a segment slower than ``limit`` scores more than
    ``(M - 1) * limit + F`` (``F``: every layer's fastest time summed, a lower bound on the
    sum of stage times).  With one micro-batch that bound does not grow with the limit:
    the whole table is searched at once."""

    name = "1f1b"

    def __init__(self, micro_batches: int, total: float):
        self.m, self.total = micro_batches, total
        self.prunes = micro_batches > 1

    def top(self, table: SegmentTable, k: int) -> list[tuple]:
        with deep_walks(table.p):
            return top_1f1b(table, k, self.m)

    def reach(self, limit: float) -> float:
        return (self.m - 1) * limit + self.total

    def limit_for(self, score: float) -> float:
        return (score - self.total) / (self.m - 1)
