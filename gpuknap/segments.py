"""Times of model segments: stage s of P taking layers ``start:end``.

Both ``PipelineModel.rank`` and ``best_splits`` reduce to this: a set of
segments, each a stage problem (its kinds multiset, in-flight count and
budget), deduplicated and solved in one batch.  Segments that share their
problem share one solve; problems that extend one another share one chain of
passes in the engine.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .model import kind_counts
from .options import FrontTable, Layers
from .problem import canonical
from .ranking import solve_problems


class SegmentGroups:
    """Groups of ``model.kinds[start:end]`` (kinds by first appearance), cached."""

    def __init__(self, model: Any):
        self.model = model
        self._cache: dict[tuple, tuple] = {}

    def counts(self, start: int, end: int) -> tuple:
        """``((kind, n), ...)`` for layers ``start:end``."""
        key = (start, end)
        got = self._cache.get(key)
        if got is not None:
            return got
        prev = self._cache.get((start, end - 1))
        if prev is None:  # count from scratch
            got = kind_counts(self.model.kinds[start:end])
        else:  # one layer more than a cached segment
            kind = self.model.kinds[end - 1]
            items = list(prev)
            for i, (k, n) in enumerate(items):
                if k == kind:
                    items[i] = (k, n + 1)
                    break
            else:
                items.append((kind, 1))
            got = tuple(items)
        self._cache[key] = got
        return got

    def groups(self, start: int, end: int, in_flight: int) -> tuple:
        return tuple(Layers(k, n, in_flight) for k, n in self.counts(start, end))


def segment_times(model: Any, stage_in_flight: np.ndarray, seg_stage: np.ndarray, seg_start: np.ndarray,
                  seg_end: np.ndarray, bucket: float, backend: Any, max_bytes: int | None = None) -> np.ndarray:
    """Least time of each segment (``inf`` where none fits), one batch for all.

    ``stage_in_flight[s]`` is stage s's in-flight count; the other arrays give
    each segment's stage, first layer and end (exclusive).
    """
    table = FrontTable(model.fronts, bucket)
    cache = SegmentGroups(model)
    index: dict[tuple, int] = {}
    problems = []
    ids = np.empty(len(seg_stage), dtype=np.int64)
    for i, (s, a, b) in enumerate(zip(seg_stage.tolist(), seg_start.tolist(), seg_end.tolist())):
        groups = cache.groups(a, b, int(stage_in_flight[s]))
        budget = model.budget_of(groups)
        key = (groups, budget)
        ident = index.get(key)
        if ident is None:
            ident = index[key] = len(problems)
            problems.append(canonical(groups, budget))
        ids[i] = ident
    values = solve_problems(problems, table, backend, max_bytes)
    return values[ids]
