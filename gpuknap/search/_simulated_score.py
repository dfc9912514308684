"""The ``simulated`` score for the certified rounds (:mod:`._rounds`): its reach, a cheap
k-th best to skip tables that cannot certify, the tables narrowed by each segment's own
floor, and the exact top k by the branch and bound of :mod:`._simulated`."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..schedule import unbounded_iteration_times
from ._partial import Bounds
from ._rounds import Unfinished
from ._segments import SegmentTable, segment_rooms
from ._simulated import SLACK, _kth, _neighbours, first_bound, search
from ._ties import tie_key

#: Most segments under a limit that :meth:`Simulated.rooms` bounds one by one (more: left as they are).
NARROW_SEGMENTS = 2_000_000


def top_simulated(T: SegmentTable, top: int, micro_batches: int,
                  stage_times: Callable[[int, int, int], tuple[float, float]], forward_low: np.ndarray,
                  forward_high: np.ndarray, max_bytes: int | None = None, bounds: Bounds | None = None,
                  first: tuple | None = None) -> list[tuple]:
    """The exact ``top`` splits by simulated 1F1B time: ``[(counts, score)]``, best first, ties by
    :func:`._ties.tie_key` (a search stopped at a cap raises :class:`._rounds.Unfinished` with the
    best it found ranked so).  ``stage_times(s, a, b)`` gives the forward and backward time of stage s
    on layers ``a:b`` under its plan; ``forward_low`` / ``forward_high`` are prefix sums over the
    layers of the least and most forward time among each layer's options."""
    B = bounds if bounds is not None else Bounds(T, micro_batches, np.asarray(forward_low, dtype=np.float64),
                                                 np.asarray(forward_high, dtype=np.float64))
    try:
        splits = search(B, top, max_bytes, first)
    except Unfinished as stop:  # the best splits found, ranked as an answer would be (not proven)
        stop.found = _ranked(B, stop.splits, top, micro_batches, stage_times)
        raise
    return _ranked(B, splits, top, micro_batches, stage_times)


def _ranked(B: Bounds, splits: np.ndarray, top: int, micro_batches: int,
            stage_times: Callable[[int, int, int], tuple[float, float]]) -> list[tuple]:
    """The first ``top`` of ``splits`` by simulated time with each stage's times from its plan,
    ties by :func:`._ties.tie_key`, as ``[(counts, score)]``."""
    if not len(splits):
        return []
    cache: dict = {}
    fb = np.empty((len(splits), B.T.p, 2))
    for i, row in enumerate(splits.tolist()):
        a = 0
        for s, n in enumerate(row):
            key = (s, a, a + n)
            if key not in cache:
                cache[key] = stage_times(s, a, a + n)
            fb[i, s] = cache[key]
            a += n
    exact = unbounded_iteration_times(fb[:, :, 0:1], fb[:, :, 1:2], micro_batches)
    stage = B.times(splits)[0]
    ranked = sorted(range(len(splits)), key=lambda i: tie_key(float(exact[i]), stage[i], splits[i]))
    return [(tuple(splits[i].tolist()), float(exact[i])) for i in ranked[:top]]


class Simulated:
    """The ``simulated`` score for the certified rounds.  A split using a segment slower than
    ``limit`` has a stage s with ``t_s > limit``; staying on it gives ``M t_s``, and the two
    "over the top" paths average ``F - t_s + (M + a) t_s / 2`` (``F``: every layer's fastest
    time summed, ``a >= max(M - P + 1, 1)``), so its simulated time is above
    ``max(M limit, F + ((M + a) / 2 - 1) limit)`` (the reach).

    ``stage_times(s, a, b)``: forward and backward time of stage s on layers ``a:b`` under its
    plan; ``forward_low`` / ``forward_high``: prefix sums of each layer's least and most forward
    time among its options.  :meth:`upper` gives the rounds a cheap k-th best (the beam and
    its moves): a table that cannot certify it is not searched exactly; the table's bounds
    and first splits are kept for :meth:`top`."""

    name = "simulated"
    prunes = True

    def __init__(self, micro_batches: int, stage_times: Callable[[int, int, int], tuple[float, float]],
                 forward_low: np.ndarray, forward_high: np.ndarray, max_bytes: int | None = None,
                 total: float = 0.0, stages: int = 1, fastest: np.ndarray | None = None):
        self.m, self.stage_times = micro_batches, stage_times
        self.fastest = None if fastest is None else np.asarray(fastest, dtype=np.float64)
        self.forward_low = np.asarray(forward_low, dtype=np.float64)
        self.forward_high = np.asarray(forward_high, dtype=np.float64)
        self.max_bytes, self.total, self.stages = max_bytes, float(total), int(stages)
        self.slope = (micro_batches + max(micro_batches - stages + 1, 1)) / 2 - 1
        self._kept: tuple = (None, None, None)

    def _bounds(self, table: SegmentTable) -> Bounds:
        if self._kept[0] is not table:  # the splits found on the last table stay (see _first)
            self._kept = (table, Bounds(table, self.m, self.forward_low, self.forward_high), self._kept[2])
        return self._kept[1]

    def rooms(self, rooms: np.ndarray, limit: float) -> np.ndarray:
        """``rooms[s, a]`` under ``limit`` cut to the segments that a split within the reach of
        ``limit`` may use (unchanged before a first k-th best is known, or without ``fastest``,
        or over ``NARROW_SEGMENTS`` segments)."""
        if self._kept[2] is None or self.fastest is None or not math.isfinite(limit) \
                or int(rooms.sum()) > NARROW_SEGMENTS:
            return rooms
        return segment_rooms(rooms, self.m, self.fastest, self.forward_low, self.forward_high, self.reach(limit))

    def _first(self, B: Bounds, k: int) -> tuple | None:
        """The first splits kept from an earlier table for k, those in ``B``'s table (the
        k-th best of them is: its segments are within the reach of this table's limit)."""
        if self._kept[2] is None or self._kept[2][0] != k:
            return None
        splits, low, high = self._kept[2][1]
        inside = (splits <= B.T.width).all(axis=1)  # (a narrower table holds no longer stage)
        inside[inside] = np.isfinite(B.times(splits[inside])[0]).all(axis=1)
        return splits[inside], low[inside], high[inside]

    def first(self, limit: float) -> float:
        """The limit an even split's closed form ``(M + P - 1) F / P`` would ask for."""
        return self.limit_for((self.m + self.stages - 1) * self.total / self.stages)

    def upper(self, table: SegmentTable, k: int) -> float:
        """An upper bound on the k-th best score (``inf`` when none was found for it)."""
        B = self._bounds(table)
        kept = self._first(B, k)
        first = first_bound(B, k, None if kept is None else kept[0])
        self._kept = (table, B, (k, first, B))
        return _kth(first[2], k) * (1 + SLACK)

    def top(self, table: SegmentTable, k: int) -> list[tuple]:
        B = self._bounds(table)
        first = self._first(B, k)
        if first is not None and self._kept[2][2] is not B:  # found on a narrower table: this one may hold more
            first = _neighbours(B, k, *first)
        return top_simulated(table, k, self.m, self.stage_times, self.forward_low, self.forward_high,
                             self.max_bytes, B, first)

    def reach(self, limit: float) -> float:
        return max(self.m * limit, self.total + self.slope * limit)

    def limit_for(self, score: float) -> float:
        out = score / self.m
        if self.slope > 0:
            out = min(out, (score - self.total) / self.slope)
        return out
