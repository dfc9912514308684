"""The stage problems of an exact interleaved table, built as arrays.

In the exact interleaved case (one kind between the first and the last layer,
:mod:`._interleaved`) stage s holding ``counts[c]`` layers in chunk c poses a
problem that depends on ``(s, counts)`` only.  A stage has up to a million such
tuples, so they are handled as rows of an integer array rather than one by one:

- **layout.** Chunk by chunk, a stage's groups are fixed *slots* ``(kind,
  in-flight, count)`` whose count is the chunk's count, that count less one (the
  middle layers of the chunk that also holds the first or the last layer) or 1
  (the first or the last layer).  Slots of count 0 are left out and runs of one
  (kind, in-flight) merged, exactly as :func:`gpuknap.engine.canonical` does;
  which slots are empty is one of at most four *patterns* per stage.
- **budget.** The static bytes are added slot by slot in chunk order, one float
  addition per non-empty slot as ``model.budget_of`` adds them, so every budget
  is the one :meth:`PipelineModel.stages` gives, bit for bit.
- **verdicts.** :func:`gpuknap.engine.verdict` as array code: the all-fastest
  bytes summed exactly (whole multiples of a common power of two in integers,
  else :func:`gpuknap.engine.kept_bytes` row by row), the all-fastest time as the
  same left-to-right additions, the knapsack capacity by the engine's own
  functions on each budget.

Only the problems that need a knapsack become :class:`gpuknap.engine.StageProblem`
objects; the rest are answered here.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..engine import FASTEST, INFEASIBLE, KNAPSACK, StageProblem, Verdict, buckets_down, buckets_up, kept_bytes

#: Exact integer sums of scaled bytes stay below this.
_EXACT = 2**62


@functools.lru_cache(maxsize=64)
def tuples(chunks: int, top: int) -> np.ndarray:
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


def stage_slots(model: Any, s: int, p: int, chunks: int, table: list) -> list[tuple]:
    """Stage s's slots in order: ``(kind, in_flight, chunk, less)``, the slot's count being
    ``counts[chunk] - less``, or 1 where ``chunk`` is None (the first or the last layer)."""
    n, last = model.layers, chunks * p - 1
    head, tail = model.kinds[0], model.kinds[-1]
    body = model.kinds[1] if n > 2 else head
    out = []
    for c in range(chunks):
        i, k = c * p + s, int(table[s][c])
        if i == 0:  # layers 0 .. count-1: the first layer, then middle ones
            out += [(head, k, c, 0)] if head == body else [(head, k, None, 0), (body, k, c, 1)]
        elif i == last:  # the last `count` layers: middle ones, then the last layer
            out += [(tail, k, c, 0)] if tail == body else [(body, k, c, 1), (tail, k, None, 0)]
        else:
            out.append((body, k, c, 0))
    return out


class StageRows:
    """The problems of stage s for ``rows`` (tuples of per-chunk counts) as arrays:
    per row its ``budget``, its ``pattern`` of non-empty slots, and per pattern the
    merged run keys and the run counts of its rows."""

    def __init__(self, model: Any, s: int, p: int, chunks: int, table: list, rows: np.ndarray):
        slots = stage_slots(model, s, p, chunks, table)
        ones = np.ones(len(rows), dtype=np.int64)
        counts = [ones if c is None else rows[:, c] - less for _, _, c, less in slots]
        static = np.zeros(len(rows))
        for (kind, _, _, _), k in zip(slots, counts):
            static = np.where(k > 0, static + k * float(model.static[kind]), static)
        self.budget = float(model.capacity - model.reserved) - static
        varying = [j for j, (_, _, c, less) in enumerate(slots) if less]
        code = np.zeros(len(rows), dtype=np.int64)
        for bit, j in enumerate(varying):
            code |= (counts[j] > 0).astype(np.int64) << bit
        self.pattern = code
        self.runs: dict[int, tuple] = {}  # pattern -> (run keys, [its rows, runs] counts, its rows, merged)
        for value in np.unique(code).tolist():
            keep = [j for j in range(len(slots)) if j not in varying or value >> varying.index(j) & 1]
            keys: list = []
            members: list = []
            for j in keep:
                key = slots[j][:2]
                if keys and keys[-1] == key:
                    members[-1].append(j)
                else:
                    keys.append(key)
                    members.append([j])
            where = code == value
            matrix = np.stack([sum(counts[j][where] for j in group) for group in members], axis=1)
            self.runs[value] = (tuple(keys), matrix, np.flatnonzero(where), len(members) < len(keep))

    def problems(self, which: np.ndarray) -> tuple[list[StageProblem], np.ndarray]:
        """The distinct canonical problems of rows ``which`` (indices into ``rows``), and
        for each of those rows the place of its problem among them (rows whose runs merge
        pose one problem)."""
        out: list = []
        place = np.full(len(self.budget), -1, dtype=np.int64)
        place[which] = np.arange(len(which))
        into = np.zeros(len(which), dtype=np.int64)
        for keys, matrix, where, merged in self.runs.values():
            at = place[where]
            mine = np.flatnonzero(at >= 0)
            if not len(mine):
                continue
            counts, budget = matrix[mine], self.budget[where[mine]]
            first, back = _distinct(counts, budget) if merged else (np.arange(len(mine)), np.arange(len(mine)))
            into[at[mine]] = len(out) + back
            out += _made(keys, counts[first], budget[first])
        return out, into

    def verdicts(self, fronts: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row, how its problem is answered (:func:`gpuknap.engine.verdict`):
        ``INFEASIBLE``, ``FASTEST`` with its time, or ``KNAPSACK`` with its capacity."""
        kind = np.full(len(self.budget), INFEASIBLE, dtype=np.int8)
        time = np.full(len(self.budget), np.inf)
        capacity = np.full(len(self.budget), -1, dtype=np.int64)
        for keys, matrix, where, _ in self.runs.values():
            front = [fronts.get(kk, k) for kk, k in keys]
            budget = self.budget[where]
            fits = _fastest_bytes(matrix, [f.memories[-1] for f in front]) <= budget
            fast = np.flatnonzero(fits & (budget >= 0))
            kind[where[fast]] = FASTEST
            time[where[fast]] = _sequential(matrix[fast], [float(f.times[-1]) for f in front])
            rest = np.flatnonzero(~fits & (budget >= 0))
            room = _buckets(budget[rest], fronts)
            lightest = matrix[rest] @ np.array([int(f.weights[0]) for f in front], dtype=np.int64)
            solve = lightest <= room
            kind[where[rest[solve]]] = KNAPSACK
            capacity[where[rest[solve]]] = room[solve]
        return kind, time, capacity


def _made(keys: tuple, counts: np.ndarray, budget: np.ndarray) -> list[StageProblem]:
    """``StageProblem(tuple(zip(keys, row)), budget)`` of every row, column by column: each
    ``(key, count)`` run made once and shared (half the time of zipping row by row)."""
    if not len(counts):
        return []
    runs = [[(key, n) for n in range(int(counts[:, r].max()) + 1)] for r, key in enumerate(keys)]
    rows = zip(*[map(made.__getitem__, counts[:, r].tolist()) for r, made in enumerate(runs)])
    return list(map(StageProblem, map(tuple, rows), budget.tolist()))


def _distinct(counts: np.ndarray, budget: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of equal counts and budget (bit for bit) as one: the first row of each
    distinct one, and each row's place among them."""
    keys = [budget.view(np.int64)] + [counts[:, j] for j in range(counts.shape[1] - 1, -1, -1)]
    order = np.lexsort(keys)
    change = np.zeros(len(order), dtype=bool)
    change[:1] = True
    for key in keys:
        change[1:] |= key[order][1:] != key[order][:-1]
    group = np.cumsum(change) - 1
    back = np.empty(len(order), dtype=np.int64)
    back[order] = group
    return order[change], back


def _fastest_bytes(matrix: np.ndarray, memories: list) -> np.ndarray:
    """``kept_bytes`` of every row (``sum(count * memory)``, exact, rounded once)."""
    ratios = [float(m).as_integer_ratio() if math.isfinite(m) else None for m in memories]
    if None not in ratios and len(matrix):
        den = max(q for _, q in ratios)
        nums = [p * (den // q) for p, q in ratios]
        most = int(matrix.max(axis=0).astype(object) @ np.array([abs(x) for x in nums], dtype=object))
        if most < _EXACT:
            total = matrix @ np.array(nums, dtype=np.int64)  # exact integers
            return total.astype(np.float64) / den  # rounded once; den is a power of two
    return np.array([kept_bytes(zip(row, memories)) for row in matrix.tolist()], dtype=np.float64)


def _sequential(matrix: np.ndarray, times: list) -> np.ndarray:
    """``times[r]`` added ``matrix[i, r]`` times, run after run, left to right, per row."""
    total = np.zeros(len(matrix))
    for r, t in enumerate(times):
        n = matrix[:, r]
        order = np.argsort(-n, kind="stable")
        part = total[order]
        ends = n[order]
        for step in range(int(ends[0]) if len(ends) else 0):  # rows with more than `step` layers left
            m = int(np.searchsorted(-ends, -step, side="left"))
            part[:m] += t
        total[order] = part
    return total


def _buckets(budget: np.ndarray, fronts: Any) -> np.ndarray:
    """``buckets_down`` (``buckets_up`` for relaxed fronts) of every budget: the same float
    floor division, as array code (NumPy's float ``//`` is Python's)."""
    q = -np.floor_divide(-budget, fronts.bucket) if fronts.relaxed else np.floor_divide(budget, fronts.bucket)
    if len(q) and not (np.isfinite(q).all() and q.max() < _EXACT):  # the engine's error, or Python ints
        to_buckets = buckets_up if fronts.relaxed else buckets_down
        return np.array([to_buckets(b, fronts.bucket) for b in budget.tolist()], dtype=np.int64)
    return q.astype(np.int64)


class TupleMemo:
    """What the rounds of one interleaved search share.  Per stage, every tuple answered
    so far, found by a code that does not depend on the round (its counts as digits in
    base ``layers + 1``, the first the most significant), with its all-fastest time
    (``inf`` unless the all-fastest choice fits) and the place of its knapsack problem
    (``-1``: none); the knapsack problems with their verdicts, each made once."""

    def __init__(self) -> None:
        self.stages: dict = {}  # s -> (codes in order, time, place)
        self.problems: list = []
        self.verdicts: list = []
        self._index: dict = {}  # problem -> its place in problems
        self._verdicts: dict = {}  # capacity -> its knapsack verdict

    def answer(self, model: Any, s: int, p: int, chunks: int, table: list, fronts: Any,
               rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row (a tuple of stage s): its all-fastest time and its problem's place."""
        base = model.layers + 1
        if base ** chunks >= _EXACT:  # codes would overflow: answer without remembering
            return self._new(model, s, p, chunks, table, fronts, rows)
        # the first count the most significant digit: rows in lexicographic order (as every
        # caller passes them) have increasing codes, which searchsorted finds fastest
        code = rows @ (base ** np.arange(chunks - 1, -1, -1, dtype=np.int64))
        codes, time, place = self.stages.get(s, (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, np.int64)))
        at = np.searchsorted(codes, code)
        seen = np.zeros(len(code), dtype=bool) if not len(codes) else codes[np.minimum(at, len(codes) - 1)] == code
        fresh = np.flatnonzero(~seen)
        if len(fresh):
            t, q = self._new(model, s, p, chunks, table, fronts, rows[fresh])
            codes, time, place = (np.concatenate(pair) for pair in ((codes, code[fresh]), (time, t), (place, q)))
            order = np.argsort(codes, kind="stable")
            codes, time, place = codes[order], time[order], place[order]
            self.stages[s] = (codes, time, place)
            at = np.searchsorted(codes, code)
        return time[at], place[at]

    def _new(self, model: Any, s: int, p: int, chunks: int, table: list, fronts: Any,
             rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        stage = StageRows(model, s, p, chunks, table, rows)
        kind, time, capacity = stage.verdicts(fronts)
        knap = np.flatnonzero(kind == KNAPSACK)
        made, into = stage.problems(knap)
        places = []
        index, problems, verdicts, shared = self._index, self.problems, self.verdicts, self._verdicts
        for q, room in zip(made, capacity[knap[np.unique(into, return_index=True)[1]]].tolist()):
            n = len(problems)
            at = index.setdefault(q, n)  # one hash a problem, new or not
            if at == n:
                problems.append(q)
                how = shared.get(room)  # verdicts are immutable: one per capacity
                if how is None:
                    how = shared[room] = Verdict(KNAPSACK, capacity=room)
                verdicts.append(how)
            places.append(at)
        place = np.full(len(rows), -1, dtype=np.int64)
        place[knap] = np.array(places, dtype=np.int64)[into] if places else place[knap]
        return time, place
