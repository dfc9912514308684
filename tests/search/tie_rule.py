"""The documented order of splits of equal score (docs/schedule.md, "Ties"), written from
the docs for the brute-force references: a split with an idle stage (time 0) after one
without, then the least total of stage times (exactly), then the least spread between the
slowest and the fastest stage, then the counts in lexicographic order."""
from __future__ import annotations

from fractions import Fraction


def tie_rule(score, times, counts):
    exact = [Fraction(t) for t in times]
    return (score, 0 in exact, sum(exact), max(exact) - min(exact), tuple(counts))


def ranked(entries):
    """``[(score, times, counts)]`` in the documented order, as ``[(float(score), counts)]``."""
    return [(float(key[0]), key[-1]) for key in sorted(tie_rule(*e) for e in entries)]
