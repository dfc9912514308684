"""The ``slowest`` score: a split is as fast as its slowest stage.

Splits are walked bottleneck by bottleneck (:func:`._tied.top_tied`), from the
least bottleneck any split attains; splits of one bottleneck come in the
order of the tie rule (:mod:`._ties`): no idle stage, then the least sum of
stage times, then the least spread, then the counts.  (Splits of equal
slowest stage are many; without the rule one of them was picked by its counts
alone, and stage 0 could hold only an embedding and idle.)

Also here: a split's exact score for ``slowest`` and ``1f1b`` as a fraction
(:func:`exact_score`), the value splits are ranked by.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from fractions import Fraction
from typing import Any, Iterator

from ._segments import SegmentTable
from ._tied import top_tied


def exact_score(times: Any, score: str, micro_batches: int) -> Fraction:
    """A split's score, exactly: ``slowest``, or ``(M - 1) * slowest + sum(times)``
    for the 1F1B iteration time.  Splits are ranked by this exact value."""
    slowest = Fraction(max(times))
    if score == "slowest":
        return slowest
    return (micro_batches - 1) * slowest + sum(map(Fraction, times))


def score_of(times: Any, score: str, micro_batches: int, chunks: int = 1) -> float:
    """A split's score as reported: the exact score rounded once to a float; with ``chunks > 1``
    (interleaved) the ``1f1b`` closed form ``((v M - 1) * slowest + sum) / v`` of its stages'
    totals."""
    if chunks == 1 or score == "slowest":
        return float(exact_score(times, score, micro_batches))
    return float(exact_score(times, score, chunks * micro_batches) / chunks)


def top_slowest(T: SegmentTable, top: int) -> list[tuple]:
    """The best ``top`` splits by slowest stage, as ``(counts, score)``, ties by the rule of
    :mod:`._ties`: no idle stage, then the least total, the least spread, the counts."""
    return top_tied(T, top, lambda tau, total: tau, lambda tau, least: tau)


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
