"""The exact top-k splits for the 1F1B score ``(M - 1) * slowest + sum of stage times``.

Splits are grouped by their bottleneck ``tau`` and walked bottleneck by
bottleneck (:func:`._tied.top_tied`): for each, a dynamic program over stages
gives the exact least sum of the remaining stages with every time ``<= tau``
(and with one ``== tau``), with what the tie rule of :mod:`._ties` needs after
it, and a best-first walk cut by those values collects the splits that can
still enter the top k.  The scan stops once ``(M - 1) * tau`` plus the least
sum of any split exceeds the k-th best.  Sums are exact integers
(:mod:`._exact`); scores are rounded once to a float when reported.
"""
from __future__ import annotations

from ._exact import LIMB, MASK, ExactTimes, Wide  # noqa: F401  (re-exported)
from ._segments import SegmentTable
from ._slowest import deep_walks
from ._tied import top_tied


def top_1f1b(T: SegmentTable, top: int, micro_batches: int) -> list[tuple]:
    """The best ``top`` splits by exact 1F1B score, as ``(counts, score)``, ties by the rule of
    :mod:`._ties` (:func:`._tied.top_tied`)."""
    m1 = micro_batches - 1
    return top_tied(T, top, lambda tau, total: m1 * tau + total, lambda tau, least: m1 * tau + least)


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
