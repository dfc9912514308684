"""The rule that orders splits of equal score, for every score.

Among splits with the same score (compared exactly), the one ranked first:

1. has no idle stage (a stage whose time is 0, such as one that holds only an
   embedding without cost), if any split of that score has none;
2. is faster in total: the least sum of its stage times (the plan's total
   compute, summed exactly);
3. is the most even: the least difference between its slowest and its fastest
   stage;
4. has the lexicographically first counts.

So an idle stage never wins a tie, and between splits the score cannot tell
apart, the one that computes less and spreads it best is listed first.  The
``slowest`` and ``1f1b`` searches walk splits in this order (:mod:`._slowest`,
:mod:`._closed_form`); the ``simulated`` search sorts its candidates by
:func:`tie_key`.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Any, Sequence


def tie_key(score: Any, times: Sequence[float], counts: Sequence[int]) -> tuple:
    """The sort key of a split: ``(score, idle, total, spread, counts)`` (see the module)."""
    values = [float(t) for t in times]
    exact = [Fraction(t) for t in values]
    return (score, min(values, default=0.0) == 0.0, sum(exact, Fraction(0)),
            max(exact, default=Fraction(0)) - min(exact, default=Fraction(0)), tuple(int(c) for c in counts))
