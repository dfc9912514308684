"""Times of model segments: stage s of P taking layers ``start:end``.

Both ``PipelineModel.rank`` and ``best_splits`` reduce to this: a set of
segments, each a stage problem (its kinds in order, in-flight count and
budget), classified with array operations (:mod:`gpuknap.classify`),
deduplicated and solved in one batch.  Segments that share their problem
share one solve; problems that extend one another share one chain of passes
in the engine.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .classify import classify, kind_index
from .options import FrontTable
from .ranking import solve_problems


def segment_times(model: Any, stage_in_flight: np.ndarray, seg_stage: np.ndarray, seg_start: np.ndarray,
                  seg_end: np.ndarray, bucket: float, backend: Any, max_bytes: int | None = None) -> np.ndarray:
    """Least time of each segment (``inf`` where none fits), one batch for all.

    ``stage_in_flight[s]`` is stage s's in-flight count; the other arrays give
    each segment's stage, first layer and end (exclusive).
    """
    table = FrontTable(model.fronts, bucket)
    in_flight = np.asarray(stage_in_flight, dtype=np.int64)[np.asarray(seg_stage, dtype=np.int64)]
    ids, problems = classify(model, kind_index(model), in_flight, np.asarray(seg_start, dtype=np.int64),
                             np.asarray(seg_end, dtype=np.int64))
    values = solve_problems(problems, table, backend, max_bytes)
    return values[ids]
