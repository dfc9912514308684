"""Ranking given splits of a model (``PipelineModel.rank``): every row's stages, deduplicated
with array operations before any stage problem is built.

Plain splits: each distinct (stage, start, end) segment is one stage problem,
classified as an integer row (:mod:`._segments`).  Interleaved splits: each
distinct (stage, start and end of each chunk) is one problem.  Either way the
distinct problems are one batch for the engine.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..engine import FrontTable, Ranking, canonical, solve_problems
from ._segments import segment_times


def rank_plain(model: Any, arr: np.ndarray, p: int, table: list, bucket: float, backend: Any,
               max_bytes: int | None, rebuild: Any) -> Ranking:
    """``rank`` for plain splits ``arr [B, P]`` (validated): each distinct segment solved once."""
    batch = len(arr)
    n = model.layers + 1
    ends = np.cumsum(arr, axis=1)
    codes = (np.arange(p, dtype=np.int64)[None, :] * n + (ends - arr)) * n + ends
    if p * n * n <= 2**26:  # dense: mark the segments present
        present = np.zeros(p * n * n, dtype=bool)
        present[codes.ravel()] = True
        unique = np.flatnonzero(present)
        lookup = None
    else:
        unique, lookup = np.unique(codes.ravel(), return_inverse=True)
    seg_stage, rest = np.divmod(unique, n * n)
    seg_start, seg_end = np.divmod(rest, n)
    inflight = np.array([row[0] for row in table], dtype=np.int64)
    values = segment_times(model, inflight, seg_stage, seg_start, seg_end, bucket, backend, max_bytes)
    if lookup is None:
        dense = np.full(p * n * n, np.inf)
        dense[unique] = values
        times = dense[codes]
    else:
        times = values[lookup].reshape(batch, p)
    offsets = np.arange(batch + 1, dtype=np.int64) * p
    return Ranking(times.ravel(), offsets, rebuild)


def rank_interleaved(model: Any, arr: np.ndarray, p: int, chunks: int, table: list, bucket: float, backend: Any,
                      max_bytes: int | None, rebuild: Any) -> Ranking:
    """``rank`` for interleaved splits: rows of (stage, start and end of each chunk)
    are deduplicated with array operations; only distinct stages become problems."""

    batch = len(arr)
    ends = np.cumsum(arr, axis=1)
    starts = ends - arr
    per_stage = np.stack((starts.reshape(batch, chunks, p), ends.reshape(batch, chunks, p)), axis=3)
    rows = np.concatenate((np.broadcast_to(np.arange(p)[None, :, None], (batch, p, 1)),
                           per_stage.transpose(0, 2, 1, 3).reshape(batch, p, 2 * chunks)), axis=2)
    unique, inverse = np.unique(rows.reshape(batch * p, 1 + 2 * chunks), axis=0, return_inverse=True)
    fronts = FrontTable(model.fronts, bucket)
    problem_of: dict = {}
    problems, ids = [], np.empty(len(unique), dtype=np.int64)
    for u, row in enumerate(unique.tolist()):
        s = row[0]
        groups = [g for c in range(chunks) for g in model.segment_groups(row[1 + 2 * c], row[2 + 2 * c], table[s][c])]
        problem = canonical(groups, model.budget_of(groups))
        ids[u] = problem_of.setdefault(problem, len(problems))
        if ids[u] == len(problems):
            problems.append(problem)
    values = solve_problems(problems, fronts, backend, max_bytes)
    times = values[ids][inverse.ravel()]
    return Ranking(times, np.arange(batch + 1, dtype=np.int64) * p, rebuild)
