"""Stage problems in canonical form: the unit the solvers deduplicate and solve.

A stage's layers are laid out as *steps*, one per layer, group after group in
the order given (zero-count groups dropped, consecutive runs of the same kind
and in-flight count merged).  The DP adds the layers' times in this order, so
every entry point that solves the same problem performs the same additions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

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
    """``times[i]`` added ``counts[i]`` times, left to right, as the DP adds them."""
    total = 0.0
    for t, n in zip(times, counts):
        for _ in range(n):
            total += t
    return total


def verdict(problem: StageProblem, table: FrontTable) -> Verdict:
    """Decide how ``problem`` is answered (the contract's steps 1-3)."""
    fronts = fronts_of(problem, table)
    if problem.budget < 0:
        return Verdict(INFEASIBLE)
    counts = [n for _, n in problem.runs]
    fastest_bytes = 0.0
    for f, n in zip(fronts, counts):
        fastest_bytes += n * float(f.memories[-1])
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
