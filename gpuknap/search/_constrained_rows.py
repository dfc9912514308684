"""Framework-constrained interleaved searches: ``constrained_splits(..., interleave=v)``.

**Exact** for Megatron (one pattern for every stage) on models that are one
kind between their first and last layer (HEAD, N x BODY, TAIL): a chunk's time
and bytes then depend only on its layer count, its in-flight count and whether
it holds the first or the last layer, so for every pattern each stage's chunk
tuples are enumerated, each stage keeps its fastest fitting tuple per layer
total (ties: the most even, then the first), and the score's exact top k runs
on the per-stage totals, as the unconstrained exact interleaved search does
(:mod:`._interleaved`; ``1f1b`` ranked as ``(vM - 1) * slowest + sum``).

**Otherwise a local search**, not proven optimal (``exact`` False, with a
lower bound): :func:`._local.local_search` from the most even split and
from the best constrained plain split into ``v * P`` stages, every split
scored exactly under the rule: the best of Megatron's patterns; for
MindFormers, each stage's best combination of per-chunk settings (its
patterns' combinations, or, for one decoder kind, the engine's knapsack with
select and comm kept apart in each chunk).  ``simulated`` scores the splits by
Megatron's interleaved schedule itself.
"""
from __future__ import annotations

import math
from itertools import product
from typing import Any

import numpy as np

from ..engine import MEGABYTE, Layers, Planner, Stage, WorkTooLarge
from ..schedule import unbounded_iteration_times
from ._classify import kind_counts
from ._patterns import (GROUPED, Layout, Pattern, Rule, _score, decoder_kinds, framework_rule, in_order, run_names,
                        with_grouped)
from ._interleaved import counts_of, one_body_kind
from ._tupleplan import tuples
from ._local import even_split, local_search
from ._rounds import Found
from ._segments import SegmentTable


def interleaved_constrained(model: Any, rule: Rule, p: int, v: int, top: int, score: str, bucket: float,
                            backend: Any, in_flight: Any, max_bytes: int | None, plain_constrained: Any,
                            starts: Any = ()) -> Found:
    """``constrained_splits`` for ``v`` chunks per stage (see the module docstring); ``plain_constrained``:
    the plain search, for a start."""
    model = with_grouped(model) if any(GROUPED in pat.names() for pat in rule.patterns) else model
    table = model.in_flight_table(p, v, in_flight)
    lay = Layout(model, p * v, [k for row in table for k in row])
    if not rule.per_stage and one_body_kind(model) and score != "simulated":
        return _exact(model, rule, lay, p, v, table, top, score)
    rows = Rows(model, rule, lay, p, v, table, in_flight, bucket, score)
    starts = [tuple(int(c) for c in start) for start in starts if len(start) == p * v
              and sum(start) == model.layers and min(start) >= 1] + [even_split(model.layers, p * v)]
    try:
        plain = plain_constrained(model, rule, p * v, 1, "slowest", bucket, backend, None, max_bytes)
        starts = starts + [plain[0][0]] if plain else starts
    except WorkTooLarge:  # over the work limit at this bucket: said, not dropped
        raise
    except ValueError:  # a plain search may refuse (size): the even start remains
        pass
    out = Found()
    for counts, value in local_search(top, starts, rows.scores)[:top]:
        names, patterns = rows.plan(np.array([counts]))
        out.append((tuple(counts), float(value), run_names(model, counts, names, in_flight, v)[3], names, patterns))
    out.exact = False
    fastest = [min(o.forward_time + o.backward_time for o in model.fronts[k]) for k in model.kinds]
    least = max(sum(fastest) / p, max(fastest))
    m = model.micro_batches
    out.lower_bound = (least if score == "slowest" else m * least if score == "simulated"
                       else ((v * m - 1) * least + sum(fastest)) / v)
    return out


def _exact(model: Any, rule: Rule, lay: Layout, p: int, v: int, table: list, top: int, score: str) -> Found:
    """Megatron on a HEAD, N x BODY, TAIL model: per pattern, each stage's best chunk tuple per total."""
    n, last = model.layers, p * v - 1
    width = n - v * (p - 1)
    every = tuples(v, width)
    totals = every.sum(axis=1)
    spread = every.max(axis=1) - every.min(axis=1)
    budgets = [np.array([_budget(model, s, p, v, row, table) for row in every.tolist()]) for s in range(p)]
    first = [[np.where(every[:, c] > 0, 0 if c * p + s == 0 else n - every[:, c] if c * p + s == last else 1, 0)
              for c in range(v)] for s in range(p)]
    rank = _score("slowest" if score == "slowest" else "1f1b", _Scaled(model, v), None)
    found = []
    for index, pattern in enumerate(rule.patterns):
        times, mem = lay.segments(pattern)
        best = np.full((p, width), np.inf)
        choice: dict = {}
        for s in range(p):
            t, m = np.zeros(len(every)), np.zeros(len(every))
            for c in range(v):
                t = t + times[first[s][c], every[:, c] - 1]
                m = m + mem[lay.ks.index(table[s][c]), first[s][c], every[:, c] - 1]
            order = np.lexsort((np.arange(len(every)), spread, t))
            order = order[((m <= budgets[s]) & np.isfinite(t))[order]]
            _, at = np.unique(totals[order], return_index=True)  # per total: fastest, most even, first
            for j in order[at].tolist():
                best[s, totals[j] - 1] = t[j]
                choice[(s, int(totals[j]))] = tuple(every[j].tolist())
        band = np.broadcast_to(best[:, None, :], (p, n + 1, width)).copy()
        for per_stage, value in rank.top(SegmentTable(band), top):
            counts = counts_of(per_stage, choice, p, v)
            found.append((value / v if score == "1f1b" else value, counts, index, pattern))
    found.sort(key=lambda f: (f[0], f[1], f[2]))
    out, seen = Found(), set()
    for value, counts, _, pattern in found:  # a split that two settings run alike is one plan
        names = lay.names(counts, [pattern] * (p * v))
        if len(out) < top and (tuple(counts), tuple(names)) not in seen:
            seen.add((tuple(counts), tuple(names)))
            choice = run_names(model, counts, names, table, v)[3]
            out.append((tuple(counts), float(value), choice, names, [pattern] * (p * v)))
    out.lower_bound = out[0][1] if out else math.nan
    return out


class _Scaled:
    """A model whose ``micro_batches`` is ``v * M`` (the interleaved closed form's ranking)."""

    def __init__(self, model: Any, v: int):
        self.micro_batches = v * model.micro_batches


def _budget(model: Any, s: int, p: int, v: int, row: list, table: list) -> float:
    """Stage s's budget holding ``row[c]`` layers in chunk c (the first layer in chunk 0 of stage 0,
    the last in the last chunk of the last stage), as ``model.stages`` sums it."""
    n, last = model.layers, p * v - 1
    groups = []
    for c, count in enumerate(row):
        i = c * p + s
        a = 0 if i == 0 else n - count if i == last else 1
        groups += [Layers(kind, k, table[s][c]) for kind, k in kind_counts(model.kinds[a:a + count])]
    return model._budget(groups)


class Rows:
    """Exact scores of interleaved splits ``[B, v * P]`` under a rule, and the plan of one."""

    def __init__(self, model: Any, rule: Rule, lay: Layout, p: int, v: int, table: list, in_flight: Any,
                 bucket: float, score: str):
        self.model, self.rule, self.lay, self.p, self.v, self.table = model, rule, lay, p, v, table
        self.in_flight, self.score = in_flight, score
        self.kidx = np.array([[lay.ks.index(k) for k in row] for row in table])
        self.budgets: dict = {}
        if rule.engine is not None:
            usable, exclusive = rule.engine
            self.variants = [name for pair in exclusive for name in pair] or [None]
            fronts = dict(model.fronts)
            for kind, c, drop in product(decoder_kinds(model), range(v), self.variants):  # chunk c's layers
                fronts[(kind, c, drop)] = [o for o in model.fronts[kind]
                                           if getattr(o, "name", None) in usable and getattr(o, "name", None) != drop]
            self.planner = Planner(fronts, bucket)

    def budget(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), self.p))
        for r, row in enumerate(map(tuple, rows.tolist())):
            if row not in self.budgets:
                self.budgets[row] = [st.budget for st in self.model.stages(list(row), self.in_flight, self.v)]
            out[r] = self.budgets[row]
        return out

    def segments(self, rows: np.ndarray, pattern: Pattern) -> tuple:
        """Per row: each segment's time, bytes and each (stage, chunk)'s forward and backward time."""
        lay, n, B = self.lay, self.model.layers, len(rows)
        bounds = np.concatenate((np.zeros((B, 1), dtype=np.int64), np.cumsum(rows, axis=1)), axis=1)
        marks = np.zeros((B, n + 1), dtype=np.int64)
        np.add.at(marks, (np.repeat(np.arange(B), rows.shape[1] - 1), bounds[:, 1:-1].ravel()), 1)
        seg = np.cumsum(marks[:, :n], axis=1)
        j = np.arange(n)[None, :]
        pos = lay.D[j] - lay.D[np.take_along_axis(bounds, seg, axis=1)]
        h, c = len(pattern.head), len(pattern.cycle)
        slot = np.where(pos < h, pos, h + (pos - h) % c)
        f, b, m = lay.values(pattern)
        stage, chunk = seg % self.p, seg // self.p
        idx = np.repeat(np.arange(B), n)
        time, mem = np.zeros((B, rows.shape[1])), np.zeros((B, rows.shape[1]))
        fwd, bwd = np.zeros((B, self.p, self.v)), np.zeros((B, self.p, self.v))
        np.add.at(time, (idx, seg.ravel()), (f[j, slot] + b[j, slot]).ravel())
        np.add.at(mem, (idx, seg.ravel()), m[self.kidx[stage, chunk], j, slot].ravel())
        np.add.at(fwd, (idx, stage.ravel(), chunk.ravel()), f[j, slot].ravel())
        np.add.at(bwd, (idx, stage.ravel(), chunk.ravel()), b[j, slot].ravel())
        return time, mem, fwd, bwd

    def _rank(self, times: np.ndarray, fwd: np.ndarray, bwd: np.ndarray) -> np.ndarray:
        slowest = times.max(axis=1)
        ok = np.isfinite(slowest)
        if self.score == "slowest":
            return slowest
        if self.score == "1f1b":
            with np.errstate(invalid="ignore"):
                return np.where(ok, ((self.v * self.model.micro_batches - 1) * slowest + times.sum(axis=1)) / self.v,
                                np.inf)
        out = np.full(len(times), np.inf)
        if ok.any():
            out[ok] = unbounded_iteration_times(fwd[ok], bwd[ok], self.model.micro_batches,
                                                "interleaved" if self.v > 1 else "1f1b")
        return out

    def evaluate(self, rows: np.ndarray) -> tuple[np.ndarray, list]:
        """Scores of ``rows`` and, per row, its per-segment patterns (or engine choices)."""
        budget = self.budget(rows)
        p, v = self.p, self.v
        if self.rule.engine is not None:
            return self._engine(rows, budget)
        per = [self.segments(rows, pat) for pat in self.rule.patterns]
        if not self.rule.per_stage:  # one pattern for every stage: the best of them per row
            best, which = np.full(len(rows), np.inf), [None] * len(rows)
            for pattern, (time, mem, fwd, bwd) in zip(self.rule.patterns, per):
                stage_t = sum(time[:, c * p:(c + 1) * p] for c in range(v))
                stage_m = sum(mem[:, c * p:(c + 1) * p] for c in range(v))
                scores = self._rank(np.where(stage_m <= budget, stage_t, np.inf), fwd, bwd)
                for r in np.flatnonzero(scores < best).tolist():
                    best[r], which[r] = scores[r], [pattern] * (p * v)
            return best, which
        edges = np.concatenate((np.zeros((len(rows), 1), dtype=np.int64), np.cumsum(rows, axis=1)), axis=1)
        most = int(np.diff(self.lay.D[edges], axis=1).max())  # decoder layers of the fullest segment
        useful = [i for i, pat in enumerate(self.rule.patterns) if len(pat.head) <= most]
        times, fwd, bwd = np.full((len(rows), p), np.inf), np.zeros((len(rows), p, v)), np.zeros((len(rows), p, v))
        chosen = np.zeros((len(rows), p, v), dtype=np.int64)
        for s in range(p):  # each stage: the fastest combination of per-chunk settings that fits
            for combo in product(useful, repeat=v):
                t = sum(per[b][0][:, c * p + s] for c, b in enumerate(combo))
                m = sum(per[b][1][:, c * p + s] for c, b in enumerate(combo))
                better = (m <= budget[:, s]) & (t < times[:, s])
                times[better, s] = t[better]
                for c, b in enumerate(combo):
                    chosen[better, s, c] = b
                    fwd[better, s, c], bwd[better, s, c] = per[b][2][better, s, c], per[b][3][better, s, c]
        which = [[self.rule.patterns[chosen[r, i % p, i // p]] for i in range(p * v)] for r in range(len(rows))]
        return self._rank(times, fwd, bwd), which

    def _engine(self, rows: np.ndarray, budget: np.ndarray) -> tuple[np.ndarray, list]:
        """One decoder kind under a per-stage rule: each stage's knapsack, select and comm apart per chunk."""
        p, v, model = self.p, self.v, self.model
        dec = set(decoder_kinds(model))
        times, fwd, bwd = np.full((len(rows), p), np.inf), np.zeros((len(rows), p, v)), np.zeros((len(rows), p, v))
        which: list = []
        for r, row in enumerate(rows.tolist()):
            bounds = np.concatenate(([0], np.cumsum(row))).tolist()
            picks = []
            for s in range(p):
                best = None
                for combo in product(self.variants, repeat=v):
                    groups = [Layers((kind, c, combo[c]) if kind in dec else kind, k, self.table[s][c])
                              for c in range(v)
                              for kind, k in kind_counts(model.kinds[bounds[c * p + s]:bounds[c * p + s + 1]])]
                    choice = self.planner.stage(Stage(tuple(groups), float(budget[r, s])))
                    if choice is not None and (best is None or choice.time < best.time):
                        best = choice
                picks.append(best)
                if best is not None:
                    times[r, s] = best.time
                    for a in best.assignments:
                        kind = a.layers.kind  # a decoder pseudo-kind names its chunk; the first layer is chunk 0's
                        c = kind[1] if isinstance(kind, tuple) else 0 if kind == model.kinds[0] and s == 0 else v - 1
                        fwd[r, s, c] += a.count * a.option.forward_time
                        bwd[r, s, c] += a.count * a.option.backward_time
            which.append(picks)
        return self._rank(times, fwd, bwd), which

    def scores(self, rows: np.ndarray) -> np.ndarray:
        return self.evaluate(np.asarray(rows, dtype=np.int64))[0]

    def plan(self, rows: np.ndarray) -> tuple[list, list]:
        """``(names, patterns)`` of one split (``patterns`` None per segment on the engine path)."""
        counts = rows[0].tolist()
        _, which = self.evaluate(rows)
        if self.rule.engine is None:
            return self.lay.names(counts, which[0]), which[0]
        return self._engine_names(counts, which[0]), [None] * len(counts)

    def _engine_names(self, counts: list, picks: list) -> list:
        p, v, model = self.p, self.v, self.model
        queues: dict = {}
        for s, choice in enumerate(picks):
            for a in choice.assignments:
                kind = a.layers.kind
                key = (s, kind[0], kind[1]) if isinstance(kind, tuple) else (s, kind)
                queues.setdefault(key, []).extend([a.option.name] * a.count)
        names, bounds = [], np.concatenate(([0], np.cumsum(counts))).tolist()
        dec = set(decoder_kinds(model))
        for i in range(p * v):
            s, c = i % p, i // p
            for kind in model.kinds[bounds[i]:bounds[i + 1]]:
                names.append(queues[(s, kind, c) if kind in dec else (s, kind)].pop(0))
        return in_order(model, counts, names, self.rule.levels)


def best_on_split(model: Any, counts: Any, framework: str, chunks: int = 1, in_flight: Any = None,
                  bucket: float = MEGABYTE) -> list | None:
    """Every layer's option under the fastest settings ``framework`` can express on this split (the
    best single setting for Megatron, each stage's best for MindFormers), or None when a stage
    fits none."""
    counts = model.check_counts(list(counts), chunks)
    p = len(counts) // chunks
    dec = set(decoder_kinds(model))
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    longest = max(sum(k in dec for k in model.kinds[a:b]) for a, b in zip(bounds, bounds[1:]))
    rule = framework_rule(model, framework, max(longest, 1))
    model = with_grouped(model) if any(GROUPED in pat.names() for pat in rule.patterns) else model
    table = model.in_flight_table(p, chunks, in_flight)
    lay = Layout(model, model.layers, [k for row in table for k in row])  # no tables: one-layer width
    rows = Rows(model, rule, lay, p, chunks, table, in_flight, bucket, "slowest")
    row = np.array([counts], dtype=np.int64)
    if not np.isfinite(rows.scores(row)[0]):
        return None
    return rows.plan(row)[0]
