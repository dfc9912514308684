"""Times of model segments: stage s of P taking layers ``start:end``.

Both ``PipelineModel.rank`` (:func:`segment_times`) and ``best_splits``
(:func:`segment_table`, every segment a split may use) reduce to this: a set of
segments, each a stage problem (its kinds in order, in-flight count and
budget), classified with array operations (:mod:`._classify`),
deduplicated and solved in one batch.  Segments that share their problem
share one solve; problems that extend one another share one chain of passes
in the engine.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..engine import INFEASIBLE, MEGABYTE, FrontTable, report, solve_problems, verdict
from ._classify import KindIndex, classify, kind_index
from ._critical import segment_floor


def segment_times(model: Any, stage_in_flight: np.ndarray, seg_stage: np.ndarray, seg_start: np.ndarray,
                  seg_end: np.ndarray, bucket: float, backend: Any, max_bytes: int | None = None) -> np.ndarray:
    """Least time of each segment (``inf`` where none fits), one batch for all.

    ``stage_in_flight[s]`` is stage s's in-flight count; the other arrays give
    each segment's stage, first layer and end (exclusive).
    """
    table = FrontTable(model.fronts, bucket)
    in_flight = np.asarray(stage_in_flight, dtype=np.int64)[np.asarray(seg_stage, dtype=np.int64)]
    ids, problems = classify(model, kind_index(model), in_flight, np.asarray(seg_start, dtype=np.int64),
                             np.asarray(seg_end, dtype=np.int64))
    values = solve_problems(problems, table, backend, max_bytes)
    return values[ids]


#: Most segments an exhaustive search enumerates (each is a stage problem to classify).
MAX_SEGMENTS = 20_000_000
#: Most segments x distinct kinds: a segment's problem is keyed by every kind's count (a red team's
#: 600 layers of 600 kinds on 4 stages, 4e8 of them, ran past 100 s and 7 GB).
MAX_SEGMENT_KINDS = 100_000_000


class SegmentTable:
    """Segment times ``T[s, a, b]`` stored as a band: ``band[s, a, j]`` is the
    segment ``a:a+1+j``; every segment outside the band is infeasible (``inf``).

    ``pruned``: some segments were left out (``inf``) because even their fastest
    options take longer than the table's ``limit``, not because they do not fit.
    """

    def __init__(self, band: np.ndarray, pruned: bool = False):
        self.band = band
        self.pruned = bool(pruned)
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
        """The distinct finite segment times, ascending: the candidate bottlenecks."""
        return np.unique(self.band[np.isfinite(self.band)])

    def cover(self, tau: float) -> tuple[np.ndarray, np.ndarray]:
        """``ok[s, a]``: stages s.. can cover layers a.. with every time <= tau;
        ``hit[s, a]``: the same with at least one time == tau."""
        ok = np.zeros((self.p + 1, self.n1), dtype=bool)
        hit = np.zeros((self.p + 1, self.n1), dtype=bool)
        ok[self.p, self.n1 - 1] = True
        for s in range(self.p - 1, -1, -1):
            under = self.band[s] <= tau
            ok_next = self.pull(ok[s + 1], False)
            ok[s] = (under & ok_next).any(axis=1)
            hit[s] = (under & (((self.band[s] == tau) & ok_next) | self.pull(hit[s + 1], False))).any(axis=1)
        return ok, hit

    def count(self, tau: float, cap: int) -> int:
        """Splits with every stage time <= tau, capped at ``cap``."""
        ways = np.zeros(self.n1)
        ways[0] = 1
        for s in range(self.p):
            ways = np.minimum(self.push_sum(ways[:, None] * (self.band[s] <= tau)), cap)
        return int(ways[self.n1 - 1])

    def first_feasible(self, values: np.ndarray) -> int:
        """Index into ``values`` (ascending) of the least bottleneck some split attains
        (``len(values)`` when no split is feasible): a binary search over counts."""
        if len(values) == 0 or self.count(values[-1], 1) == 0:
            return len(values)
        lo, hi = 0, len(values) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.count(values[mid], 1):
                hi = mid
            else:
                lo = mid + 1
        return lo


def _span_bounds(model: Any, inflight: list[int], fronts: FrontTable, index: KindIndex) -> np.ndarray:
    """Per stage and start, an upper bound on the layers a stage can hold: their
    static bytes plus their lightest options must fit the device."""
    limit = model.capacity - model.reserved
    n = model.layers
    out = np.zeros((len(inflight), n + 1), dtype=np.int64)
    for k in sorted(set(inflight)):
        lightest = np.array([float(fronts.get(kind, k).memories[0]) for kind in index.kinds])
        cost = (index.static + lightest)[index.codes]
        with np.errstate(over="ignore"):  # absurd memory sums to inf: such layers never fit, as they should not
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


def _check_size(model: Any, stages: int) -> None:
    """Refuse, before allocating, searches whose per-stage tables alone are too large."""
    cells = stages * (model.layers + 1)
    if cells > MAX_SEGMENTS:
        raise ValueError(f"an exhaustive search of {stages} stages over {model.layers} layers needs tables of "
                         f"{cells:,} (stage, start) entries, over {MAX_SEGMENTS:,} segments; "
                         "rank candidate splits with model.rank instead")


def coverage(model: Any, stages: int, bucket: float = MEGABYTE, in_flight: Any = None) -> int:
    """How many of the model's layers ``stages`` stages can hold even with their lightest
    options (an upper bound: fewer than ``model.layers`` proves no split fits).  Array
    work only, no DP: milliseconds even for thousands of layers."""
    _, _, rooms = search_space(model, stages, FrontTable(model.fronts, bucket), in_flight)
    return coverable_layers(rooms, model.layers)


def search_space(model: Any, stages: int, fronts: FrontTable, in_flight: Any) -> tuple:
    """``(in-flight per stage, kind index, rooms[s, a])`` of a search, after the size check."""
    _check_size(model, stages)
    inflight = [row[0] for row in model.in_flight_table(stages, 1, in_flight)]
    index = kind_index(model)
    return inflight, index, _rooms(_span_bounds(model, inflight, fronts, index), model.layers)


def fastest_prefix(model: Any, fronts: FrontTable, index: KindIndex, in_flight: int) -> np.ndarray:
    """Prefix sums of each layer's fastest option time: ``p[b] - p[a]`` is a lower
    bound on the time of any stage taking layers ``a:b`` (memory ignored)."""
    fastest = np.array([float(fronts.get(kind, in_flight).times.min()) for kind in index.kinds])
    return np.concatenate(([0.0], np.cumsum(fastest[index.codes])))


def each_segment(rooms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every segment the rooms allow, as ``(stage, start, length - 1)`` arrays, stage by stage and
    start by start, shortest first."""
    flat = rooms.ravel()
    cell = np.repeat(np.arange(flat.size), flat)  # one entry per segment: its (s, a)
    j = np.arange(int(flat.sum())) - np.repeat(np.cumsum(flat) - flat, flat)
    stage, start = np.divmod(cell, rooms.shape[1])
    return stage, start, j


def segment_rooms(rooms: np.ndarray, micro_batches: int, fastest: np.ndarray, f_low: np.ndarray,
                  f_high: np.ndarray, score: float) -> np.ndarray:
    """``rooms[s, a]`` (how many layers stage s may take from layer a) cut to the longest
    segment whose :func:`._critical.segment_floor` is at most ``score`` (with a slack far above
    the prefix sums' rounding): every split using a segment cut simulates slower than ``score``."""
    stage, start, j = each_segment(rooms)
    floor = segment_floor(stage, start, start + j + 1, rooms.shape[0], micro_batches, fastest, f_low, f_high)
    slack = 1e-9 * (abs(score) + abs(float(fastest[-1])))
    keep = floor <= score + slack
    out = np.zeros(rooms.shape, dtype=rooms.dtype)
    np.maximum.at(out, (stage[keep], start[keep]), j[keep] + 1)
    return out


def _cut_rooms(rooms: np.ndarray, prefix: np.ndarray, limit: float) -> np.ndarray:
    """Rooms shortened to the segments whose fastest-options time is at most ``limit``
    (with a slack far above the rounding of the prefix sums, so only segments
    surely slower than ``limit`` go)."""
    slack = 1e-9 * (abs(limit) + prefix[-1])
    last = np.searchsorted(prefix, prefix + limit + slack, side="right") - 1
    return np.minimum(rooms, np.maximum(last - np.arange(len(prefix)), 0)[None, :])


def segment_table(model: Any, stages: int, bucket: float, backend: Any,
                  in_flight: Any = None, max_bytes: int | None = None, relaxed: bool = False,
                  limit: float = math.inf, fronts: FrontTable | None = None, cover: bool = True,
                  known: Any = None) -> SegmentTable:
    """Least time of stage s on layers ``start:end`` for every segment of a split.

    Every candidate segment (within its stage's span bound) is classified with
    array operations; ends beyond a stage's first infeasible end are dropped
    (more layers only need more memory); the distinct problems left are one
    batch for the engine.  A model whose stages cannot cover its layers even
    with their lightest options gets an all-infeasible table before any of this.

    ``limit``: leave out (as ``inf``, with ``pruned`` set) the segments whose
    fastest options alone take longer than ``limit``; a search that finds its
    answers at or under ``limit`` is then still exact (``best_splits``).  ``fronts``: a
    FrontTable of the model's fronts at this bucket (and ``relaxed``) to reuse.
    ``cover=False`` skips the all-infeasible shortcut: for a table that is one of
    several a search takes the least of (exclusive options), where other tables
    may hold the segments this one cannot.  ``known``: times of problems solved
    before with the same ``fronts`` (a :class:`gpuknap.engine.Solved`).
    """
    if fronts is None:
        fronts = FrontTable(model.fronts, bucket, relaxed)  # relaxed: lower bounds on exact-bytes times
    plan = plan_segments(model, stages, fronts, in_flight, limit, cover)
    return plan.fill(solve_problems(plan.problems, fronts, backend, max_bytes, plan.verdicts, known))


class SegmentPlan:
    """The stage problems a segment table needs, before any is solved: ``problems``
    (distinct, with their ``verdicts``), and :meth:`fill` to build the table from
    their solved times (so many tables can share one batch: ``gpuknap.sweep``)."""

    def __init__(self, stages: int, n: int, width: int, where: tuple, keep: np.ndarray, ids: np.ndarray,
                 problems: list, verdicts: list, pruned: bool):
        self.stages, self.n, self.width = stages, n, width
        self.where, self.keep, self.ids = where, keep, ids
        self.problems, self.verdicts, self.pruned = problems, verdicts, pruned

    def fill(self, values: np.ndarray) -> SegmentTable:
        """The table, from ``values[i]``: the least time of ``problems[i]``."""
        band = np.full((self.stages, self.n + 1, self.width), np.inf)
        if len(self.problems):
            seg_s, seg_a, j = self.where
            band[seg_s, seg_a, j] = np.asarray(values)[self.ids]
        return SegmentTable(band, self.pruned)


def plan_segments(model: Any, stages: int, fronts: FrontTable, in_flight: Any = None,
                  limit: float = math.inf, cover: bool = True, space: tuple | None = None,
                  narrow: Callable[[np.ndarray, float], np.ndarray] | None = None) -> SegmentPlan:
    """The work of :func:`segment_table` up to the solve (see there).  ``space``: the search
    space, :func:`search_space`'s answer, when the caller keeps it between rounds of one search
    (it does not depend on ``limit``).  ``narrow(rooms, limit)``: a score's own cut of the
    rooms left under ``limit`` (each at most the room given), leaving out more segments that
    no split within the score's reach at ``limit`` uses."""
    n = model.layers
    inflight, index, rooms = search_space(model, stages, fronts, in_flight) if space is None else space
    empty = (np.empty(0, dtype=np.int64),) * 3
    if cover and coverable_layers(rooms, n) < n:
        return SegmentPlan(stages, n, 1, empty, np.empty(0, dtype=bool), np.empty(0, dtype=np.int64), [], [], False)
    pruned = False
    if limit < math.inf:
        cut = _cut_rooms(rooms, fastest_prefix(model, fronts, index, inflight[0]), limit)
        if narrow is not None:
            cut = np.minimum(cut, narrow(cut, limit))
        pruned = bool((cut < rooms).any())
        rooms = cut
    width = max(int(rooms.max(initial=0)), 1)
    total = int(rooms.sum())
    if total > MAX_SEGMENTS:
        raise ValueError(
            f"an exhaustive search of {stages} stages over {n} layers would classify up to {total:,} segments "
            f"(over {MAX_SEGMENTS:,}); rank candidate splits with model.rank instead")
    if total * index.n_kinds > MAX_SEGMENT_KINDS:  # each distinct problem's key holds every kind's count
        raise ValueError(
            f"an exhaustive search of {stages} stages over {n} layers of {index.n_kinds:,} kinds would classify "
            f"up to {total:,} segments of {index.n_kinds:,} kind counts each (over {MAX_SEGMENT_KINDS:,}); merge "
            "kinds that share options, or rank candidate splits with model.rank instead")
    report("segments", 0, total)
    seg_s, seg_a, j = each_segment(rooms)
    ids, problems = classify(model, index, np.asarray(inflight, dtype=np.int64)[seg_s], seg_a, seg_a + 1 + j)
    report("segments", total, total)
    verdicts = [verdict(problem, fronts) for problem in problems]
    feasible = np.array([v.kind != INFEASIBLE for v in verdicts], dtype=bool)
    ok = np.zeros((stages, n + 1, width), dtype=bool)
    ok[seg_s, seg_a, j] = feasible[ids]
    ok = np.logical_and.accumulate(ok, axis=2)  # stop at a stage's first infeasible end
    keep = ok[seg_s, seg_a, j]
    chosen, local = np.unique(ids[keep], return_inverse=True)  # only the problems a kept segment needs
    return SegmentPlan(stages, n, width, (seg_s[keep], seg_a[keep], j[keep]), keep, local.ravel(),
                       [problems[i] for i in chosen.tolist()], [verdicts[i] for i in chosen.tolist()], pruned)
