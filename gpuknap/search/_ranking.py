"""Ranking given splits of a model (``PipelineModel.rank``): every row's stages, deduplicated
with array operations before any stage problem is built.

Plain splits: each distinct (stage, start, end) segment is one stage problem,
classified as an integer row (:mod:`._segments`).  Interleaved splits: each
distinct (stage, start and end of each chunk) is one problem.  Either way the
distinct problems are one batch for the engine.

Memory: the splits are read a block of rows at a time (no copy of the whole
array is made or kept); the result keeps, per stage of every row, a small
integer code of its segment (one or two bytes when there are few distinct
segments) and the distinct segments' times.  A row's counts and stage times
are decoded from its codes on demand.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..engine import FrontTable, Ranking, canonical, compact_codes, solve_problems
from ._segments import segment_times

#: Rows of splits read at a time (the temporaries of a block stay a few MiB).
BLOCK = 1 << 15


def _blocks(batch: int):
    return ((lo, min(lo + BLOCK, batch)) for lo in range(0, batch, BLOCK))


def _ends(arr: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts and cumulative ends of rows ``lo:hi`` as int64."""
    counts = np.asarray(arr[lo:hi], dtype=np.int64)
    return counts, np.cumsum(counts, axis=1)


def rank_plain(model: Any, arr: np.ndarray, p: int, table: list, bucket: float, backend: Any,
               max_bytes: int | None, rebuild: Callable[[list], Any], where: Any = None) -> Ranking:
    """``rank`` for plain splits ``arr [B, P]`` (any integer dtype, or integral floats), its
    rows validated here as they are read: each distinct segment solved once.
    ``rebuild(counts)`` plans one split; ``where(row)`` names a row in errors."""
    batch = len(arr)
    n = model.layers + 1
    space = p * n * n
    base = np.arange(p, dtype=np.int64) * (n * n)
    dense = space <= max(1 << 22, batch * p)  # a lookup table no larger than the splits
    raw = np.empty(batch * p, dtype=np.uint32 if space < 2**32 else np.int64) if dense else None
    present = np.zeros(space, dtype=bool) if dense else None
    unique = np.zeros(0, dtype=np.int64)
    for lo, hi in _blocks(batch):
        counts, ends = _valid_block(model, arr, lo, hi, where)
        codes = ends - counts  # (stage * n + start) * n + end, per stage of each row
        codes *= n
        codes += ends
        codes += base
        if dense:
            present[codes] = True
            raw[lo * p:hi * p] = codes.ravel()
        else:
            unique = np.union1d(unique, codes.ravel())
    if dense:
        unique = np.flatnonzero(present)
        del present
    seg_stage, rest = np.divmod(unique, n * n)
    seg_start, seg_end = np.divmod(rest, n)
    inflight = np.array([row[0] for row in table], dtype=np.int64)
    values = segment_times(model, inflight, seg_stage, seg_start, seg_end, bucket, backend, max_bytes)
    order = np.argsort(values, kind="stable")  # codes by time: a row's slowest stage has its largest code
    rank_of = np.empty(len(order), dtype=np.int64)
    rank_of[order] = np.arange(len(order))
    kept = compact_codes(np.zeros(0, dtype=np.int64), len(unique)).dtype
    if dense:
        ident = np.zeros(space, dtype=kept)
        ident[unique] = rank_of
        out = ident[raw]
        del raw, ident
    else:
        out = np.empty(batch * p, dtype=kept)
        for lo, hi in _blocks(batch):
            counts, ends = _valid_block(model, arr, lo, hi, where)
            c = ((ends - counts) * n + ends + base).ravel()
            out[lo * p:hi * p] = rank_of[np.searchsorted(unique, c)]
    counts_of = (seg_end - seg_start)[order]

    def plan(i: int) -> Any:
        return rebuild(counts_of[out[i * p:(i + 1) * p]].tolist())

    return Ranking(out, values[order], p, plan)


def _valid_block(model: Any, arr: np.ndarray, lo: int, hi: int, where: Any) -> tuple[np.ndarray, np.ndarray]:
    """Counts and ends of rows ``lo:hi`` as int64, checked: every count at least 1 and at
    most the model's layers, summing to its layers (else the model's error for the row)."""
    block = arr[lo:hi]
    where = where or (lambda row: f"splits row {row}")
    if block.dtype.kind == "f":
        model._check_block(block, lo, where)
    counts = np.asarray(block, dtype=np.int64)
    ends = np.cumsum(counts, axis=1)
    if not ((counts.min(initial=1) >= 1) and counts.max(initial=0) <= model.layers
            and (ends[:, -1] == model.layers).all()):
        model._check_block(block, lo, where)
        raise ValueError(f"splits rows {lo}..{hi - 1} are not splits of {model.layers} layers")
    return counts, ends


def rank_interleaved(model: Any, arr: np.ndarray, p: int, chunks: int, table: list, bucket: float, backend: Any,
                      max_bytes: int | None, rebuild: Callable[[list], Any]) -> Ranking:
    """``rank`` for interleaved splits: rows of (stage, start and end of each chunk)
    are deduplicated with array operations; only distinct stages become problems."""
    batch = len(arr)
    n = model.layers + 1
    width = 1 + 2 * chunks

    def rows(lo: int, hi: int) -> np.ndarray:  # [rows * p, 1 + 2 * chunks]
        counts, ends = _ends(arr, lo, hi)
        per_stage = np.stack(((ends - counts).reshape(-1, chunks, p), ends.reshape(-1, chunks, p)), axis=3)
        stage = np.broadcast_to(np.arange(p)[None, :, None], (hi - lo, p, 1))
        return np.concatenate((stage, per_stage.transpose(0, 2, 1, 3).reshape(hi - lo, p, 2 * chunks)),
                              axis=2).reshape(-1, width)

    if p * float(n) ** (2 * chunks) < 2.0 ** 62:  # a row fits one integer code
        weights = n ** np.arange(width - 1, -1, -1, dtype=np.int64)
        unique_codes = np.zeros(0, dtype=np.int64)
        for lo, hi in _blocks(batch):
            unique_codes = np.union1d(unique_codes, rows(lo, hi) @ weights)
        unique = np.empty((len(unique_codes), width), dtype=np.int64)
        rest = unique_codes.copy()
        for j in range(width - 1, -1, -1):
            rest, unique[:, j] = np.divmod(rest, n)
        kept = compact_codes(np.zeros(0, dtype=np.int64), len(unique)).dtype
        out = np.empty(batch * p, dtype=kept)
        for lo, hi in _blocks(batch):
            out[lo * p:hi * p] = np.searchsorted(unique_codes, rows(lo, hi) @ weights)
    else:
        unique, inverse = np.unique(rows(0, batch), axis=0, return_inverse=True)
        out = compact_codes(inverse.ravel(), len(unique))
    fronts = FrontTable(model.fronts, bucket)
    problem_of: dict = {}
    problems, ids = [], np.empty(len(unique), dtype=np.int64)
    for u, row in enumerate(unique.tolist()):
        s = row[0]
        groups = [g for c in range(chunks) for g in model._groups(row[1 + 2 * c], row[2 + 2 * c], table[s][c])]
        problem = canonical(groups, model._budget(groups))
        ids[u] = problem_of.setdefault(problem, len(problems))
        if ids[u] == len(problems):
            problems.append(problem)
    times = solve_problems(problems, fronts, backend, max_bytes)[ids]
    order = np.argsort(times, kind="stable")  # codes by time, as for plain splits
    rank_of = np.empty(len(order), dtype=out.dtype)
    rank_of[order] = np.arange(len(order))
    out = rank_of[out]
    counts = (unique[:, 2::2] - unique[:, 1::2])[order]  # [distinct rows, chunks]

    def plan(i: int) -> Any:
        per_stage = counts[out[i * p:(i + 1) * p]]  # [p, chunks]
        return rebuild(per_stage.T.ravel().tolist())  # chunk-major

    return Ranking(out, times[order], p, plan)
