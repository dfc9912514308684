"""Stage problems in canonical form: the unit the solvers deduplicate and solve.

A stage's layers are laid out as *steps*, one per layer, group after group in
the order given (zero-count groups dropped, consecutive runs of the same kind
and in-flight count merged).  The DP adds the layers' times in this order, so
every entry point that solves the same problem performs the same additions.
Memory is summed exactly (:func:`kept_bytes`), so merging runs never changes
whether the all-fastest choice fits, nor the bytes a choice reports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from ._options import (
    Front,
    FrontTable,
    Layers,
    buckets_down,
    buckets_up,
    check_layers,
    check_number,
)

#: How a problem is answered.
INFEASIBLE, FASTEST, KNAPSACK = 0, 1, 2


@dataclass(frozen=True)
class StageProblem:
    """A stage in canonical form: ``runs`` of ``((kind, in_flight), count)`` and a budget."""

    runs: tuple
    budget: float


@dataclass(frozen=True)
class Verdict:
    """How a problem is answered: ``INFEASIBLE``, ``FASTEST`` with its ``time``,
    or ``KNAPSACK`` over ``capacity`` buckets."""

    kind: int
    time: float = float("inf")
    capacity: int = -1


def check_groups(groups: Any, where: str = "groups") -> tuple:
    """Validate a sequence of :class:`Layers`."""
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
        raise ValueError(f"{where} must be a sequence of Layers, got {type(groups).__name__}")
    return tuple(check_layers(g, f"{where}[{i}]") for i, g in enumerate(groups))


def canonical(groups: Sequence[Layers], budget: float, where: str = "groups") -> StageProblem:
    """Validate ``groups`` and ``budget`` and return the canonical problem."""
    groups = check_groups(groups, where)
    check_number(budget, "budget", allow_inf=True)
    runs: list[list] = []
    for g in groups:
        if g.count == 0:
            continue
        key = (g.kind, int(g.in_flight))
        if runs and runs[-1][0] == key:
            runs[-1][1] += int(g.count)
        else:
            runs.append([key, int(g.count)])
    return StageProblem(tuple((k, n) for k, n in runs), float(budget))


def fronts_of(problem: StageProblem, table: FrontTable) -> list[Front]:
    """The front of every run (validates the kinds against the fronts)."""
    return [table.get(kind, k) for (kind, k), _ in problem.runs]


def sequential_time(times: Sequence[float], counts: Sequence[int]) -> float:
    """``times[i]`` added ``counts[i]`` times, left to right, as the DP adds them
    (each addition rounded), in a number of steps that does not grow with the counts."""
    total = 0.0
    for t, n in zip(times, counts):
        if n <= 64:  # a model's stage: the plain loop is quicker
            for _ in range(n):
                total += t
        else:
            total = _added(total, float(t), int(n))
    return total


_NORMAL = 2.0 ** -1022  # below it the floats are evenly spaced by the least ulp


def _added(total: float, t: float, n: int) -> float:
    """``total`` after ``n`` rounded additions of ``t >= 0``.

    While sums stay below the next power of two, floats are multiples of one
    ulp and every addition adds ``t`` rounded to a whole number of ulps; that
    number is fixed except on a tie, where round-half-even makes every result
    even after the first, so from then on it is fixed too.  Once two steps in a
    row added the same number of ulps, the steps up to the power of two are
    taken at once (exact integer arithmetic in ulps); the steps that cross it
    are taken one by one.  A sum that stops growing stays where it is."""
    last = None  # ulps added by the last step, when it stayed below its power of two
    while n:
        ulp = math.ulp(total)
        top = ulp * 2.0 ** 53 if total >= _NORMAL else _NORMAL
        after = total + t
        n -= 1
        if after == total:
            return total
        if after < top:
            step = (after - total) / ulp
            if step == last and n:
                base, ulps = int(after / ulp), int(step)
                jump = min(n, (int(top / ulp) - 1 - base) // ulps)
                after = (base + jump * ulps) * ulp
                n -= jump
                step = None
            last = step
        else:
            last = None
        total = after
    return total


def kept_bytes(terms: Iterable[tuple[int, float]]) -> float:
    """``sum(count * memory)`` over ``(count, memory)`` pairs, computed exactly and
    rounded once to the nearest float (``inf`` beyond the float range).

    The one memory sum of every entry point: the all-fastest shortcut's test,
    ``least_times``' all-fastest bytes and every reported ``StageChoice.memory``.
    Being exact, it does not depend on how layers are grouped, merged or
    ordered, so a canonical problem (runs merged from several groups) and the
    groups it came from give the same bytes; being rounded once (monotone), a
    choice whose exact bytes fit a budget also reports bytes that fit it.
    Whole byte counts whose sums stay below 2**53 give the plain float sum.
    """
    num, den = 0, 1  # the sum is num / den, den a power of two
    for n, mem in terms:
        if not n:
            continue
        p, q = float(mem).as_integer_ratio()
        if q > den:
            num *= q // den
            den = q
        elif q < den:
            p *= den // q
        num += int(n) * p
    try:
        return num / den  # int / int: correctly rounded
    except OverflowError:
        return float("inf")


#: Most verdicts a FrontTable keeps (each a few hundred bytes with its problem).
VERDICTS_KEPT = 50_000


def verdict(problem: StageProblem, table: FrontTable) -> Verdict:
    """Decide how ``problem`` is answered (the contract's steps 1-3); kept on ``table``."""
    try:
        known = table.verdicts.get(problem)
    except TypeError:  # an unhashable kind: its own error comes from the fronts
        return _verdict(problem, table)
    if known is None:
        known = _verdict(problem, table)
        if len(table.verdicts) < VERDICTS_KEPT:
            table.verdicts[problem] = known
    return known


def _verdict(problem: StageProblem, table: FrontTable) -> Verdict:
    fronts = fronts_of(problem, table)
    if problem.budget < 0:
        return Verdict(INFEASIBLE)
    counts = [n for _, n in problem.runs]
    fastest_bytes = kept_bytes((n, f.memories[-1]) for f, n in zip(fronts, counts))
    if fastest_bytes <= problem.budget:
        return Verdict(FASTEST, sequential_time([float(f.times[-1]) for f in fronts], counts))
    capacity = (buckets_up if table.relaxed else buckets_down)(problem.budget, table.bucket)
    lightest = sum(n * int(f.weights[0]) for f, n in zip(fronts, counts))
    if lightest > capacity:
        return Verdict(INFEASIBLE)
    return Verdict(KNAPSACK, capacity=capacity)


def zeros_row(width: int) -> np.ndarray:
    """The DP's start: time 0 at every capacity."""
    return np.zeros((1, width), dtype=np.float64)
