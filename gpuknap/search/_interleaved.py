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

import math
from typing import Any

import numpy as np

from ..schedule import chunk_times, unbounded_iteration_times
from ._segments import SegmentTable
from ._tupleplan import TupleMemo, tuples

#: Most per-stage chunk tuples one table may hold.
MAX_TUPLES = 2_000_000


def one_body_kind(model: Any) -> bool:
    """True when every layer but the first and the last is of one kind (the exact case)."""
    return len(set(model.kinds[1:-1])) <= 1


class TuplePlan:
    """The stage problems of an exact interleaved table before any is solved (like
    :class:`._segments.SegmentPlan`): one *key* per (stage, tuple) that fits the round's
    limit, as arrays (``stage``, ``row`` into ``every``, ``total``), each answered
    already (``time``: all-fastest or ``inf``) or by one of ``problems`` (the distinct
    knapsacks, with their ``verdicts``); :meth:`fill` gives the table and the best
    tuple of each ``(stage, total)``."""

    def __init__(self, p: int, n: int, width: int, every: np.ndarray, stage: np.ndarray, row: np.ndarray,
                 time: np.ndarray, made: np.ndarray, memo: "TupleMemo", pruned: bool):
        self.p, self.n, self.width, self.every, self.pruned = p, n, width, every, pruned
        self.stage, self.row, self.time = stage, row, time
        self.total = every.sum(axis=1)[row]
        self._asked = np.flatnonzero(made >= 0)
        ids, self._at = np.unique(made[self._asked], return_inverse=True)
        self.problems = [memo.problems[i] for i in ids.tolist()]
        self.verdicts = [memo.verdicts[i] for i in ids.tolist()]

    @property
    def keys(self) -> list[tuple]:
        """``(stage, total, counts)`` of every key, stage by stage, tuples in lexicographic order."""
        return [(s, t, tuple(c)) for s, t, c in zip(self.stage.tolist(), self.total.tolist(),
                                                     self.every[self.row].tolist())]

    def key_times(self, values: Any) -> np.ndarray:
        """Every key's least time, given the times of ``problems``."""
        out = self.time.copy()
        if len(self._asked):
            out[self._asked] = np.asarray(values, dtype=np.float64)[self._at]
        return out

    def fill(self, values: np.ndarray) -> tuple[SegmentTable, dict]:
        best = np.full((self.p, self.width), np.inf)
        choice: dict = {}
        times = self.key_times(values)
        ok = np.flatnonzero(np.isfinite(times))
        if len(ok):
            counts = self.every[self.row[ok]]
            spread = counts.max(axis=1) - counts.min(axis=1)
            # per (stage, total): the fastest, then the most even, then the lexicographically first
            order = ok[np.lexsort((self.row[ok], spread, times[ok], self.total[ok], self.stage[ok]))]
            s, total = self.stage[order], self.total[order]
            first = np.ones(len(order), dtype=bool)
            first[1:] = (s[1:] != s[:-1]) | (total[1:] != total[:-1])
            win = order[first]
            best[self.stage[win], self.total[win] - 1] = times[win]
            for st, tot, c in zip(self.stage[win].tolist(), self.total[win].tolist(),
                                  self.every[self.row[win]].tolist()):
                choice[(st, tot)] = tuple(c)
        band = np.broadcast_to(best[:, None, :], (self.p, self.n + 1, self.width)).copy()
        return SegmentTable(band, self.pruned), choice


def plan_tuples(model: Any, p: int, chunks: int, table: list, fronts: Any, limit: float, fastest: np.ndarray,
                most: int, memo: TupleMemo | None = None) -> TuplePlan:
    """Every stage's chunk tuples (each chunk at least one layer, at most ``most`` layers
    in all) whose layers' fastest options fit ``limit``, with their stage problems
    (:mod:`._tupleplan`).  ``memo``: problems of earlier calls of the same search (its rounds)."""
    n, last = model.layers, chunks * p - 1
    if not one_body_kind(model):
        raise ValueError("exact interleaved tables need one kind between the first and the last layer")
    top = max(min(most, n - chunks * (p - 1)), chunks)
    pruned = False
    memo = TupleMemo() if memo is None else memo
    if math.comb(top, chunks) > MAX_TUPLES:  # the tuples of counts >= 1 summing to at most top
        raise ValueError(f"an interleaved search of {p} stages x {chunks} chunks over {n} layers would weigh "
                         f"{math.comb(top, chunks):,} chunk arrangements per stage (over {MAX_TUPLES:,}); "
                         "use fewer chunks or more stages")
    every = tuples(chunks, top)  # [K, chunks], lexicographic
    slack = limit + 1e-9 * (abs(limit) + fastest[-1])
    stages, rows, times, made, kept = [], [], [], [], 0
    for s in range(p):
        low = np.zeros(len(every))
        for c in range(chunks):  # the layers' fastest times, added chunk by chunk as floats
            i = c * p + s
            count = every[:, c]
            a = 0 if i == 0 else n - count if i == last else 1
            low += fastest[a + count] - fastest[a]
        fits = low <= slack
        pruned = pruned or not bool(fits.all())
        mine = np.flatnonzero(fits)
        kept += len(mine)
        if kept > MAX_TUPLES:
            raise ValueError(f"an interleaved search of {p} stages x {chunks} chunks over {n} layers needs over "
                             f"{MAX_TUPLES:,} stage arrangements; use fewer chunks or more stages")
        time, ids = memo.answer(model, s, p, chunks, table, fronts, every[mine])
        stages.append(np.full(len(mine), s, dtype=np.int64))
        rows.append(mine)
        times.append(time)
        made.append(ids)
    return TuplePlan(p, n, max(top, 1), every, np.concatenate(stages), np.concatenate(rows),
                     np.concatenate(times), np.concatenate(made), memo, pruned)


def body_time(model: Any, fastest: np.ndarray) -> float:
    """The fastest time of a middle layer (0 for models of two layers or fewer)."""
    return float(np.diff(fastest)[len(model.kinds) // 2]) if model.layers > 2 else 0.0


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


def even_counts(model: Any, parts: int) -> list[int]:
    """Megatron's split of a model into ``parts`` (virtual) stages: the decoder layers as even as
    they go (the remainder on the last ones), the embedding with the first and the output layer
    with the last (a ``ValueError`` when there are fewer decoder layers than parts)."""
    head = 1 if model.kinds[0] == "embedding" else 0
    tail = 1 if model.kinds[-1] == "output" else 0
    decoders = model.layers - head - tail
    if decoders < parts:
        raise ValueError(f"stages: {parts} stages (x chunks) for {decoders} decoder layers")
    base, extra = divmod(decoders, parts)
    counts = [base + (1 if i >= parts - extra else 0) for i in range(parts)]
    counts[0] += head
    counts[-1] += tail
    return counts


def even_candidate(model: Any, stages: int, chunks: int, found: Any = ()) -> list[int] | None:
    """Megatron's even split (:func:`even_counts`) of an interleaved configuration as a candidate
    beside a search's results: None with one chunk, fewer decoder layers than virtual stages, or
    when it is already among ``found`` (rows of counts)."""
    if chunks == 1 or stages * chunks > model.layers:
        return None
    try:
        counts = even_counts(model, stages * chunks)
    except ValueError:  # fewer decoder layers than virtual stages
        return None
    return None if any(list(c) == counts for c in found) else counts


#: How much faster (relative) the even split must run to replace a search's best: runs equal but
#: for rounding (sums of the same times in another order) are a tie, which the search's split keeps.
EVEN_MARGIN = 1e-9


def even_is_faster(even: float, best: float) -> bool:
    """Whether the even split's time ``even`` beats the search's ``best`` by more than rounding."""
    return even < best - EVEN_MARGIN * abs(best)


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
        out[ok] = unbounded_iteration_times(fwd, bwd, model.micro_batches, "interleaved" if chunks > 1 else "1f1b")
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
