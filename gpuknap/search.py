"""``best_splits``: the exact top-k contiguous splits of a model, without enumerating them.

1. Segment times: ``T[s, start, end]``, the least time of stage s taking
   layers ``start:end``, for every segment that can be part of a split.  For
   each stage and start the ends grow until the stage no longer fits (static
   and activation bytes only grow with more layers), and all segments are one
   batch for the engine (equal problems solved once, shared pass chains).
2. A dynamic program over stages, per score:

   ``slowest``: ``count(tau)``, the number of splits whose stages all take at
   most ``tau`` (capped at k), is a product of 0/1 matrices; a binary search
   over the distinct segment times finds ``tau_k``, the k-th best score.  The
   splits scoring below ``tau_k`` (fewer than k) and the lexicographically
   first splits scoring exactly ``tau_k`` are then walked depth-first with
   "can the rest still be covered" tables, so every step leads to an answer.

   ``1f1b``: ``(M - 1) * slowest + sum of stage times``, computed exactly
   (segment times as integers times a power of two) and rounded once for
   the report.  Splits are grouped by their bottleneck ``tau``; for each
   ``tau`` in increasing order a best-first walk, cut by the exact least sum
   of the remaining stages, collects the splits whose bottleneck is exactly
   ``tau`` and that can still enter the top k (a better score, or an equal
   score with counts that sort first).  The scan stops once ``(M - 1) * tau``
   plus the least sum of any split exceeds the k-th best score.

Ties are broken by the counts in lexicographic order.
"""
from __future__ import annotations

import heapq
import math
import sys
from fractions import Fraction
from typing import Any

import numpy as np

from .backend import get_backend
from .engine import check_max_bytes
from .limits import MAX_TOP
from .model import PipelineModel
from .options import MEGABYTE, FrontTable, check_bucket, check_int
from .classify import KindIndex, classify, kind_index
from .problem import INFEASIBLE, verdict
from .ranking import solve_problems
from .results import PipelineChoice
from .progress import report
from .stage import Planner

SCORES = ("slowest", "1f1b")


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


#: Most segments an exhaustive search enumerates (each is a stage problem to classify).
MAX_SEGMENTS = 20_000_000


class SegmentTable:
    """Segment times ``T[s, a, b]`` stored as a band: ``band[s, a, j]`` is the
    segment ``a:a+1+j``; every segment outside the band is infeasible (``inf``)."""

    def __init__(self, band: np.ndarray):
        self.band = band
        self.p, self.n1, self.width = band.shape
        ends = np.arange(self.n1)[:, None] + 1 + np.arange(self.width)[None, :]
        self.valid = ends < self.n1
        self.ends = np.minimum(ends, self.n1 - 1)

    def at(self, s: int, a: int, b: int) -> float:
        j = b - a - 1
        return float(self.band[s, a, j]) if 0 <= j < self.width else math.inf

    def end_range(self, a: int) -> range:
        return range(a + 1, min(self.n1, a + 1 + self.width))

    def pull(self, values: np.ndarray, fill: Any) -> np.ndarray:
        """``values[a + 1 + j]`` per ``(a, j)``, ``fill`` past the last layer."""
        return np.where(self.valid, values[self.ends], fill)

    def push_sum(self, contrib: np.ndarray) -> np.ndarray:
        """Per end ``b``, the sum of ``contrib[a, j]`` over segments ending at ``b``."""
        return np.bincount(self.ends[self.valid], weights=contrib[self.valid], minlength=self.n1)

    def values(self) -> np.ndarray:
        return np.unique(self.band[np.isfinite(self.band)])


def _span_bounds(model: PipelineModel, inflight: list[int], fronts: FrontTable, index: KindIndex) -> np.ndarray:
    """Per stage and start, an upper bound on the layers a stage can hold: their
    static bytes plus their lightest options must fit the device."""
    limit = model.capacity - model.reserved
    n = model.layers
    out = np.zeros((len(inflight), n + 1), dtype=np.int64)
    for k in sorted(set(inflight)):
        lightest = np.array([float(fronts.get(kind, k).memories[0]) for kind in index.kinds])
        cost = (index.static + lightest)[index.codes]
        prefix = np.concatenate(([0.0], np.cumsum(cost)))
        reach = prefix + limit + abs(limit) * 1e-9 + 1e-6  # slack for sums in another order
        last = np.searchsorted(prefix, reach, side="right") - 1
        out[np.asarray(inflight) == k] = np.maximum(last - np.arange(n + 1), 0)
    return out


def _rooms(spans: np.ndarray, n: int) -> np.ndarray:
    """``room[s, a]``: the most layers stage s may take from layer a, within its
    span bound and leaving at least one layer for each later stage (0 where a
    is not a possible start of stage s)."""
    p = len(spans)
    a = np.arange(n + 1)[None, :]
    s = np.arange(p)[:, None]
    room = np.minimum(spans, (n - (p - 1 - s)) - a)
    room[(a < s) | (a > n - (p - s))] = 0
    return np.maximum(room, 0)


def coverable_layers(rooms: np.ndarray, n: int) -> int:
    """The most layers, of n, that the stages can cover from layer 0 within their
    rooms (n when some split might fit; fewer proves that none does)."""
    reach = np.zeros(n + 1, dtype=bool)
    reach[0] = True
    for s in range(len(rooms)):  # stage by stage: which ends can a split of s+1 stages reach
        starts = np.flatnonzero(reach & (rooms[s] > 0))
        reach = np.zeros(n + 1, dtype=bool)
        if len(starts) == 0:
            return 0
        diff = np.zeros(n + 2, dtype=np.int64)
        np.add.at(diff, starts + 1, 1)
        np.add.at(diff, starts + rooms[s, starts] + 1, -1)
        reach = np.cumsum(diff)[:n + 1] > 0
    return n if reach[n] else int(np.flatnonzero(reach).max(initial=0))


def _check_size(model: PipelineModel, stages: int) -> None:
    """Refuse, before allocating, searches whose per-stage tables alone are too large."""
    cells = stages * (model.layers + 1)
    if cells > MAX_SEGMENTS:
        raise ValueError(f"an exhaustive search of {stages} stages over {model.layers} layers needs tables of "
                         f"{cells:,} (stage, start) entries, over {MAX_SEGMENTS:,} segments; "
                         "rank candidate splits with model.rank instead")


def coverage(model: PipelineModel, stages: int, bucket: float = MEGABYTE, in_flight: Any = None) -> int:
    """How many of the model's layers ``stages`` stages can hold even with their lightest
    options (an upper bound: fewer than ``model.layers`` proves no split fits).  Array
    work only, no DP: milliseconds even for thousands of layers."""
    _check_size(model, stages)
    inflight = [row[0] for row in model.in_flight_table(stages, 1, in_flight)]
    index = kind_index(model)
    rooms = _rooms(_span_bounds(model, inflight, FrontTable(model.fronts, bucket), index), model.layers)
    return coverable_layers(rooms, model.layers)


def segment_table(model: PipelineModel, stages: int, bucket: float, backend: Any,
                  in_flight: Any = None, max_bytes: int | None = None) -> SegmentTable:
    """Least time of stage s on layers ``start:end`` for every segment of a split.

    Every candidate segment (within its stage's span bound) is classified with
    array operations; ends beyond a stage's first infeasible end are dropped
    (more layers only need more memory); the distinct problems left are one
    batch for the engine.  A model whose stages cannot cover its layers even
    with their lightest options gets an all-infeasible table before any of this.
    """
    n = model.layers
    _check_size(model, stages)
    inflight = [row[0] for row in model.in_flight_table(stages, 1, in_flight)]
    fronts = FrontTable(model.fronts, bucket)
    index = kind_index(model)
    rooms = _rooms(_span_bounds(model, inflight, fronts, index), n)
    width = max(int(rooms.max(initial=0)), 1)
    if coverable_layers(rooms, n) < n:
        return SegmentTable(np.full((stages, n + 1, 1), np.inf))
    total = int(rooms.sum())
    if total > MAX_SEGMENTS:
        raise ValueError(
            f"an exhaustive search of {stages} stages over {n} layers would classify up to {total:,} segments "
            f"(over {MAX_SEGMENTS:,}); rank candidate splits with model.rank instead")
    report("segments", 0, total)
    flat = rooms.ravel()
    cell = np.repeat(np.arange(flat.size), flat)  # one entry per segment: its (s, a)
    j = np.arange(total) - np.repeat(np.cumsum(flat) - flat, flat)
    seg_s, seg_a = np.divmod(cell, n + 1)
    ids, problems = classify(model, index, np.asarray(inflight, dtype=np.int64)[seg_s], seg_a, seg_a + 1 + j)
    report("segments", total, total)
    verdicts = [verdict(problem, fronts) for problem in problems]
    feasible = np.array([v.kind != INFEASIBLE for v in verdicts], dtype=bool)
    ok = np.zeros((stages, n + 1, width), dtype=bool)
    ok[seg_s, seg_a, j] = feasible[ids]
    ok = np.logical_and.accumulate(ok, axis=2)  # stop at a stage's first infeasible end
    keep = ok[seg_s, seg_a, j]
    needed = np.zeros(len(problems), dtype=bool)
    needed[ids[keep]] = True
    values = np.full(len(problems), np.inf)
    chosen = np.flatnonzero(needed)
    values[chosen] = solve_problems([problems[i] for i in chosen], fronts, backend, max_bytes,
                                    [verdicts[i] for i in chosen])
    band = np.full((stages, n + 1, width), np.inf)
    band[seg_s[keep], seg_a[keep], j[keep]] = values[ids[keep]]
    return SegmentTable(band)


def _cover_tables(T: SegmentTable, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """``ok[s, a]``: stages s.. can cover layers a.. with every time <= tau;
    ``hit[s, a]``: the same with at least one time == tau."""
    ok = np.zeros((T.p + 1, T.n1), dtype=bool)
    hit = np.zeros((T.p + 1, T.n1), dtype=bool)
    ok[T.p, T.n1 - 1] = True
    for s in range(T.p - 1, -1, -1):
        under = T.band[s] <= tau
        ok_next = T.pull(ok[s + 1], False)
        ok[s] = (under & ok_next).any(axis=1)
        hit[s] = (under & (((T.band[s] == tau) & ok_next) | T.pull(hit[s + 1], False))).any(axis=1)
    return ok, hit


def _count(T: SegmentTable, tau: float, cap: int) -> int:
    """Splits with every stage time <= tau, capped at ``cap``."""
    ways = np.zeros(T.n1)
    ways[0] = 1
    for s in range(T.p):
        ways = np.minimum(T.push_sum(ways[:, None] * (T.band[s] <= tau)), cap)
    return int(ways[T.n1 - 1])


def _walk_lex(T: SegmentTable, tau: float, need_hit: bool, limit: int) -> list[tuple]:
    """Splits with all times <= tau (and one == tau if ``need_hit``), lexicographic, at most ``limit``."""
    p = T.p
    ok, hit = _cover_tables(T, tau)
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


def _top_slowest(T: SegmentTable, top: int) -> list[tuple]:
    values = T.values()
    if len(values) == 0 or _count(T, values[-1], 1) == 0:
        return []
    lo, hi = 0, len(values) - 1
    if _count(T, values[-1], top) < top:
        lo = hi  # fewer than k splits in all: take every one
    while lo < hi:
        mid = (lo + hi) // 2
        if _count(T, values[mid], top) >= top:
            hi = mid
        else:
            lo = mid + 1
    tau_k = values[lo]
    below = _walk_lex(T, values[lo - 1], False, top) if lo > 0 else []
    ranked = sorted(((max(_times_of(T, c)), c) for c in below))
    at_tau = _walk_lex(T, tau_k, True, top - len(ranked))
    return [(c, t) for t, c in ranked] + [(c, float(tau_k)) for c in at_tau]


class ExactTimes:
    """Segment times as exact integers (every float is an integer times a power
    of two), so that sums of stage times are exact and ties are real ties."""

    def __init__(self, T: SegmentTable, micro_batches: int):
        finite = np.isfinite(T.band)
        values = np.unique(T.band[finite])
        ratios = [v.as_integer_ratio() for v in values.tolist()]
        self.scale = max((d for _, d in ratios), default=1)
        ints = [n * (self.scale // d) for n, d in ratios]
        top = max(ints, default=0) + 1
        limit = (T.p + 1) * top * (micro_batches + 1)
        self.dtype = np.int64 if limit < 2**60 else object
        self.inf = 2**61 if self.dtype is np.int64 else 4 * limit  # above any finite sum, twice over
        self.band = np.full(T.band.shape, self.inf, dtype=self.dtype)
        self.band[finite] = np.array(ints, dtype=self.dtype)[np.searchsorted(values, T.band[finite])]

    def value(self, x: float) -> int:
        n, d = x.as_integer_ratio()
        return n * (self.scale // d)

    def to_float(self, n: int) -> float:
        return int(n) / self.scale  # int / int is correctly rounded


def _suffix_min(T: SegmentTable, X: ExactTimes, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact least sum of stages s.. covering a.. with every time <= tau
    (``free``), and with at least one time == tau (``hit``); ``X.inf`` if none."""
    free = np.full((T.p + 1, T.n1), X.inf, dtype=X.dtype)
    hit = np.full((T.p + 1, T.n1), X.inf, dtype=X.dtype)
    free[T.p, T.n1 - 1] = 0
    for s in range(T.p - 1, -1, -1):
        under = np.where(T.band[s] <= tau, X.band[s], X.inf)
        exact = np.where(T.band[s] == tau, X.band[s], X.inf)
        free_next = T.pull(free[s + 1], X.inf)
        free[s] = np.minimum((under + free_next).min(axis=1), X.inf)
        hit[s] = np.minimum(np.minimum((exact + free_next).min(axis=1),
                                       (under + T.pull(hit[s + 1], X.inf)).min(axis=1)), X.inf)
    return free, hit


def _top_1f1b(T: SegmentTable, top: int, micro_batches: int) -> list[tuple]:
    """Best-first walk per bottleneck with exact integer sums: a branch is cut when
    its least reachable score is above the k-th best, or equal to it with counts
    that already sort after the k-th best's."""
    X = ExactTimes(T, micro_batches)
    p, m1 = T.p, micro_batches - 1
    free_all, _ = _suffix_min(T, X, math.inf)
    least_sum = free_all[0, 0]
    if least_sum >= X.inf:
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

    taus = T.values().tolist()
    for i, tau in enumerate(taus):
        report("bottlenecks", i, len(taus))
        tau_x = m1 * X.value(tau)
        if len(heap) >= top and tau_x + least_sum > -heap[0][0]:
            break  # every later bottleneck scores more than the k-th best
        free, hit = _suffix_min(T, X, tau)
        if hit[0, 0] >= X.inf:
            continue
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
                rest = free[s + 1, b] if now else hit[s + 1, b]
                if rest < X.inf:
                    t_x = int(X.band[s, a, b - a - 1])
                    options.append((total + t_x + int(rest), b, t_x, now))
            options.sort()
            for low, b, t_x, now in options:
                counts.append(b - a)
                if not beaten(tau_x + low, tuple(counts)):
                    walk(s + 1, b, total + t_x, now)
                counts.pop()

        walk(0, 0, 0, False)
    best = sorted((-neg, tuple(-c for c in cs)) for neg, cs in heap)
    return [(c, X.to_float(score)) for score, c in best]


def best_splits(model: PipelineModel, stages: int, top: int = 1, score: str = "slowest",
                bucket: float = MEGABYTE, backend: Any = "auto", in_flight: Any = None,
                max_bytes: int | None = None) -> list[tuple[tuple, float, PipelineChoice]]:
    """The exact ``top`` splits of ``model`` into ``stages`` stages, best first.

    Each entry is ``(counts, score, PipelineChoice)``; ties by counts in
    lexicographic order.  An infeasible model gives an empty list.
    """
    if not isinstance(model, PipelineModel):
        raise ValueError(f"model must be a PipelineModel, got {type(model).__name__}")
    stages, top = check_int(stages, "stages", 1), check_int(top, "top", 1)
    if stages > model.layers:
        raise ValueError(f"stages={stages} exceeds the model's {model.layers} layers")
    if top > MAX_TOP:
        raise ValueError(f"top={top} is over the limit of {MAX_TOP} splits per search")
    if not isinstance(score, str) or score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    check_bucket(bucket)
    get_backend(backend)
    if max_bytes is not None:
        check_max_bytes(max_bytes)
    model.in_flight_table(int(stages), 1, in_flight)
    T = segment_table(model, int(stages), bucket, backend, in_flight, max_bytes)
    depth = sys.getrecursionlimit()
    sys.setrecursionlimit(max(depth, int(stages) + 200))  # the walks recurse once per stage
    try:
        if score == "slowest":
            found = _top_slowest(T, int(top))
        else:
            found = _top_1f1b(T, int(top), model.micro_batches)
    finally:
        sys.setrecursionlimit(depth)
    out = []
    plan = Planner(model.fronts, bucket)  # the top k share most of their stages: each solved once
    for i, (counts, value) in enumerate(found):
        choice = plan(model.stages(list(counts), in_flight))
        out.append((tuple(int(c) for c in counts), float(value), choice))
        report("plans", i + 1, len(found))
    return out
