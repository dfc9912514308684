"""The certified rounds: one driver for every score's exact top-k search.

A search never builds the whole table of segment times.  Every layer takes
at least its fastest option's time, so a segment whose fastest options alone
take more than a limit ``tau`` can be left out of the table: a split using
one has a stage slower than ``tau``, and its score is at least what the
score calls its *reach* at ``tau``.  Each round:

1. the driver yields a limit; the caller builds the table of the segments
   under it (:class:`gpuknap.search._plain.SegmentSource`, or the chunk tuples
   of an interleaved search) and sends it back;
2. the score finds its exact top k on that table (:meth:`Score.top`);
3. if the table left nothing out, or the k-th score found is within the
   reach of the limit, no split left out can enter the top k: the answer is
   certified and returned.  Otherwise the next limit is the one whose reach
   covers the k-th score found (so a second round always ends the search),
   or, with fewer than k splits found, the limit grows by a fifth.  A score
   whose search stops at a cap of its work (:class:`Unfinished`) ends the
   rounds with the best it found, marked not exact, and a lower bound on the
   best score: the least of its own and the reach of the limit.

The first limit is a little over the least the slowest stage can take (``F /
P``, with ``F`` every layer's fastest time summed, or the slowest single
layer).  Most searches end in one round on far fewer segments than the table.

A *score* plugs in by three things (:class:`Score`): its exact top k on a
(pruned) table, its reach at a limit, and the inverse of its reach; a score
whose exact top k is costly may also give a cheap upper bound on its k-th
best (``upper``), and a table that cannot certify it is then not searched.  The
scores are ``slowest`` (:mod:`._slowest`), ``1f1b`` (:mod:`._closed_form`)
and ``simulated`` (:mod:`._simulated`); the interleaved search plugs its
per-stage tuple tables into the same driver.  Because the driver is a
generator, many searches can advance in lockstep and share one solve per
round (:mod:`gpuknap.sweep`); :func:`run_rounds` drives one search alone.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Generator, Protocol, Sequence

import numpy as np

from ..engine import FrontTable, Solved, solve_problems

#: Growth of the segment-time limit between rounds when fewer than k splits were found.
LIMIT_GROWTH = 1.2
#: Relative margin kept between a certified score and what pruned segments can reach.
MARGIN = 1e-9


class Score(Protocol):
    """What a score tells the certified rounds."""

    #: False when the reach does not grow with the limit (the whole table must be searched at once).
    prunes: bool

    def top(self, table: Any, k: int) -> list[tuple]:
        """The exact best ``k`` splits on ``table`` as ``(counts, score)``, best first, ties by the
        rule of :mod:`._ties`."""

    def reach(self, limit: float) -> float:
        """A lower bound on the score of any split using a segment whose fastest options take
        more than ``limit``."""

    def limit_for(self, score: float) -> float:
        """The least limit whose reach is ``score`` (the inverse of :meth:`reach`)."""

    # Optional: ``upper(table, k) -> float``, an upper bound on the k-th best score of the
    # splits in ``table`` (``inf`` when it holds fewer than k), cheaper than ``top``; and
    # ``first(limit) -> float``, a first limit of its own (the larger of the two is used).


class Found(list):
    """The splits found, best first; ``exact`` says whether they are proven the best,
    ``lower_bound`` is a lower bound on the best score (the first score when exact); ``why``,
    when not exact, says why the search stopped short (empty when it was a local search)."""

    exact: bool = True
    lower_bound: float = math.nan
    why: str = ""
    #: Where a search stopped at a cap: the refusal a caller that needs the exact answer raises.
    refusal: str = ""


class Unfinished(ValueError):
    """A score's top k that stopped at a cap of its work (a refusal where nobody catches it).
    ``splits``: the best it found, and ``lower``, a lower bound on the best score of the table
    searched, set where it stopped; ``found``: those splits ranked as ``(counts, score)``, once
    scored; ``why``: what the cap met, in a phrase."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why
        self.splits: Any = None
        self.lower = math.nan
        self.frontier = -math.inf  # (the walk's own: a bound on the splits its stopped pass left)
        self.found: list | None = None


def first_limit(fastest: np.ndarray, stages: int) -> float:
    """The first round's limit: a little over ``F / P`` or the slowest single layer, from the
    prefix sums ``fastest`` of every layer's fastest time."""
    total = float(fastest[-1])
    return max(total / stages, float(np.diff(fastest).max(initial=0.0))) * 1.1


def certified_rounds(score: Score, first: float, total: float, top: int) -> Generator[float, Any, list]:
    """The driver (see the module docstring): yields each round's limit, is sent that round's
    table, returns the certified top ``top``.  ``total``: every layer's fastest time summed
    (limits above twice it leave nothing out, so they become infinite)."""
    start = getattr(score, "first", None)  # a score may know a better first limit than the generic one
    limit = (max(first, start(first)) if start is not None else first) if score.prunes else math.inf
    known = math.inf  # the cheap bound of an earlier, smaller table: its splits are in every later one
    while True:
        if not math.isfinite(limit) or limit > total * 2:
            limit = math.inf
        table = yield limit
        upper = getattr(score, "upper", None)
        certified = math.isfinite(known) and known * (1 + 1e-6) <= score.reach(limit) * (1 - MARGIN) * (1 + 1e-6)
        if table.pruned and upper is not None and not certified:  # a cheap k-th best first: skip tables
            bound = upper(table, top)                                  # that cannot certify
            known = min(known, bound)
            if not math.isfinite(bound):  # fewer than k splits in this table
                limit *= LIMIT_GROWTH
                continue
            if bound * (1 + 1e-6) > score.reach(limit) * (1 - MARGIN) * (1 + 1e-6):
                limit = max(score.limit_for(bound * (1 + 1e-6)), limit * (1 + 1e-6))
                continue
        try:
            found = score.top(table, top)
        except Unfinished as stop:  # the best found, with a bound on any split's score: not proven
            if not stop.found:  # (nothing found yet: the refusal stands)
                raise
            out = Found(stop.found)
            reach = score.reach(limit) * (1 - MARGIN) if table.pruned else math.inf  # (splits left out)
            out.exact, out.why, out.refusal = False, stop.why, str(stop)
            out.lower_bound = min(stop.lower, reach, out[0][1])
            return out
        if not table.pruned:
            return found
        if len(found) < top:
            limit *= LIMIT_GROWTH
            continue
        kth = found[-1][1] * (1 + 1e-6)  # k splits score at most this: the next limit certifies it
        if kth <= score.reach(limit) * (1 - MARGIN) * (1 + 1e-6):
            return found
        limit = max(score.limit_for(kth), limit * (1 + 1e-6))


#: One round's request to the engine: the problems of one front table (and their verdicts).
Request = tuple  # (FrontTable, problems, verdicts)


class Source(Protocol):
    """Tables of one search at any limit, built in two halves so that many searches can share
    one solve: :meth:`plan` lists the problems a limit needs, :meth:`fill` takes their times."""

    def plan(self, limit: float) -> Sequence[Request]:
        """The stage problems the table at ``limit`` needs, per front table."""

    def fill(self, values: Sequence[np.ndarray]) -> Any:
        """The table, from the solved times of the last :meth:`plan`'s problems."""


class Solver:
    """Solves the requests of one search's rounds; problems solved in an earlier round
    (with the same front table) are not solved again."""

    def __init__(self, backend: Any, max_bytes: int | None):
        self.backend, self.max_bytes = backend, max_bytes
        self._known: dict[int, tuple[FrontTable, Solved]] = {}

    def __call__(self, requests: Sequence[Request]) -> list[np.ndarray]:
        out = []
        for fronts, problems, verdicts in requests:
            _, known = self._known.setdefault(id(fronts), (fronts, Solved()))
            out.append(solve_problems(problems, fronts, self.backend, self.max_bytes, verdicts, known))
        return out


def run_rounds(rounds: Generator[float, Any, list], source: Source,
               solve: Callable[[Sequence[Request]], list]) -> list:
    """Drive one search's rounds to their certified answer."""
    limit = next(rounds)
    while True:
        table = source.fill(solve(source.plan(limit)))
        try:
            limit = rounds.send(table)
        except StopIteration as done:
            return done.value
