"""Segments of a model as stage problems, classified with array operations.

A segment is stage ``s`` taking layers ``a:b`` of a model.  Its stage problem
is its layers gathered by kind, kinds in order of first appearance from ``a``,
each with the stage's in-flight count, and its budget ``capacity - reserved -
static bytes``.  Classifying millions of segments one by one in Python is
what made whole-model search slow; here every segment is a row of integers:

- counts per kind from prefix sums (``prefix[b] - prefix[a]``);
- the order of its kinds: the kinds present in ``a:b`` are exactly the first
  ``m`` kinds by first occurrence at or after ``a`` (a kind first met after
  one present is met before ``b`` too), so each present kind's rank is read
  from a per-start table;
- the budget as the same float additions, in the same order, as
  :meth:`PipelineModel.budget_of` (so every entry point sees the same bytes);

and ``np.unique`` over the rows ``(in-flight, budget bits, counts, ranks)``
gives each segment its problem.  Equal rows are equal problems exactly.  The
segments are first grouped by ``(in-flight, counts, rank row of a)``, which
fixes the rest of the row, so ranks and budgets are computed once per group
(a few hundred of a search's hundreds of thousands of segments).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np

from ..engine import StageProblem

#: Segments classified per block (bounds the rows held at once).
BLOCK_CELLS = 2**24
#: Largest per-layer kind table (layers x distinct kinds): its tables and their sort hold about 60
#: bytes an entry at once (a red team's 8,000 layers of 8,000 kinds, 2**26 entries, took 4 GB).
MAX_TABLE = 2**23


def kind_counts(kinds: Sequence[Hashable]) -> tuple:
    """``((kind, n), ...)`` in order of first appearance."""
    seen: dict[Hashable, int] = {}
    for kind in kinds:
        seen[kind] = seen.get(kind, 0) + 1
    return tuple(seen.items())


@dataclass(frozen=True)
class KindIndex:
    """Per-layer kind codes of a model and the tables that classify its segments.

    ``prefix[i, c]``: layers of kind code ``c`` among the first ``i``;
    ``rank[a, c]``: the rank of kind ``c`` by first occurrence at or after
    layer ``a`` (``K`` when it does not occur again); ``static[c]`` its bytes;
    ``rank_class[a]``: the number of ``rank[a]`` among the distinct rows of ``rank``.
    """

    kinds: tuple
    codes: np.ndarray
    prefix: np.ndarray
    rank: np.ndarray
    static: np.ndarray
    rank_class: np.ndarray

    @property
    def n_kinds(self) -> int:
        return len(self.kinds)


def kind_index(model: Any) -> KindIndex:
    """The :class:`KindIndex` of a :class:`PipelineModel`."""
    kinds = model.kind_order
    n, k = model.layers, len(kinds)
    if (n + 1) * k > MAX_TABLE:
        raise ValueError(f"a model of {n:,} layers and {k:,} distinct kinds is too varied to classify its "
                         f"segments (layers x kinds over {MAX_TABLE:,}); merge kinds that share options")
    code_of = {kind: c for c, kind in enumerate(kinds)}
    codes = np.fromiter((code_of[kind] for kind in model.kinds), dtype=np.int64, count=n)
    onehot = np.zeros((n, k), dtype=np.int32)
    onehot[np.arange(n), codes] = 1
    prefix = np.zeros((n + 1, k), dtype=np.int32)
    np.cumsum(onehot, axis=0, out=prefix[1:])
    # next occurrence of each kind at or after a (n when none), then ranks by it
    nxt = np.full((n + 1, k), n, dtype=np.int64)
    at = np.where(onehot.astype(bool), np.arange(n)[:, None], n)
    nxt[:n] = np.minimum.accumulate(at[::-1], axis=0)[::-1]
    order = np.argsort(nxt, axis=1, kind="stable")
    rank = np.empty_like(order)
    rank[np.arange(n + 1)[:, None], order] = np.arange(k)[None, :]
    rank[nxt == n] = k
    static = np.array([float(model.static[kind]) for kind in kinds], dtype=np.float64)
    _, rank_class = np.unique(rank, axis=0, return_inverse=True)
    return KindIndex(tuple(kinds), codes, prefix, rank.astype(np.int32), static,
                     rank_class.ravel().astype(np.int64))


def _budgets(index: KindIndex, base: float, counts: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """``base - sum(count * static)`` with the sum added kind by kind in rank order, from 0.0."""
    rows = np.arange(len(counts))
    order = np.argsort(ranks, axis=1, kind="stable")
    total = np.zeros(len(counts))
    for p in range(index.n_kinds):  # absent kinds add exactly 0.0
        c = order[:, p]
        total += counts[rows, c] * index.static[c]
    return base - total


def classify(model: Any, index: KindIndex, in_flight: np.ndarray, start: np.ndarray,
             end: np.ndarray) -> tuple[np.ndarray, list[StageProblem]]:
    """Each segment's problem id, and the distinct problems (ids index the list).

    ``in_flight``, ``start`` and ``end`` are per-segment integer arrays.
    """
    k = index.n_kinds
    base = model.capacity - model.reserved
    ids = np.empty(len(start), dtype=np.int64)
    seen: dict[bytes, int] = {}
    problems: list[StageProblem] = []
    block = max(1, BLOCK_CELLS // (2 * k + 2))
    for lo in range(0, len(start), block):
        a, b = start[lo:lo + block], end[lo:lo + block]
        counts = (index.prefix[b] - index.prefix[a]).astype(np.int64)
        groups = np.column_stack((np.asarray(in_flight[lo:lo + block], dtype=np.int64), counts,
                                  index.rank_class[a]))
        first, inverse = _unique_rows(groups)
        one = a[first]  # a segment of each group: its ranks and budget are the group's
        counts = counts[first]
        ranks = np.where(counts > 0, index.rank[one], -1).astype(np.int64)
        budgets = _budgets(index, base, counts, ranks)
        rows = np.column_stack((groups[first, 0], budgets.view(np.int64), counts, ranks))
        local = np.empty(len(rows), dtype=np.int64)
        for u, row in enumerate(rows):
            key = row.tobytes()
            pid = seen.get(key)
            if pid is None:
                pid = seen[key] = len(problems)
                problems.append(_problem(index, row, k))
            local[u] = pid
        ids[lo:lo + block] = local[inverse.ravel()]
    return ids, problems


def _unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first, inverse)``: the index of one row of each distinct row, in the order of
    ``np.unique(rows, axis=0)``, and each row's number in that order; fast when the rows fit
    one integer: they are packed into one int64 by mixed radix when their ranges allow (then
    a 1-D unique, or a dense table when the key space is small); else compared whole."""
    low = rows.min(axis=0) if len(rows) else np.zeros(rows.shape[1], dtype=np.int64)
    spans = (rows.max(axis=0) - low + 1) if len(rows) else np.ones(rows.shape[1], dtype=np.int64)
    space = 1
    for span in spans.tolist():
        space *= span
    if space >= 2**62:
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        return first, inverse.ravel()
    key = np.zeros(len(rows), dtype=np.int64)
    for c, (lo_, span) in enumerate(zip(low.tolist(), spans.tolist())):
        key = key * span + (rows[:, c] - lo_)
    if space <= max(2**22, 4 * len(rows)):  # dense: mark the keys present, number them in key order
        present = np.zeros(space, dtype=bool)
        present[key] = True
        number = np.cumsum(present) - 1
        inverse = number[key]
        first = np.empty(int(present.sum()), dtype=np.int64)
        first[inverse[::-1]] = np.arange(len(rows))[::-1]
    else:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return first, inverse.ravel()


def _problem(index: KindIndex, row: np.ndarray, k: int) -> StageProblem:
    values = row.tolist()  # a few kinds per row: plain Python beats small numpy calls here
    in_flight = values[0]
    budget = float(row[1:2].view(np.float64)[0])
    counts, ranks = values[2:2 + k], values[2 + k:]
    present = sorted((ranks[c], c) for c in range(k) if counts[c] > 0)
    runs = tuple(((index.kinds[c], in_flight), counts[c]) for _, c in present)
    return StageProblem(runs, budget)
