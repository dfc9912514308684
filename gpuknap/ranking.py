"""``rank``: score many candidate splits at once, exactly as ``pp_lite`` would.

A candidate is a sequence of :class:`Stage`.  Identical stage problems are
solved once; the rest go to the batched engine as knapsacks.
"""
from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from .backend import get_backend
from .batch import Knapsack
from .engine import check_max_bytes, solve_knapsacks
from .options import MEGABYTE, FrontTable
from .problem import FASTEST, KNAPSACK, StageProblem, canonical, fronts_of, verdict
from .results import PipelineChoice, Stage
from .stage import check_stages, pp_lite


class Ranking:
    """Scores of a batch of candidates.

    ``slowest[i]`` is candidate i's slowest stage time (``inf`` when some stage
    has no choice); ``order`` lists candidates best first (ties by index);
    ``times(i)`` and ``choice(i)`` give the per-stage times and the full
    :class:`PipelineChoice` (rebuilt on demand with ``pp_lite``).
    """

    def __init__(self, stage_times: np.ndarray, offsets: np.ndarray, rebuild: Any):
        self._stage_times = stage_times
        self._offsets = offsets
        self._rebuild = rebuild
        n = len(offsets) - 1
        if n and len(stage_times):
            slowest = np.maximum.reduceat(stage_times, offsets[:-1])
        else:
            slowest = np.full(n, np.inf)
        self.slowest = np.asarray(slowest, dtype=np.float64)
        self.slowest.setflags(write=False)
        self._order: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @property
    def order(self) -> np.ndarray:
        """Candidate indices, best (least slowest) first; ties by index."""
        if self._order is None:
            self._order = np.argsort(self.slowest, kind="stable")
            self._order.setflags(write=False)
        return self._order

    def _index(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -len(self) <= i < len(self):
            raise IndexError(f"candidate index {i!r} out of range for {len(self)} candidates")
        return int(i) % len(self)

    def times(self, i: int) -> list[float] | None:
        """Per-stage times of candidate ``i`` (fixed time included), or None."""
        i = self._index(i)
        if np.isinf(self.slowest[i]):
            return None
        return self._stage_times[self._offsets[i]:self._offsets[i + 1]].tolist()

    def choice(self, i: int) -> PipelineChoice | None:
        """The :class:`PipelineChoice` of candidate ``i`` (equal to ``pp_lite``), or None."""
        i = self._index(i)
        if np.isinf(self.slowest[i]):
            return None
        return self._rebuild(i)


def solve_problems(problems: Sequence[StageProblem], table: FrontTable, backend: str | None,
                   max_bytes: int | None) -> np.ndarray:
    """Least time of every distinct stage problem (``inf`` where none fits)."""
    values = np.full(len(problems), np.inf)
    knapsacks = []
    for ident, problem in enumerate(problems):
        how = verdict(problem, table)
        if how.kind == FASTEST:
            values[ident] = how.time
        elif how.kind == KNAPSACK:
            knapsacks.append(Knapsack(problem.runs, how.capacity, ident))
    if knapsacks:
        solved = solve_knapsacks(knapsacks, table, get_backend(backend), max_bytes, len(problems))
        idents = [k.ident for k in knapsacks]
        values[idents] = solved[idents]
    return values


def rank(candidates: Sequence[Sequence[Stage]], fronts: Mapping[Hashable, Sequence[Any]],
         bucket: float = MEGABYTE, backend: str | None = "auto", max_bytes: int | None = None) -> Ranking:
    """Score every candidate exactly as ``pp_lite`` would, in one batch."""
    table = FrontTable(fronts, bucket)
    if max_bytes is not None:
        check_max_bytes(max_bytes)
    get_backend(backend)  # fail early on a bad or unavailable backend
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
        raise ValueError(f"candidates must be a sequence of candidates, got {type(candidates).__name__}")
    candidates = list(candidates)
    index: dict[tuple, int] = {}
    problems: list[StageProblem] = []
    stage_ids: list[int] = []
    fixed: list[float] = []
    offsets = [0]
    for c, stages in enumerate(candidates):
        stages = check_stages(stages, f"candidates[{c}]")
        for s, stage in enumerate(stages):
            try:
                key = (stage.groups, stage.budget)
                ident = index.get(key)
            except TypeError:
                raise ValueError(f"candidates[{c}][{s}] has an unhashable layer kind") from None
            if ident is None:
                problem = canonical(stage.groups, stage.budget, f"candidates[{c}][{s}].groups")
                fronts_of(problem, table)
                ident = index[key] = len(problems)
                problems.append(problem)
            stage_ids.append(ident)
            fixed.append(stage.fixed_time)
        offsets.append(len(stage_ids))
    values = solve_problems(problems, table, backend, max_bytes)
    stage_times = values[np.asarray(stage_ids, dtype=np.int64)] + np.asarray(fixed, dtype=np.float64)
    return Ranking(stage_times, np.asarray(offsets, dtype=np.int64),
                   lambda i: pp_lite(candidates[i], fronts, bucket))
