"""The best interleaved splits: ``best_splits(..., interleave=v)``.

An interleaved split cuts the model into ``v * P`` contiguous segments in
chunk-major order (chunk 0 of stages 0..P-1, then chunk 1, ...); stage s
holds segments ``s, P + s, 2P + s, ...`` under one memory budget, each at the
in-flight count Megatron's interleaved schedule gives its chunk.

**Exact** when every layer between the first and the last is of one kind
(HEAD, N x BODY, TAIL, as SAPP-PPB profiles are): then a stage's problem
depends only on its tuple of per-chunk counts, not on where its segments lie,
and stages are independent once each one's total layer count is fixed.  So a
stage's best time for ``m`` layers is the least over its tuples summing to m
(ties: the most even tuple, then the lexicographically first), and the search over splits is the
plain one over those per-stage totals (:mod:`gpuknap.search`), with a table
``T[s, a, a + m]`` that does not depend on ``a``.  Every returned split gives
each stage its fastest arrangement of chunks for its total; splits that only
rearrange layers among the chunks of a stage at no better time are not listed
separately, and ties are broken by the rule of :mod:`._ties` on the per-stage totals.

**Other models**: a local search (:mod:`._local`), documented as such (not
proven optimal), returned with a lower bound on the optimum.

Scores: ``slowest``; ``1f1b`` becomes the interleaved closed form
``(M - 1/v) * slowest + sum / v`` (for equal stages ``M t + (P - 1) t / v``,
Megatron's bubble shrunk v times), ranked exactly as ``(vM - 1) * slowest + sum``.
It sees stage totals only, not how a stage's layers spread over its chunks, and
a schedule with unequal chunks runs slower than it says; ``simulated`` scores
each split by Megatron's interleaved schedule itself: by a branch and bound over
stage tuples where the model is one kind between its first and last layer
(:mod:`._tuplesim`), else by the local search started from the closed form's
three best splits too, with a lower bound of ``M`` times the least slowest stage
(each stage is busy ``M`` times its time).
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..engine import StageProblem, verdict
from ..schedule import chunk_times, iteration_times
from ._classify import kind_counts
from ._segments import SegmentTable

#: Most per-stage chunk tuples one table may hold.
MAX_TUPLES = 2_000_000


def one_body_kind(model: Any) -> bool:
    """True when every layer but the first and the last is of one kind (the exact case)."""
    return len(set(model.kinds[1:-1])) <= 1


class TuplePlan:
    """The stage problems of an exact interleaved table before any is solved (like
    :class:`._segments.SegmentPlan`): ``problems`` with their ``verdicts``, and
    :meth:`fill` for the table and the best tuple of each ``(stage, total)``."""

    def __init__(self, p: int, n: int, width: int, keys: list, ids: list, problems: list, verdicts: list,
                 pruned: bool):
        self.p, self.n, self.width, self.keys, self.ids = p, n, width, keys, ids
        self.problems, self.verdicts, self.pruned = problems, verdicts, pruned

    def fill(self, values: np.ndarray) -> tuple[SegmentTable, dict]:
        best = np.full((self.p, self.width), np.inf)
        choice: dict = {}
        rank_of: dict = {}
        times = np.asarray(values)[self.ids].tolist() if self.keys else []
        for (s, total, counts), t in zip(self.keys, times):
            key = (t, max(counts) - min(counts), counts)  # fastest, then the most even, then lexicographic
            if math.isfinite(t) and key < rank_of.get((s, total), (math.inf,)):
                rank_of[(s, total)] = key
                best[s, total - 1] = t
                choice[(s, total)] = counts
        band = np.broadcast_to(best[:, None, :], (self.p, self.n + 1, self.width)).copy()
        return SegmentTable(band, self.pruned), choice


class TupleMemo:
    """What the rounds of one interleaved search share: each chunk's kind groups by
    (position, count), each stage tuple's problem, each problem's verdict."""

    def __init__(self) -> None:
        self.pieces: dict = {}
        self.problems: dict = {}  # (s, counts) -> problem
        self.verdicts: dict = {}  # problem -> verdict


def plan_tuples(model: Any, p: int, chunks: int, table: list, fronts: Any, limit: float, fastest: np.ndarray,
                most: int, memo: TupleMemo | None = None) -> TuplePlan:
    """Every stage's chunk tuples (each chunk at least one layer, at most ``most`` layers
    in all) whose layers' fastest options fit ``limit``, as distinct stage problems.
    ``memo``: problems and verdicts of earlier calls of the same search (its rounds)."""
    n, last = model.layers, chunks * p - 1
    top = max(min(most, n - chunks * (p - 1)), chunks)
    pruned = False
    memo = TupleMemo() if memo is None else memo
    pieces, made, judged = memo.pieces, memo.problems, memo.verdicts
    keys, ids = [], []
    index: dict = {}
    problems = []
    if math.comb(top, chunks) > MAX_TUPLES:  # the tuples of counts >= 1 summing to at most top
        raise ValueError(f"an interleaved search of {p} stages x {chunks} chunks over {n} layers would weigh "
                         f"{math.comb(top, chunks):,} chunk arrangements per stage (over {MAX_TUPLES:,}); "
                         "use fewer chunks or more stages")
    every = _tuples(chunks, top)  # [K, chunks], lexicographic
    totals = every.sum(axis=1)
    slack = limit + 1e-9 * (abs(limit) + fastest[-1])
    for s in range(p):
        low = np.zeros(len(every))
        for c in range(chunks):  # the layers' fastest times, added chunk by chunk as floats
            i = c * p + s
            count = every[:, c]
            a = 0 if i == 0 else n - count if i == last else 1
            low += fastest[a + count] - fastest[a]
        fits = low <= slack
        pruned = pruned or not bool(fits.all())
        for row, total in zip(every[fits].tolist(), totals[fits].tolist()):
            counts = tuple(row)
            problem = made.get((s, counts))
            if problem is None:
                problem = made[(s, counts)] = _problem(model, s, p, chunks, counts, table, pieces)
            keys.append((s, total, counts))
            ids.append(index.setdefault(problem, len(index)))
            if len(index) > len(problems):
                problems.append(problem)
        if len(keys) > MAX_TUPLES:
            raise ValueError(f"an interleaved search of {p} stages x {chunks} chunks over {n} layers needs over "
                             f"{MAX_TUPLES:,} stage arrangements; use fewer chunks or more stages")
    verdicts = []
    for q in problems:
        how = judged.get(q)
        if how is None:
            how = judged[q] = verdict(q, fronts)
        verdicts.append(how)
    return TuplePlan(p, n, max(top, 1), keys, ids, problems, verdicts, pruned)


@functools.lru_cache(maxsize=64)
def _tuples(chunks: int, top: int) -> np.ndarray:
    """Every tuple of ``chunks`` counts of at least 1 summing to at most ``top``, in
    lexicographic order (read-only: shared by every search)."""
    out = np.zeros((1, 0), dtype=np.int64)
    for c in range(chunks):  # extend every prefix by each count that leaves room for the chunks after it
        used = out.sum(axis=1)
        room = top - used - (chunks - c - 1)
        reps = np.maximum(room, 0)
        prefix = np.repeat(out, reps, axis=0)
        start = np.repeat(np.cumsum(reps) - reps, reps)
        nxt = np.arange(int(reps.sum())) - start + 1
        out = np.concatenate([prefix, nxt[:, None]], axis=1)
    out.setflags(write=False)
    return out


def body_time(model: Any, fastest: np.ndarray) -> float:
    """The fastest time of a middle layer (0 for models of two layers or fewer)."""
    return float(np.diff(fastest)[len(model.kinds) // 2]) if model.layers > 2 else 0.0


def _problem(model: Any, s: int, p: int, chunks: int, counts: tuple, table: list, pieces: dict) -> Any:
    """The canonical problem of stage s holding ``counts[c]`` layers in chunk c, equal to
    the one ``model.stages`` builds: segment positions stand in for the real ones
    (between the first and the last layer every layer is of one kind), runs of one
    (kind, in-flight) are merged, static bytes added group by group as
    ``model.budget_of`` adds them."""
    n, last = model.layers, chunks * p - 1
    static = 0.0
    runs: list = []
    for c, count in enumerate(counts):
        i = c * p + s
        where = 0 if i == 0 else 2 if i == last else 1
        groups = pieces.get((where, count))
        if groups is None:
            a = (0, 1, n - count)[where]
            groups = pieces[(where, count)] = kind_counts(model.kinds[a:a + count])
        for kind, k in groups:
            static += k * float(model.static[kind])
            key = (kind, int(table[s][c]))
            if runs and runs[-1][0] == key:
                runs[-1][1] += k
            else:
                runs.append([key, k])
    return StageProblem(tuple((key, k) for key, k in runs), float(model.capacity - model.reserved - static))


def tuple_cap(most: int, body: float, limit: float) -> int:
    """Layers a stage may hold under ``limit`` (each middle layer takes at least ``body``)."""
    return most if not (math.isfinite(limit) and body > 0) else min(most, int(limit // body) + 3)


class TupleSource:
    """The tables of one exact interleaved search (a :class:`gpuknap.search._rounds.Source`):
    per stage and layer total, the best time over its chunk tuples under a round's limit.
    After :meth:`fill`, ``choice[(s, total)]`` is the tuple each table entry took."""

    def __init__(self, model: Any, p: int, chunks: int, table: list, fronts: Any, fastest: np.ndarray):
        self.model, self.p, self.chunks, self.table, self.fronts, self.fastest = model, p, chunks, table, fronts, fastest
        self.most, self.body = most_layers(model, fronts, table), body_time(model, fastest)
        self.memo = TupleMemo()  # shared by the search's rounds
        self.choice: dict = {}
        self._plan: TuplePlan | None = None

    def plan(self, limit: float) -> list[tuple]:
        self._plan = plan_tuples(self.model, self.p, self.chunks, self.table, self.fronts, limit, self.fastest,
                                 tuple_cap(self.most, self.body, limit), self.memo)
        return [(self.fronts, self._plan.problems, self._plan.verdicts)]

    def fill(self, values: list) -> SegmentTable:
        T, self.choice = self._plan.fill(values[0])
        return T


def counts_of(totals: tuple, choice: dict, p: int, chunks: int) -> tuple:
    """Chunk-major counts of a split from its per-stage totals."""
    out = [0] * (p * chunks)
    for s, total in enumerate(totals):
        for c, count in enumerate(choice[(s, total)]):
            out[c * p + s] = count
    return tuple(out)


def interleaved_score(times: np.ndarray, score: str, micro_batches: int, chunks: int) -> np.ndarray:
    """Scores of rows of stage times ``[B, P]`` (``inf`` rows stay ``inf``)."""
    slowest = times.max(axis=1)
    if score == "slowest":
        return slowest
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(slowest), ((chunks * micro_batches - 1) * slowest + times.sum(axis=1)) / chunks,
                        np.inf)


def simulated_rows(model: Any, rows: np.ndarray, chunks: int, bucket: float, backend: Any, in_flight: Any,
                   max_bytes: int | None) -> np.ndarray:
    """Simulated iteration time of each interleaved split (``inf`` where one does not fit):
    the batch solves every stage once, each split's plan gives its chunk times."""
    ranking = model.rank(rows, bucket, backend, in_flight, chunks, max_bytes)
    p = rows.shape[1] // chunks
    out = np.full(len(rows), np.inf)
    ok = np.flatnonzero(np.isfinite(ranking.slowest))
    fwd, bwd = np.empty((len(ok), p, chunks)), np.empty((len(ok), p, chunks))
    for n, i in enumerate(ok.tolist()):
        counts = rows[i].tolist()
        times = chunk_times(model, counts, model.option_names(counts, ranking.choice(i), in_flight, chunks), chunks)
        fwd[n], bwd[n] = times.forward, times.backward
    if len(ok):
        out[ok] = iteration_times(fwd, bwd, model.micro_batches, "interleaved" if chunks > 1 else "1f1b")
    return out


def most_layers(model: Any, fronts: Any, table: list) -> int:
    """An upper bound on the layers one stage can hold: the middle kind's static bytes plus
    its lightest option at the in-flight count of the table where that option is lightest,
    against the device (two more for the first and last layers).  Every count of the table
    is tried: an option's memory need not grow with the count (``excess`` may take more
    away at a larger one), so the least count is not always the lightest."""
    body = model.kinds[len(model.kinds) // 2]
    lightest = min(float(fronts.get(body, k).memories[0]) for k in {int(k) for row in table for k in row})
    cost = float(model.static[body]) + lightest
    room = model.capacity - model.reserved
    if cost <= 0 or not math.isfinite(room):
        return model.layers
    return int(min(model.layers, max(room, 0) // cost + 2))
