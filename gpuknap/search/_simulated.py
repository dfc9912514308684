"""The exact top-k splits for the ``simulated`` score: the simulated 1F1B iteration time.

A split's simulated score is the iteration time of Megatron's 1F1B schedule
(:func:`gpuknap.schedule.simulate`, no transfer time) run with each stage's
forward and backward times from its plan (the numbers ``gpuknap timeline``
shows).  It is the longest path through the schedule's operations, not a
function of the stage times that a dynamic program over stages could rank, so
the search is a branch and bound over stages, with the batched simulator at the
leaves:

1. **Bounds** (:mod:`._critical`, :mod:`._partial`): the lengths of a few
   families of paths of the schedule are lower bounds, exact for equal stages;
   partial splits carry their own terms, and dynamic programs over the table
   bound what the stages still to place can add.
2. **A first k-th best**: a beam over stages by bound (the best 64 partial
   splits kept per stage), its best splits with their stage sizes sorted,
   simulated, then improved by moving one boundary at a time while the
   simulated time falls (a later round of the same search starts from the
   splits of the round before).
3. **Passes of a depth-first walk** over chunks of partial splits, best bound
   first, with a cut growing from the least bound of any split to the k-th
   best: children above the cut or the k-th best simulated time found are cut;
   complete splits get the full bounds, then are simulated in batches, and the
   k-th best falls as better splits turn up.  A pass that finds k splits within
   its cut ends the search.  A pass that runs long is stopped once to move layers
   between any two stages of the best splits and refine the bounds; the passes
   then start again, their cuts drawn to the k-th best found now; a pass that ends
   after expanding many (``EARLY_PASS``) is followed by the same at once (the next,
   with a larger cut, would run long).  The chunks are
   sized to ``max_bytes``.  Partial splits that reach one state, or a state that
   another's bounds from below, share one node of the walk (:mod:`._groups`,
   where the argument is).
4. The splits left are simulated with each stage's times from its plan and
   ranked by the rule every score shares (:func:`._ties.tie_key`), in
   :func:`._simulated_score.top_simulated`, next to the score that drives the rounds.

Every split cut has a bound, hence a simulated time, above the k-th best
found: the answer is exact.  A search that would expand more than
``MAX_EXPANDED`` partial splits, or simulate more than ``MAX_SIMULATED``
complete ones (with few micro-batches on many stages, a great many splits
simulate within rounding of one another: scores are compared as the floats
they are, so the search cannot stop at the first of them), stops there with
:class:`._rounds.Unfinished`: the best splits found, and a lower bound on any
other's time (the least of the bounds left open and of the times simulated).
"""
from __future__ import annotations

import math

import numpy as np

from ..engine import report
from . import _groups as groups
from ._critical import split_bounds
from ._partial import CHAINS, GRID, Bounds
from ._rounds import Unfinished
from ._simulated_moves import _improve, _transfers

#: Relative slack between a bound and the k-th best time (the bounds' sums round differently).
SLACK = 1e-9
#: Partial splits kept per stage by the beam that finds a first k-th best.
BEAM = 64
#: Most partial splits one search may expand before it stops.
MAX_EXPANDED = 30_000_000
#: Most complete splits the walk of one search may simulate before it stops (each is kept
#: while it may be in the top: about 0.7 KiB a split at 40 stages).
MAX_SIMULATED = 400_000
#: Best splits found (by their bounds' simulation) that a search stopped at a cap ranks by exact times.
RANKED = 256
#: Working memory of the search when no ``max_bytes`` is given.
DEFAULT_BYTES = 64 * 2**20
#: Cuts of the search's first passes, as fractions of the way from the least bound to the k-th best
#: (the last pass cuts at the k-th best).
PASSES = (1 / 64, 1 / 16, 1 / 4)
#: Partial splits a pass expands before the best splits found are improved by moving layers.
LONG_PASS = 2_000
#: Partial splits a pass that ends may expand before the best splits are improved right after it
#: (the next pass, with a larger cut, would run long: the cost of a pass grows steeply with its cut).
EARLY_PASS = LONG_PASS // 10
#: Fewest nodes in a chunk of the walk.
MIN_CHUNK = 64
#: Splits simulated past twice those kept before the ones that can no longer be in the top are dropped.
KEEP_ROWS = 1024
#: Most rows of one-layer moves a first k-th best (top > 1) makes; cells of them bounded at once.
NEIGHBOUR_ROWS, MOVE_ROWS = 100_000, 2**17


def _kth(values: np.ndarray, k: int) -> float:
    return float(np.partition(values, k - 1)[k - 1]) if len(values) >= k else math.inf


def _beam(B: Bounds, width: int) -> np.ndarray:
    st = B.start()
    for s in range(B.T.p):
        bound, new = B.expand(s, st)
        flat = bound.ravel()
        finite = np.flatnonzero(np.isfinite(flat))
        if len(finite) == 0:
            return np.zeros((0, B.T.p), dtype=np.int64)
        keep = finite[np.lexsort((finite, -(finite % bound.shape[1]), flat[finite]))[:width]]  # ties: longer stage
        st = B.take(st, new, *np.divmod(keep, bound.shape[1]))
    return st["counts"].astype(np.int64)


def first_bound(B: Bounds, top: int, earlier: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Some good splits with their ``(low, high)`` simulated times: a beam by bound, the beam's
    best splits with their stage sizes sorted (longest stages first, and last), then moves of
    one boundary from the best while the simulated time falls, and for ``top`` > 1 the best
    splits' one-layer moves (:func:`_neighbours`).  ``earlier``: the splits of a smaller table
    of the same search that are in this table too, used instead of a beam when at least ``top``."""
    if earlier is not None and len(earlier) >= top:
        splits = earlier
    else:
        splits = _beam(B, max(BEAM, 2 * top))
        if not len(splits):
            return splits, np.empty(0), np.empty(0)
        head = splits[:8]
        variants = np.vstack([splits, -np.sort(-head, axis=1), np.sort(head, axis=1)])
        variants = np.unique(variants[(variants <= B.T.width).all(axis=1)], axis=0)
        splits = variants[np.isfinite(B.times(variants)[0]).all(axis=1)]
    low, high = B.simulate(splits)
    best = int(np.argmin(high))
    moved, lo, hi = _improve(B, splits[best].copy(), float(low[best]), float(high[best]))
    if not (splits == moved).all(axis=1).any():
        splits = np.vstack([splits, moved[None, :]])
        low, high = np.append(low, lo), np.append(high, hi)
    return _neighbours(B, top, splits, low, high)


def _keys(splits: np.ndarray) -> list:
    """One ``bytes`` key per split (a set of them: the splits seen)."""
    return np.ascontiguousarray(splits, dtype=np.int64).view(np.dtype((np.void, 8 * splits.shape[1]))).ravel().tolist()


def _neighbours(B: Bounds, top: int, splits: np.ndarray, low: np.ndarray,
                high: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``splits`` (distinct, with their ``(low, high)`` times) and, for ``top`` > 1, splits a
    layer or a few away from their best, with their times: one by one, the best split not
    moved yet among the ``top`` best has one layer moved from any stage to any other, until
    every one of the ``top`` best has been moved or ``NEIGHBOUR_ROWS`` rows were made.  Rows
    whose quick bound is above the k-th best so far are not simulated; they are bounded and
    simulated ``MOVE_ROWS`` cells at a time.

    The beam and its moves find the best split; the next best are mostly a few moves from it
    (on a long pipeline of short stages: some stages a layer longer, others a layer shorter),
    and a k-th best near the answer keeps the search's cuts near it."""
    if top < 2 or not len(splits):
        return splits, low, high
    p, width = B.T.p, B.T.width
    give, take = np.nonzero(~np.eye(p, dtype=bool))
    at = np.arange(len(give))
    seen, moved = set(_keys(splits)), set()
    made, step = 0, max(1, MOVE_ROWS // p)
    while made < NEIGHBOUR_ROWS:
        order = np.argsort(high, kind="stable")[:top]
        seed = next((i for i, key in zip(order.tolist(), _keys(splits[order])) if key not in moved), None)
        if seed is None:
            break
        moved.add(_keys(splits[seed:seed + 1])[0])
        rows = np.repeat(splits[seed:seed + 1], len(give), axis=0)
        rows[at, give] -= 1
        rows[at, take] += 1
        made += len(rows)
        rows = rows[(rows[at, give] >= 1) & (rows[at, take] <= width)]
        new = [key not in seen and not seen.add(key) for key in _keys(rows)]  # (not seen, first of each)
        rows = rows[np.array(new, dtype=bool)]
        for lo in range(0, len(rows), step):
            part = rows[lo:lo + step]
            t, fl, fh = B.times(part)
            keep = np.isfinite(t).all(axis=1)
            part, t, fl, fh = part[keep], t[keep], fl[keep], fh[keep]
            kth = _kth(high, top)
            if math.isfinite(kth) and len(part):
                keep = split_bounds(t, fl, fh, B.m, chains=False) <= kth * (1 + SLACK)
                part, t, fl, fh = part[keep], t[keep], fl[keep], fh[keep]
            if len(part):
                lo_t, hi_t = B.simulate(part, (t, fl, fh))
                splits, low, high = np.vstack([splits, part]), np.append(low, lo_t), np.append(high, hi_t)
    return splits, low, high


class _Found:
    """The splits simulated so far: their ``(low, high)`` times, and ``tau``, the k-th best high."""

    def __init__(self, top: int, splits: np.ndarray, low: np.ndarray, high: np.ndarray):
        self.top, self.parts, self.simulated = top, [(splits, low, high)], 0
        self.seen = set(_keys(splits))
        self.tau = _kth(high, top)
        self.least = np.sort(high)[:top]  # the k best high times so far
        self.rows = self.kept = len(splits)
        self.over = math.inf  # set by each pass (:func:`_pass`)

    def add(self, splits: np.ndarray, B: Bounds, times: tuple | None = None) -> None:
        """Simulate ``splits`` not seen yet (``times``: their ``(low, high)`` times, if known)."""
        new = np.array([key not in self.seen and not self.seen.add(key) for key in _keys(splits)], dtype=bool)
        splits = splits[new]  # (not seen before, and the first of each)
        if not len(splits):
            return
        self.simulated += len(splits)
        if self.simulated > MAX_SIMULATED:
            raise Unfinished(f"the simulated score would simulate over {MAX_SIMULATED:,} splits here: too many "
                             "simulate within rounding of the best (an exact ranking must tell them apart); use the "
                             "1f1b score, or fewer stages or more micro-batches",
                             f"over {MAX_SIMULATED:,} splits simulate within rounding of the best")
        low, high = B.simulate(splits) if times is None else (times[0][new], times[1][new])
        self.parts.append((splits, low, high))
        both = np.concatenate((self.least, high))
        self.tau = min(self.tau, _kth(both, self.top))
        self.least = np.partition(both, self.top - 1)[:self.top] if len(both) > self.top else both
        self.rows += len(splits)
        if math.isfinite(self.tau) and self.rows > 2 * self.kept + KEEP_ROWS:  # now and then (not on every add:
            self.parts = [(x[keep], lo[keep], hi[keep]) for x, lo, hi in self.parts  # a plateau keeps them
                          for keep in [lo <= self.tau * (1 + SLACK)] if keep.any()]  # all), drop the splits
            self.rows = self.kept = sum(len(part[0]) for part in self.parts)  # that can no longer be in the top

    def best(self, count: int = 8) -> np.ndarray:
        """The ``count`` splits simulated fastest so far (by their high time)."""
        return self.split(count)[0]

    def split(self, count: int) -> tuple[np.ndarray, float]:
        """:meth:`best` and the least low time of the other splits simulated (inf when none)."""
        splits, lows, highs = (np.concatenate([part[i] for part in self.parts]) for i in range(3))
        order = np.argsort(highs, kind="stable")
        return splits[order[:count]], float(lows[order[count:]].min(initial=math.inf))

    def candidates(self, p: int) -> np.ndarray:
        if not self.parts:
            return np.zeros((0, p), dtype=np.int64)
        splits = np.concatenate([part[0] for part in self.parts])
        low = np.concatenate([part[1] for part in self.parts])
        keep = low <= self.tau * (1 + SLACK) if math.isfinite(self.tau) else np.ones(len(low), dtype=bool)
        return splits[keep]


def search(B: Bounds, top: int, max_bytes: int | None, first: tuple | None = None) -> np.ndarray:
    """Every split that may be among the ``top`` best (a superset of them), as ``[N, P]`` counts;
    ``first``: :func:`first_bound`'s answer on these bounds, if known.

    Passes of the depth-first search with a growing cut, from the least bound of any split
    up to the k-th best simulated time: a pass that finds k splits within its cut has seen
    every split that could beat them, so the search ends there (the cost of a pass grows
    steeply with its cut).  A pass that runs long is stopped once to move layers between
    any two stages of the best splits found (a better k-th best cuts more) and to refine
    the grid of the remaining stages' bound, then resumed; a pass that ends after
    expanding over ``EARLY_PASS`` partial splits is followed by the same before the next
    starts (those moves only lower the k-th best: every cut stays valid)."""
    T, p = B.T, B.T.p
    pool, low, high = first if first is not None else first_bound(B, top)
    found = _Found(top, pool, low, high)
    floor = float(B.expand(0, B.start())[0].min())  # below every split's bound

    def passes() -> list:  # the last cut is the k-th best found, whatever it falls to
        if not math.isfinite(found.tau):
            return [math.inf]
        least = min(floor, found.tau)
        return [least + (found.tau - least) * f for f in PASSES] + [math.inf]

    cuts = passes()
    proven = floor  # every split whose bound is at most this was simulated, or is above the k-th best found
    # a child's state: 7 numbers and 4 per open chain; its edge to its parent and its path count
    child = 8 * (7 + 4 * CHAINS) + 32
    chunk = max(MIN_CHUNK, (max_bytes or DEFAULT_BYTES) // (T.width * child) // (2 * p + 2))
    expanded, budget, i = 0, LONG_PASS, 0

    def improve() -> list:
        reached, times = _transfers(B, found)
        found.add(reached, B, times)
        B.refine(GRID, found.best())
        return passes()  # the same fractions of the shorter way to the k-th best found now

    try:
        while i < len(cuts):
            before = expanded
            expanded, complete = _pass(B, found, cuts[i], chunk, expanded, budget)
            if not complete:
                budget = None  # once: moves between any two stages, a finer grid; then the pass runs to its end
                cuts = improve()
                continue
            proven = max(proven, found.over)  # a split not simulated had a bound above this
            if found.tau <= cuts[i] * (1 + SLACK / 2):  # every split with a bound up to the cut, slack included,
                break                                    # was seen: every split up to the k-th best, rounding included
            i += 1
            if budget is not None and expanded - before > EARLY_PASS and i < len(cuts):
                budget = None  # the same, before a pass that would run long starts
                cuts = improve()
    except Unfinished as stop:  # stopped at a cap: the best found (ranked by exact times later), and a bound
        stop.splits, rest = found.split(max(top, RANKED))  # on the rest: a split not simulated is above the
        stop.lower = min(max(proven, stop.frontier), rest) * (1 - SLACK)  # last pass's cut, or this pass's or
        raise  # under a node left; one simulated and not ranked is above its low time (rounding: the slack)
    return found.candidates(p)


def _pass(B: Bounds, found: _Found, limit: float, chunk: int, expanded: int,
          budget: int | None) -> tuple[int, bool]:
    """One depth-first pass over chunks of partial splits, best bound first, cutting every
    child whose bound is above ``limit`` or the k-th best found: ``(count expanded, whether the
    pass ended)`` (it stops after ``budget`` expansions when one is given)."""
    p = B.T.p
    stack = [(0, groups.start(B.start()), -math.inf)]  # (stage, nodes, a bound on their completions)
    start, low = expanded, -math.inf
    found.over = math.inf  # the least bound of a partial or complete split this pass cut
    try:
        while stack:
            if budget is not None and expanded - start > budget:
                return expanded, False
            s, st, low = stack.pop()
            bound, new = B.expand(s, st)
            cut = min(limit, found.tau) * (1 + SLACK)  # (a bound may round above its split's time)
            real = np.isfinite(bound)
            low = max(low, float(bound[real].min(initial=math.inf)))  # (each completion passes a child)
            parent, j = np.nonzero(real & (bound <= cut))
            found.over = min(found.over, float(bound[real & (bound > cut)].min(initial=math.inf)))
            expanded += len(parent)
            if expanded > MAX_EXPANDED:
                raise Unfinished(f"the simulated score would expand over {MAX_EXPANDED:,} partial splits here; "
                                 "use the 1f1b score (or fewer stages)",
                                 f"its bounds left over {MAX_EXPANDED:,} partial splits to expand")
            if not len(parent):
                continue
            order = np.lexsort((j, parent, bound[parent, j]))
            if s == p - 1:
                for splits in groups.complete(st, parent[order], j[order], chunk * B.T.width):
                    t, fl, fh = B.times(splits)
                    quick = split_bounds(t, fl, fh, B.m, chains=False)  # the quick bound first
                    keep, over = quick <= cut, quick[quick > cut]
                    splits, t, fl, fh = splits[keep], t[keep], fl[keep], fh[keep]
                    full = split_bounds(t, fl, fh, B.m)
                    found.over = min(found.over, float(np.concatenate((over, full[full > cut])).min(initial=math.inf)))
                    found.add(splits[full <= cut], B)
                report("simulated splits", expanded, expanded + len(stack))
                continue
            children = groups.children(st, new, parent[order], j[order], B)
            least = float(bound[parent, j].min())  # (every completion of a child is bounded by the child's bound)
            stack.extend((s + 1, part, least) for part in reversed(groups.split(children, chunk)))  # the best first
    except Unfinished as stop:  # stopped in this pass: a split not simulated is above the cut or under a node left
        stop.frontier = min([low, found.over] + [entry[2] for entry in stack])
        raise
    return expanded, True
