"""``best_splits``: the exact top-k contiguous splits of a model, without enumerating them.

1. Segment times (:func:`gpuknap.segments.segment_table`): ``T[s, start,
   end]``, the least time of stage s taking layers ``start:end``, for every
   segment that can be part of a split, classified with array operations and
   solved as one batch (equal problems once, shared pass chains).  A model
   whose stages cannot hold its layers even with their lightest options is
   recognised before any of this (:func:`gpuknap.segments.coverage`).
2. A dynamic program over stages, per score:

   ``slowest``: ``count(tau)``, the number of splits whose stages all take at
   most ``tau`` (capped at k), is a product of 0/1 matrices; a binary search
   over the distinct segment times finds ``tau_k``, the k-th best score.  The
   splits scoring below ``tau_k`` (fewer than k) and the lexicographically
   first splits scoring exactly ``tau_k`` are then walked depth-first with
   "can the rest still be covered" tables, so every step leads to an answer.

   ``1f1b``: ``(M - 1) * slowest + sum of stage times``, exactly, in
   :mod:`gpuknap.search_1f1b`.
3. Plans for the splits found, each distinct stage solved once; with
   ``bound=True`` the same search with weights rounded down and budgets
   rounded up certifies how much the bucketing can have cost.

Ties are broken by the counts in lexicographic order.
"""
from __future__ import annotations

import math
import sys
from fractions import Fraction
from typing import Any

import numpy as np

from .backend import get_backend
from .engine import check_max_bytes
from .limits import MAX_TOP
from .model import PipelineModel
from .options import MEGABYTE, LayerOption, check_bucket, check_int
from .results import PipelineChoice
from .results import Stage
from .schedule import iteration_times
from .search_1f1b import top_1f1b
from .search_interleaved import Found, best_interleaved
from .search_simulated import top_simulated
from .timeline import stage_forward_backward
from .classify import kind_index
from .options import FrontTable
from .ranking import Solved
from .segments import SegmentTable, coverage, fastest_prefix, segment_table  # noqa: F401 (coverage: API)
from .progress import report
from .stage import Planner

SCORES = ("slowest", "1f1b", "simulated")


def exact_score(times: Any, score: str, micro_batches: int) -> Fraction:
    """A split's score, exactly: ``slowest``, or ``(M - 1) * slowest + sum(times)``
    for the 1F1B iteration time.  Splits are ranked by this exact value."""
    slowest = Fraction(max(times))
    if score == "slowest":
        return slowest
    return (micro_batches - 1) * slowest + sum(map(Fraction, times))


def score_of(times: Any, score: str, micro_batches: int) -> float:
    """A split's score as reported: the exact score rounded once to a float."""
    return float(exact_score(times, score, micro_batches))


def _walk_lex(T: SegmentTable, tau: float, need_hit: bool, limit: int) -> list[tuple]:
    """Splits with all times <= tau (and one == tau if ``need_hit``), lexicographic, at most ``limit``."""
    p = T.p
    ok, hit = T.cover(tau)
    out: list[tuple] = []
    counts: list[int] = []

    def walk(s: int, a: int, hit_yet: bool) -> None:
        if len(out) >= limit:
            return
        if s == p:
            out.append(tuple(counts))
            return
        for b in T.end_range(a):
            t = T.at(s, a, b)
            if not t <= tau:
                continue
            now = hit_yet or t == tau or not need_hit
            if not (ok[s + 1, b] if now else hit[s + 1, b]):
                continue
            counts.append(b - a)
            walk(s + 1, b, now)
            counts.pop()
            if len(out) >= limit:
                return

    start_ok = hit[0, 0] if need_hit else ok[0, 0]
    if start_ok:
        walk(0, 0, False)
    return out


def _times_of(T: SegmentTable, counts: tuple) -> list[float]:
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    return [T.at(s, bounds[s], bounds[s + 1]) for s in range(len(counts))]


def _top_slowest(T: SegmentTable, top: int) -> list[tuple]:
    values = T.values()
    if len(values) == 0 or T.count(values[-1], 1) == 0:
        return []
    lo, hi = 0, len(values) - 1
    if T.count(values[-1], top) < top:
        lo = hi  # fewer than k splits in all: take every one
    while lo < hi:
        mid = (lo + hi) // 2
        if T.count(values[mid], top) >= top:
            hi = mid
        else:
            lo = mid + 1
    tau_k = values[lo]
    # Fewer than k splits score below tau_k (none when k is 1: nothing to walk).
    below = _walk_lex(T, values[lo - 1], False, top) if lo > 0 and top > 1 else []
    ranked = sorted(((max(_times_of(T, c)), c) for c in below))
    at_tau = _walk_lex(T, tau_k, True, top - len(ranked))
    return [(c, t) for t, c in ranked] + [(c, float(tau_k)) for c in at_tau]


def _search(T: SegmentTable, top: int, score: str, micro_batches: int, stages: int) -> list[tuple]:
    depth = sys.getrecursionlimit()
    sys.setrecursionlimit(max(depth, stages + 200))  # the walks recurse once per stage
    try:
        return _top_slowest(T, top) if score == "slowest" else top_1f1b(T, top, micro_batches)
    finally:
        sys.setrecursionlimit(depth)


#: Growth of the segment-time limit between rounds of :func:`_pruned_search`.
LIMIT_GROWTH = 1.2
#: Relative margin kept between a certified score and what pruned segments can reach.
MARGIN = 1e-9


def _pruned_search(model: PipelineModel, stages: int, top: int, score: str, fronts: FrontTable, in_flight: Any,
                   make_table: Any, micro_batches: int | None = None) -> list[tuple]:
    """The exact top ``top`` splits, from tables holding only segments whose fastest
    options take at most a limit ``tau``, raised until the answer is certified.

    Every layer takes at least its fastest option's time, so a segment left out
    takes more than ``tau``, and a split using one scores more than ``tau``
    (``slowest``) or more than ``(M - 1) * tau + F`` (``1f1b``, with ``F`` the sum of
    every layer's fastest time, a lower bound on the sum of stage times).  Once
    the k-th split found scores at most that, no split left out can enter the
    top k.  The first ``tau`` is a little over the least the slowest stage can
    take (``F / P``, or the slowest single layer).  When k splits were found but
    not certified, the next limit is the one their k-th score certifies (so a
    second round always ends the search); with fewer than k, the limit grows by
    a fifth.  Most searches end in one round on far fewer segments than the table.
    ``micro_batches``: the ``M`` of the 1f1b score, when not the model's.
    """
    rounds = certified_rounds(model, stages, top, score, fronts, micro_batches)
    limit = next(rounds)
    while True:
        try:
            limit = rounds.send(make_table(limit))
        except StopIteration as done:
            return done.value


def certified_rounds(model: PipelineModel, stages: int, top: int, score: str, fronts: FrontTable,
                     micro_batches: int | None = None):
    """:func:`_pruned_search` as a generator: it yields each round's limit, is sent that
    round's table, and returns the certified top k (so many searches can share
    one solve per round, ``gpuknap.sweep``)."""
    prefix = fastest_prefix(model, fronts, kind_index(model), 1)  # times do not depend on in-flight counts
    total = float(prefix[-1])
    m = model.micro_batches if micro_batches is None else micro_batches
    limit = max(total / stages, float(np.diff(prefix).max(initial=0.0))) * 1.1
    if score == "1f1b" and m == 1:
        limit = math.inf  # the bound (M - 1) * tau + F says nothing: search the whole table
    while True:
        if not math.isfinite(limit) or limit > total * 2:
            limit = math.inf
        T = yield limit
        found = _search(T, top, score, m, stages)
        if not T.pruned:
            return found
        reach = limit if score == "slowest" else (m - 1) * limit + total
        if len(found) < top:
            limit *= LIMIT_GROWTH
            continue
        kth = found[-1][1] * (1 + 1e-6)  # k splits score at most this: the next limit certifies it
        if kth <= reach * (1 - MARGIN) * (1 + 1e-6):
            return found
        limit = max(kth if score == "slowest" else (kth - total) / (m - 1), limit * (1 + 1e-6))


def best_splits(model: PipelineModel, stages: int, top: int = 1, score: str = "slowest",
                bucket: float = MEGABYTE, backend: Any = "auto", in_flight: Any = None,
                max_bytes: int | None = None, bound: bool = False, exclusive: Any = (),
                interleave: int = 1) -> list[tuple]:
    """The exact ``top`` splits of ``model`` into ``stages`` stages, best first.

    Each entry is ``(counts, score, PipelineChoice)``; ties by counts in
    lexicographic order.  An infeasible model gives an empty list.  Scores:
    ``slowest`` (the slowest stage), ``1f1b`` (``(M - 1) * slowest + sum``) and
    ``simulated`` (Megatron's 1F1B schedule simulated with each stage's
    forward and backward times from its plan; :mod:`gpuknap.search_simulated`).

    ``bound=True`` certifies the bucketing: entries are ``(counts, score,
    choice, lower_bound)``, where ``lower_bound`` is the i-th best score of the
    same search with weights rounded down and budgets rounded up.  Every split
    scores no less in that relaxation than with exact bytes, so the i-th best
    split with exact bytes (no bucketing at all) scores at least
    ``lower_bound``: the gap to ``score`` is the most a finer bucket could gain.

    ``exclusive`` lists pairs of option names that may not both appear in one
    stage (MindFormers applies select and comm recompute to the first layers
    of a stage, so it cannot run ``SLCT`` and ``COMM`` layers side by side):
    every stage then takes the better of its choices without each name.

    ``interleave=v`` searches interleaved splits: ``v * stages`` counts in
    chunk-major order (:mod:`gpuknap.search_interleaved`; exact for models whose
    layers between the first and the last are of one kind, else a local search:
    the list returned is a :class:`~gpuknap.search_interleaved.Found` whose
    ``exact`` and ``lower_bound`` say which).  ``1f1b`` is then the interleaved
    closed form ``(M - 1/v) * slowest + sum / v``.
    """
    if not isinstance(model, PipelineModel):
        raise ValueError(f"model must be a PipelineModel, got {type(model).__name__}")
    stages, top = check_int(stages, "stages", 1), check_int(top, "top", 1)
    if stages > model.layers:
        raise ValueError(f"stages={stages} exceeds the model's {model.layers} layers")
    if top > MAX_TOP:
        raise ValueError(f"top={top} is over the limit of {MAX_TOP} splits per search")
    if not isinstance(score, str) or score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if bound and score == "simulated":
        raise ValueError("bound=True certifies the slowest and 1f1b scores; the simulated score has no bound")
    check_bucket(bucket)
    get_backend(backend)
    if max_bytes is not None:
        check_max_bytes(max_bytes)
    interleave = check_int(interleave, "interleave", 1)
    if interleave > 1:
        return _interleaved(model, int(stages), int(top), score, bucket, backend, in_flight, max_bytes, bound,
                            exclusive, interleave)
    model.in_flight_table(int(stages), 1, in_flight)
    variants = _variants(model, exclusive)

    fronts = {(i, relaxed): FrontTable(v.fronts, bucket, relaxed)  # shared by every round and the plans
              for i, v in enumerate(variants) for relaxed in (False, True)}
    known = {key: Solved() for key in fronts}  # problems solved in earlier rounds, per table

    def table(relaxed: bool, limit: float) -> SegmentTable:
        tables = [segment_table(v, int(stages), bucket, backend, in_flight, max_bytes, relaxed, limit,
                                fronts[(i, relaxed)], len(variants) == 1, known[(i, relaxed)])
                  for i, v in enumerate(variants)]
        if len(tables) == 1:
            return tables[0]
        width = max(t.width for t in tables)  # bands of the variants, padded to one width, then the least
        return SegmentTable(np.minimum.reduce([np.pad(t.band, ((0, 0), (0, 0), (0, width - t.width)),
                                                      constant_values=np.inf) for t in tables]),
                            any(t.pruned for t in tables))

    plans = [Planner(v.fronts, bucket, table=fronts[(i, False)]) for i, v in enumerate(variants)]
    # The bounds need each layer's fastest option over every variant: the model's own.
    whole = fronts[(0, False)] if variants[0] is model else FrontTable(model.fronts, bucket)
    if score == "simulated":
        found = _simulated_search(model, int(stages), int(top), whole, in_flight, plans,
                                  lambda lim: table(False, lim))
    else:
        found = _pruned_search(model, int(stages), int(top), score, whole, in_flight,
                               lambda lim: table(False, lim))
    bounds: list[float] = []
    if bound and found:
        bounds = [value for _, value in _pruned_search(model, int(stages), len(found), score, whole,
                                                       in_flight, lambda lim: table(True, lim))]
    out = []
    for i, (counts, value) in enumerate(found):
        choices = [_fastest(plans, stage) for stage in model.stages(list(counts), in_flight)]
        choice = PipelineChoice(tuple(choices), tuple(c.time for c in choices))
        entry = (tuple(int(c) for c in counts), float(value), choice)
        out.append(entry + (float(bounds[i]),) if bound else entry)
        report("plans", i + 1, len(found))
    return out


def _interleaved(model: PipelineModel, stages: int, top: int, score: str, bucket: float, backend: Any,
                 in_flight: Any, max_bytes: int | None, bound: bool, exclusive: Any, chunks: int) -> Found:
    """``best_splits`` for interleaved pipelines, with each split's plan."""
    if bound or not (exclusive is None or exclusive == ()):
        what = "bound=True" if bound else "exclusive options"
        raise ValueError(f"interleave={chunks}: {what} is for plain pipelines only (interleave=1)")
    if stages * chunks > model.layers:
        raise ValueError(f"{stages} stages x {chunks} chunks need at least {stages * chunks} layers, "
                         f"the model has {model.layers}")
    found = best_interleaved(model, stages, chunks, top, score, bucket, backend, in_flight, max_bytes)
    plan = Planner(model.fronts, bucket)
    out = Found()
    out.exact, out.lower_bound = found.exact, found.lower_bound
    for i, (counts, value) in enumerate(found):
        choice = plan(model.stages(list(counts), in_flight, chunks))
        out.append((tuple(int(c) for c in counts), float(value), choice))
        report("plans", i + 1, len(found))
    return out


def _fastest(plans: list[Planner], stage: Any) -> Any:
    """A stage's choice: the fastest among the variants' plans (each solved once)."""
    solved = [c for c in (plan.stage(stage) for plan in plans) if c is not None]
    return min(solved, key=lambda c: c.time)


def _simulated_search(model: PipelineModel, stages: int, top: int, fronts: FrontTable, in_flight: Any,
                      plans: list[Planner], make_table: Any) -> list[tuple]:
    """The exact top ``top`` by simulated 1F1B time (:mod:`gpuknap.search_simulated`).

    The closed-form search's best splits, simulated, give a k-th best ``tau``; a
    split with a stage slower than ``tau / M`` simulates slower than ``tau``
    (stage s alone is busy ``M * t_s``), so the table only needs the segments
    whose fastest options fit ``tau / M``."""
    seeds = _pruned_search(model, stages, max(top, 8), "1f1b", fronts, in_flight, make_table)
    inflight = [row[0] for row in model.in_flight_table(stages, 1, in_flight)]

    def stage_times(s: int, a: int, b: int) -> tuple[float, float]:
        groups = model.segment_groups(a, b, inflight[s])
        return stage_forward_backward(model, a, b, _fastest(plans, Stage(groups, model.budget_of(groups))))

    limit = math.inf
    if len(seeds) >= top:
        fwd, bwd = np.empty((len(seeds), stages, 1)), np.empty((len(seeds), stages, 1))
        for i, (counts, _) in enumerate(seeds):
            bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
            for s in range(stages):
                fwd[i, s, 0], bwd[i, s, 0] = stage_times(s, bounds[s], bounds[s + 1])
        tau = float(np.sort(iteration_times(fwd, bwd, model.micro_batches))[top - 1])
        limit = tau * (1 + MARGIN) / model.micro_batches
    index = kind_index(model)
    slowest = np.array([max(o.forward_time for o in model.fronts[kind]) for kind in index.kinds])
    prefix = np.concatenate(([0.0], np.cumsum(slowest[index.codes])))
    return top_simulated(make_table(limit), top, model.micro_batches, stage_times, prefix)


#: The option of a kind whose every option a variant excludes: more memory than any device.
EXCLUDED = LayerOption("(excluded)", 0.0, 0.0, 0.0, held_once=float(2**70))


def _variants(model: PipelineModel, exclusive: Any) -> list[PipelineModel]:
    """The model once per way to keep every pair of ``exclusive`` option names apart
    (each pair: one model without the first name, one without the second)."""
    if exclusive is None or exclusive == ():
        return [model]
    if isinstance(exclusive, (str, bytes)) or not all(
            isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(n, str) for n in pair)
            for pair in exclusive):
        raise ValueError(f"exclusive must be pairs of option names, got {exclusive!r}")
    fronts_list = [dict(model.fronts)]
    for first, second in exclusive:
        fronts_list = [{kind: [o for o in fronts[kind] if getattr(o, "name", None) != drop] for kind in fronts}
                       for fronts in fronts_list for drop in (first, second)]
    # A kind left without options in a variant still runs elsewhere: give it one option no
    # device can hold, so only the stages holding that kind are infeasible in the variant.
    return [PipelineModel(model.kinds, {kind: opts or [EXCLUDED] for kind, opts in fronts.items()}, model.static,
                          model.capacity, model.micro_batches, model.reserved) for fronts in fronts_list]
