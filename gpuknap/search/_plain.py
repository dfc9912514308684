"""The exact best splits of a plain (one chunk per stage) pipeline.

:class:`SegmentSource` builds the tables the certified rounds ask for
(:mod:`._rounds`): ``T[s, a, b]``, the least time of stage s on layers
``a:b``, for the segments under a round's limit (:func:`._segments.plan_segments`).
With ``exclusive`` option pairs the model is searched once per way to keep
each pair apart (:func:`variants`) and every segment takes the least of its
variants' times.  :func:`plain_search` runs one search to its certified top k
and plans the splits found (every distinct stage solved once).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ..engine import (
    FrontTable,
    LayerOption,
    PipelineChoice,
    Planner,
    Stage,
    StageChoice,
    report,
)
from ..schedule import stage_forward_backward
from ._classify import kind_index
from ._closed_form import ClosedForm
from ._model import PipelineModel
from ._rounds import Found, Solver, certified_rounds, first_limit, run_rounds
from ._segments import SegmentTable, fastest_prefix, plan_segments, search_space
from ._simulated_score import Simulated
from ._slowest import Slowest

#: The option of a kind whose every option a variant excludes: more memory than any device.
EXCLUDED = LayerOption("(excluded)", 0.0, 0.0, 0.0, held_once=float(2**70))


def variants(model: PipelineModel, exclusive: Any) -> list[PipelineModel]:
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


def front_table(fronts: Mapping, bucket: float, relaxed: bool = False, cache: dict | None = None) -> FrontTable:
    """A :class:`FrontTable` of ``fronts``, shared through ``cache`` by every search whose options
    are equal (LayerOptions compare by value), so their problems can be solved together."""
    if cache is None:
        return FrontTable(fronts, bucket, relaxed)
    try:
        key = (tuple(sorted(((k, tuple(v)) for k, v in fronts.items()), key=repr)), bucket, relaxed)
        hash(key)
    except TypeError:
        key = (id(fronts), bucket, relaxed)
    table = cache.get(key)
    if table is None:
        table = cache[key] = FrontTable(fronts, bucket, relaxed)
    return table


class SegmentSource:
    """The segment tables of one plain search (:class:`gpuknap.search._rounds.Source`), and the
    plans of its splits.  ``relaxed``: weights rounded down and budgets up (lower bounds on
    the exact-bytes times, for ``bound=True``); ``cache``: front tables shared between searches."""

    def __init__(self, model: PipelineModel, stages: int, bucket: float, in_flight: Any = None,
                 exclusive: Any = (), relaxed: bool = False, cache: dict | None = None,
                 max_bytes: int | None = None):
        self.model, self.stages, self.in_flight, self.max_bytes = model, stages, in_flight, max_bytes
        self.variants = variants(model, exclusive)
        self.tables = [front_table(v.fronts, bucket, relaxed, cache) for v in self.variants]
        # The bounds need each layer's fastest option over every variant: the model's own.
        whole = self.tables[0] if self.variants[0] is model else front_table(model.fronts, bucket, relaxed, cache)
        self.fastest = fastest_prefix(model, whole, kind_index(model), 1)  # times do not depend on in-flight
        self.planners = [Planner(v.fronts, bucket, table=t) for v, t in zip(self.variants, self.tables)]
        self._plans: list = []
        self._spaces: list | None = None  # each variant's search space, from the first round on
        self._narrow: Any = None  # the score's own cut of the segments, when it has one (``rounds``)

    def plan(self, limit: float) -> list[tuple]:
        # a variant's table alone may not cover what another holds; a later round has the same rooms
        cover = len(self.variants) == 1 and not self._plans
        if self._spaces is None:
            self._spaces = [search_space(v, self.stages, t, self.in_flight) for v, t in zip(self.variants, self.tables)]
        self._plans = [plan_segments(v, self.stages, t, self.in_flight, limit, cover, space, self._narrow)
                       for v, t, space in zip(self.variants, self.tables, self._spaces)]
        return [(t, p.problems, p.verdicts) for t, p in zip(self.tables, self._plans)]

    def fill(self, values: list) -> SegmentTable:
        tables = [p.fill(v) for p, v in zip(self._plans, values)]
        if len(tables) == 1:
            return tables[0]
        width = max(t.width for t in tables)  # bands of the variants, padded to one width, then the least
        return SegmentTable(np.minimum.reduce([np.pad(t.band, ((0, 0), (0, 0), (0, width - t.width)),
                                                      constant_values=np.inf) for t in tables]),
                            any(t.pruned for t in tables))

    def stage_choice(self, stage: Stage) -> StageChoice:
        """A stage's choice: the fastest among the variants' plans (each solved once)."""
        solved = [c for c in (plan.stage(stage) for plan in self.planners) if c is not None]
        return min(solved, key=lambda c: c.time)

    def choices(self, counts: Any) -> tuple:
        """The choice of every stage of a split."""
        return tuple(self.stage_choice(stage) for stage in self.model.stages(list(counts), self.in_flight))

    def score(self, name: str, micro_batches: int | None = None) -> Any:
        """The :class:`gpuknap.search._rounds.Score` called ``name`` for this search."""
        total = float(self.fastest[-1])
        m = self.model.micro_batches if micro_batches is None else micro_batches
        if name == "slowest":
            return Slowest()
        if name == "1f1b":
            return ClosedForm(m, total)
        model, inflight = self.model, [row[0] for row in self.model.in_flight_table(self.stages, 1, self.in_flight)]

        def stage_times(s: int, a: int, b: int) -> tuple[float, float]:
            groups = model._groups(a, b, inflight[s])
            return stage_forward_backward(model, a, b, self.stage_choice(Stage(groups, model._budget(groups))))

        index = kind_index(model)
        low, high = ([f(o.forward_time for o in model.fronts[kind]) for kind in index.kinds] for f in (min, max))
        prefix = [np.concatenate(([0.0], np.cumsum(np.array(v)[index.codes]))) for v in (low, high)]
        return Simulated(m, stage_times, prefix[0], prefix[1], self.max_bytes, total, self.stages, self.fastest)

    def rounds(self, score: str, top: int, micro_batches: int | None = None) -> Any:
        """The certified rounds of this search for ``score`` (a generator, :mod:`._rounds`)."""
        scored = self.score(score, micro_batches)
        self._narrow = getattr(scored, "rooms", None)
        return certified_rounds(scored, first_limit(self.fastest, self.stages),
                                float(self.fastest[-1]), top)


def plain_search(model: PipelineModel, stages: int, top: int, score: str, bucket: float, backend: Any,
                 in_flight: Any, max_bytes: int | None, exclusive: Any = (), bound: bool = False) -> list[tuple]:
    """``best_splits`` for a plain pipeline (arguments validated): ``(counts, score, choice)``
    entries, with ``lower_bound`` appended when ``bound``, in a :class:`._rounds.Found` (not
    exact where the score's search stopped at a cap: the best it found, and a lower bound)."""
    solve = Solver(backend, max_bytes)
    source = SegmentSource(model, stages, bucket, in_flight, exclusive, max_bytes=max_bytes)
    found = run_rounds(source.rounds(score, top), source, solve)
    bounds: list[float] = []
    if bound and found:
        relaxed = SegmentSource(model, stages, bucket, in_flight, exclusive, relaxed=True)
        bounds = [value for _, value in run_rounds(relaxed.rounds(score, len(found)), relaxed, solve)]
    out = Found()  # not exact only where a score's search stopped at a cap (the best it found)
    if isinstance(found, Found):
        out.exact, out.why, out.refusal, out.lower_bound = found.exact, found.why, found.refusal, found.lower_bound
    for i, (counts, value) in enumerate(found):
        choices = source.choices(counts)
        entry = (tuple(int(c) for c in counts), float(value), PipelineChoice(choices, tuple(c.time for c in choices)))
        out.append(entry + (float(bounds[i]),) if bound else entry)
        report("plans", i + 1, len(found))
    if out.exact:
        out.lower_bound = out[0][1] if out else math.nan
    return out
