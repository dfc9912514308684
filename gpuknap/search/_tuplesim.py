"""The exact best interleaved splits by the simulated score, for models that are one kind
between their first and last layer (``best_splits(..., interleave=v, score="simulated")``).

Such a split is one tuple of per-chunk counts per stage, and a stage's plan depends
on its tuple only (:mod:`._interleaved`).  The simulated time depends on every
chunk's times, not on stage totals, so every tuple is a choice of its own.  A
branch and bound over stages, with Megatron's interleaved schedule simulated
at the leaves:

- **bound**: stage s runs every operation of every chunk (``M t_s``, with ``t_s``
  its time) between the first forward of micro-batch 0 on chunk 0, which
  crosses chunk 0 of the stages before it, and the last backward, of the last
  micro-batch on chunk 0, which crosses them back: ``T >= sum over j < s of
  t_{j,0} + M t_s``, with ``t_{j,0}`` (chunk 0 of stage j) at least its layers'
  fastest times.  A dynamic program over stages gives the least of it over the
  stages still to place;
- **first k-th best**: the exact best splits of the interleaved closed form,
  simulated; tuples whose fastest options alone take more than the k-th best
  over M are left out (they cannot be in the top);
- a depth-first walk, best bound first; complete splits are simulated in
  batches (``model.rank``, each split's plan) and the k-th best falls as better
  ones turn up.

Every split cut has a bound above the k-th best found: the answer is exact,
ties by :func:`._ties.tie_key` on the stages' times and the chunk-major counts.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..engine import report
from ._interleaved import TupleMemo, plan_tuples, simulated_rows
from ._rounds import Solver
from ._ties import tie_key

#: Most partial splits one search may expand before it refuses.
MAX_EXPANDED = 5_000_000
#: Relative slack between a bound and the k-th best (sums in another order).
SLACK = 1e-9


class _Choices:
    """Per stage, its tuples: total, time, chunk-0 lower bound, counts."""

    def __init__(self, plan: Any, values: np.ndarray, p: int, chunks: int, n: int, fastest: np.ndarray):
        per: list[list] = [[] for _ in range(p)]
        times = np.asarray(values)[plan.ids].tolist() if plan.keys else []
        for (s, total, counts), t in zip(plan.keys, times):
            if math.isfinite(t):
                a = 0 if s == 0 else 1  # chunk 0 of stage s is virtual stage s: the first layer only for s = 0
                low = float(fastest[a + counts[0]] - fastest[a])
                per[s].append((total, t, low, counts))
        self.stages = []
        for rows in per:
            rows.sort(key=lambda r: (r[0], r[1], r[3]))
            self.stages.append((np.array([r[0] for r in rows], dtype=np.int64), np.array([r[1] for r in rows]),
                                np.array([r[2] for r in rows]), [r[3] for r in rows]))


def _finish(C: _Choices, p: int, n: int, m: int) -> np.ndarray:
    """``rest[s, a]``: the least, over the ways stages s.. can hold layers a.., of the largest
    ``sum of chunk-0 bounds of the stages before + M t`` (relative to stage s); ``inf``: none."""
    rest = np.full((p + 1, n + 1), math.inf)
    rest[p, n] = -math.inf
    for s in range(p - 1, -1, -1):
        total, t, low, _ = C.stages[s]
        for a in range(n + 1):
            end = a + total
            ok = end <= n
            if not ok.any():
                continue
            value = np.maximum(m * t[ok], low[ok] + rest[s + 1][end[ok]])
            rest[s, a] = value.min()
    return rest


def top_interleaved_simulated(model: Any, p: int, chunks: int, top: int, table: list, fronts: Any,
                              fastest: np.ndarray, most: int, seeds: list, bucket: float, backend: Any,
                              in_flight: Any, max_bytes: int | None) -> list[tuple]:
    """The exact ``top`` interleaved splits by simulated time as ``[(counts, score)]``;
    ``seeds``: some splits (chunk-major counts) for a first k-th best."""
    m, n = model.micro_batches, model.layers

    def simulate(rows: list) -> np.ndarray:
        return simulated_rows(model, np.array(rows, dtype=np.int64), chunks, bucket, backend, in_flight, max_bytes)

    found: dict[tuple, float] = {}
    if seeds:
        for row, value in zip(seeds, simulate(seeds).tolist()):
            found[tuple(row)] = value

    def kth() -> float:
        values = sorted(v for v in found.values() if math.isfinite(v))
        return values[top - 1] if len(values) >= top else math.inf

    tau = kth()
    plan = plan_tuples(model, p, chunks, table, fronts, tau / m if math.isfinite(tau) else math.inf, fastest, most,
                       TupleMemo())
    values = Solver(backend, max_bytes)([(fronts, plan.problems, plan.verdicts)])[0]
    C = _Choices(plan, values, p, chunks, n, fastest)
    rest = _finish(C, p, n, m)
    expanded = 0
    leaves: list[tuple] = []

    def flush() -> None:
        nonlocal tau
        fresh = [row for row in dict.fromkeys(leaves) if row not in found]
        leaves.clear()
        if fresh:
            for row, value in zip(fresh, simulate(fresh).tolist()):
                found[row] = value
            tau = kth()

    def walk(s: int, a: int, pre: float, high: float, picks: list) -> None:
        nonlocal expanded
        if s == p:
            counts = [0] * (p * chunks)
            for j, tup in enumerate(picks):
                for c, k in enumerate(tup):
                    counts[c * p + j] = k
            leaves.append(tuple(counts))
            if len(leaves) >= 256:
                flush()
            return
        total, t, low, tuples = C.stages[s]
        end = a + total
        ok = np.flatnonzero(end <= n)
        if not len(ok):
            return
        bound = np.maximum(high, pre + np.maximum(m * t[ok], low[ok] + rest[s + 1][end[ok]]))
        order = ok[np.argsort(bound, kind="stable")]
        for i, b in zip(order.tolist(), np.sort(bound, kind="stable").tolist()):
            if not b <= tau * (1 + SLACK):
                break
            expanded += 1
            if expanded > MAX_EXPANDED:
                raise ValueError(f"the interleaved simulated search would expand over {MAX_EXPANDED:,} partial "
                                 "splits here; use the 1f1b score (or fewer chunks)")
            walk(s + 1, int(end[i]), pre + float(low[i]), max(high, pre + m * float(t[i])), picks + [tuples[i]])

    report("interleaved splits", 0, 1)
    walk(0, 0, 0.0, -math.inf, [])
    flush()
    report("interleaved splits", 1, 1)
    if not math.isfinite(tau):
        keep = [r for r, v in found.items() if math.isfinite(v)]
    else:
        keep = [r for r, v in found.items() if v <= tau]
    if not keep:
        return []
    times = model.rank(np.array(keep, dtype=np.int64), bucket, backend, in_flight, chunks, max_bytes).stage_table()
    ranked = sorted(range(len(keep)), key=lambda i: tie_key(found[keep[i]], times[i], keep[i]))
    return [(keep[i], found[keep[i]]) for i in ranked[:top]]
