"""The exact best interleaved splits by the simulated score, for models that are one kind
between their first and last layer (``best_splits(..., interleave=v, score="simulated")``).

Such a split is one tuple of per-chunk counts per stage, and a stage's plan depends
on its tuple only (:mod:`._interleaved`), so each (stage, tuple) has its per-chunk
forward and backward times ``f_{s,c}``, ``b_{s,c}`` (from its plan, as ``gpuknap
timeline`` shows them).  The simulated time depends on every chunk's times, so
every tuple is a choice of its own: a branch and bound over stages, Megatron's
interleaved schedule simulated at the leaves.  Two paths of the schedule bound
it from below (``t = f + b``, ``M`` micro-batches, ``F_j`` stage j's forwards
summed over its chunks):

- stage s runs all its operations between the first forward of micro-batch 0 on
  chunk 0 and the last backward (of the last micro-batch on chunk 0), which cross
  chunk 0 of the stages before it: ``sum_{j<s} t_{j,0} + M t_s``;
- micro-batch 0 goes forward through every chunk of every stage, back down the
  last chunk of the stages after s, then stage s runs every backward and the
  forwards after its warm-up (``n_c`` on chunk c, from Megatron's order), and the
  last backward crosses chunk 0 of the stages before it:
  ``sum_j F_j + sum_{j>s} b_{j,v-1} + sum_c (M b_{s,c} + n_c f_{s,c}) + sum_{j<s} b_{j,0}``.

A partial split carries its own terms; dynamic programs over the stages still to
place bound theirs.  The first k-th best is the exact best splits of the
interleaved closed form, simulated; tuples whose fastest options alone take
more than the k-th best over M are left out.  Every split cut has a bound above
the k-th best found: the answer is exact, ties by :func:`._ties.tie_key`.

These bounds are looser than the plain schedule's (:mod:`._critical`): they see
neither the bubbles of unequal chunks nor the warm-up of the later chunks, so
on large models the walk can be long.  After ``BUDGET`` partial splits it stops
and returns the best splits found, marked not proven optimal, with the least
bound of the partial splits it left as a lower bound on the optimum.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..engine import Layers, Planner, Stage, report
from ..schedule import schedule_table, unbounded_iteration_times
from ._classify import kind_counts
from ._interleaved import TupleMemo, plan_tuples
from ._rounds import Solver
from ._ties import tie_key

#: Partial splits a search expands before it stops with the best found (not proven optimal).
BUDGET = 20_000
#: Relative slack between a bound and the k-th best (sums in another order).
SLACK = 1e-9


def _chunk_times(model: Any, s: int, p: int, chunks: int, counts: tuple, table: list, plan: Planner) -> np.ndarray:
    """``[2, chunks]`` forward and backward times per chunk of stage s holding ``counts``
    under its plan (a kind's layers take its chosen options slowest first, as
    ``model.option_names`` gives them)."""
    n, last = model.layers, chunks * p - 1
    kinds, groups = [], []
    for c, count in enumerate(counts):
        i = c * p + s
        a = 0 if i == 0 else n - count if i == last else 1
        kinds.append((model.kinds[a:a + count], int(table[s][c])))
        groups += [Layers(kind, k, int(table[s][c])) for kind, k in kind_counts(model.kinds[a:a + count])]
    static = 0.0
    for g in groups:
        static += g.count * float(model.static[g.kind])
    choice = plan.stage(Stage(groups, model.capacity - model.reserved - static))
    queues: dict = {}
    for a in choice.assignments:
        queues.setdefault((a.layers.kind, a.layers.in_flight), []).extend([a.option] * a.count)
    out = np.zeros((2, chunks))
    for c, (layer_kinds, k) in enumerate(kinds):
        for kind in layer_kinds:
            option = queues[(kind, k)].pop(0)
            out[0, c] += option.forward_time
            out[1, c] += option.backward_time
    return out


class _Choices:
    """Per stage, its tuples with their per-chunk times and bound terms."""

    def __init__(self, model: Any, plan: Any, values: np.ndarray, p: int, chunks: int, table: list,
                 planner: Planner, group: int):
        m = model.micro_batches
        order = schedule_table(m, chunks, group)
        per: list[list] = [[] for _ in range(p)]
        for (s, total, counts), t in zip(plan.keys, plan.key_times(values).tolist()):
            if math.isfinite(t):
                per[s].append((total, t, counts))
        self.stages = []
        for s, rows in enumerate(per):
            rows.sort(key=lambda r: (r[0], r[1], r[2]))
            w = min((p - s - 1) * 2 + (chunks - 1) * group, m * chunks)
            after = np.bincount([c for _, c in order[w + 1:]], minlength=chunks).astype(np.float64)
            fb = np.array([_chunk_times(model, s, p, chunks, counts, table, planner) for _, _, counts in rows]
                          ).reshape(len(rows), 2, chunks)
            self.stages.append({
                "total": np.array([r[0] for r in rows], dtype=np.int64), "t": np.array([r[1] for r in rows]),
                "counts": [r[2] for r in rows], "fb": fb,
                "t0": fb[:, 0, 0] + fb[:, 1, 0], "b0": fb[:, 1, 0], "blast": fb[:, 1, chunks - 1],
                "F": fb[:, 0].sum(axis=1), "own": (m * fb[:, 1] + after[None, :] * fb[:, 0]).sum(axis=1)})


def _programs(C: _Choices, p: int, n: int, m: int) -> tuple:
    """Over the stages s.. holding layers a..: the least ``sum (F + b_last)`` (``R``), the least
    largest first-bound term (``W``) and second-bound term (``Q``), relative to stage s."""
    R = np.full((p + 1, n + 1), math.inf)
    W = np.full((p + 1, n + 1), math.inf)
    Q = np.full((p + 1, n + 1), math.inf)
    R[p, n], W[p, n], Q[p, n] = 0.0, -math.inf, -math.inf
    for s in range(p - 1, -1, -1):
        x = C.stages[s]
        for a in range(n + 1):
            end = a + x["total"]
            ok = np.flatnonzero(end <= n)
            if not len(ok):
                continue
            e = end[ok]
            R[s, a] = (x["F"][ok] + x["blast"][ok] + R[s + 1][e]).min()
            W[s, a] = np.maximum(m * x["t"][ok], x["t0"][ok] + W[s + 1][e]).min()
            Q[s, a] = np.maximum(x["F"][ok] + x["b0"][ok] + Q[s + 1][e], x["F"][ok] + x["own"][ok] + R[s + 1][e]).min()
    return R, W, Q


def top_interleaved_simulated(model: Any, p: int, chunks: int, top: int, table: list, fronts: Any,
                              fastest: np.ndarray, most: int, seeds: list, bucket: float, backend: Any,
                              in_flight: Any, max_bytes: int | None, group: int | None = None,
                              budget: int = BUDGET) -> tuple[list, bool, float]:
    """``([(counts, score)], exact, lower bound)``: the ``top`` interleaved splits by simulated time,
    exact when the walk ended within ``budget`` partial splits (else the best found, and the
    least bound of the partial splits left as a lower bound on the best);
    ``seeds``: some splits (chunk-major counts) for a first k-th best."""
    from ._interleaved import simulated_rows

    m, n = model.micro_batches, model.layers
    g = p if group is None else group
    found: dict[tuple, float] = {}
    if seeds:
        rows = np.array(seeds, dtype=np.int64)
        for row, value in zip(seeds, simulated_rows(model, rows, chunks, bucket, backend, in_flight,
                                                    max_bytes).tolist()):
            found[tuple(row)] = value

    def kth() -> float:
        values = sorted(v for v in found.values() if math.isfinite(v))
        return values[top - 1] if len(values) >= top else math.inf

    tau = kth()
    plan = plan_tuples(model, p, chunks, table, fronts, tau / m if math.isfinite(tau) else math.inf, fastest, most,
                       TupleMemo())
    values = Solver(backend, max_bytes)([(fronts, plan.problems, plan.verdicts)])[0]
    C = _Choices(model, plan, values, p, chunks, table, Planner(model.fronts, bucket, table=fronts), g)
    R, W, Q = _programs(C, p, n, m)
    expanded = 0
    leaves: list[tuple] = []
    unexplored = [math.inf]  # the least bound of the partial splits left when the budget ran out

    def flush() -> None:
        nonlocal tau
        fresh = [leaf for leaf in leaves if leaf[0] not in found]
        leaves.clear()
        if fresh:
            fb = np.array([f for _, f in fresh])  # [B, P, 2, chunks]
            values = unbounded_iteration_times(fb[:, :, 0], fb[:, :, 1], m, "interleaved", group=group)
            for (counts, _), value in zip(fresh, values.tolist()):
                found[counts] = value
            tau = kth()

    def walk(s: int, a: int, state: tuple, picks: list) -> None:
        nonlocal expanded
        if s == p:
            if a != n:  # the stages left layers over: not a split (its bound is infinite)
                return
            counts = [0] * (p * chunks)
            for j, (i, x) in enumerate(picks):
                for c, k in enumerate(x["counts"][i]):
                    counts[c * p + j] = k
            leaves.append((tuple(counts), [x["fb"][i] for i, x in picks]))
            if len(leaves) >= 512:
                flush()
            return
        pre0, pre_b0, pre_f, h_one, h_top = state
        x = C.stages[s]
        end = a + x["total"]
        ok = np.flatnonzero(end <= n)
        if not len(ok):
            return
        e = end[ok]
        one = np.maximum(h_one, pre0 + m * x["t"][ok])
        top_ = np.maximum(h_top + x["blast"][ok], pre_b0 + x["own"][ok])
        f = pre_f + x["F"][ok]
        bound = np.maximum.reduce([one, pre0 + x["t0"][ok] + W[s + 1][e], top_ + f + R[s + 1][e],
                                   f + pre_b0 + x["b0"][ok] + Q[s + 1][e]])
        rank = np.argsort(bound, kind="stable")
        for r in rank.tolist():
            if not (bound[r] <= tau * (1 + SLACK) and math.isfinite(bound[r])):  # nothing fits below an infinite one
                break
            if expanded >= budget:  # the least bound left here bounds every split not seen below it
                unexplored[0] = min(unexplored[0], float(bound[r]))
                return
            expanded += 1
            i = int(ok[r])
            walk(s + 1, int(end[i]), (pre0 + float(x["t0"][i]), pre_b0 + float(x["b0"][i]), float(f[r]),
                                      float(one[r]), float(top_[r])), picks + [(i, x)])

    report("interleaved splits", 0, 1)
    walk(0, 0, (0.0, 0.0, 0.0, -math.inf, -math.inf), [])
    flush()
    report("interleaved splits", 1, 1)
    keep = [r for r, v in found.items() if math.isfinite(v) and (not math.isfinite(tau) or v <= tau)]
    exact = not math.isfinite(unexplored[0]) or unexplored[0] > tau * (1 + SLACK)
    if not keep:
        return [], exact, math.nan
    ranked = model.rank(np.array(keep, dtype=np.int64), bucket, backend, in_flight, chunks, max_bytes)
    times_exact = simulated_rows(model, np.array(keep, dtype=np.int64), chunks, bucket, backend, in_flight, max_bytes)
    times = ranked.stage_table()
    order = sorted(range(len(keep)), key=lambda i: tie_key(float(times_exact[i]), times[i], keep[i]))
    out = [(keep[i], float(times_exact[i])) for i in order[:top]]
    return out, exact, out[0][1] if exact else min(unexplored[0], out[0][1])
