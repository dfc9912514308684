"""Exact single-stage solvers: ``choose``, ``least_times``, ``suffix_times``, ``pp_lite``.

These run on NumPy, one stage at a time, with the same min-plus pass
(:func:`._passes.pass_level`) the batched engine uses, so their times
are bit-identical to the batch's readouts.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np

from ._options import MEGABYTE, Front, FrontTable, Layers, buckets_down, buckets_up, check_number, check_time
from ._passes import Segment, pass_level
from ._problem import (
    FASTEST,
    INFEASIBLE,
    canonical,
    check_groups,
    kept_bytes,
    sequential_time,
    verdict,
    zeros_row,
)
from ._results import Assignment, PipelineChoice, Stage, StageChoice
from ._stagelimits import check_steps, guard, traceback_block
from ._work import check_budget, in_budget, option_weight, sizing

Fronts = Mapping[Hashable, Sequence[Any]]

def _segment(front: Front) -> list[Segment]:
    return [Segment(0, 1, front.weights, front.times)]


def _assemble(groups: Sequence[Layers], fronts: list[Front], option_counts: list[list[int]], time: float) -> StageChoice:
    """Build a StageChoice from per-group option counts (lightest option first);
    its memory is :func:`._problem.kept_bytes`, the sum the shortcut tests."""
    assignments = []
    kept = []
    for g, f, counts in zip(groups, fronts, option_counts):
        for j, n in enumerate(counts):
            if n:
                assignments.append(Assignment(g, f.options[j], n))
                kept.append((n, f.memories[j]))
    return StageChoice(tuple(assignments), kept_bytes(kept), time)


def _pass_recording(row: np.ndarray, front: Front, width: int, choice: np.ndarray) -> np.ndarray:
    """One layer step on a single row (the same additions and exact minimum as
    :func:`._passes.pass_level`), writing into ``choice`` the index of the
    first (lightest) option that attains each cell's minimum."""
    out = np.full(width, np.inf)
    choice[:] = 0
    for j, (w, t) in enumerate(zip(front.weights.tolist(), front.times.tolist())):
        if w >= width:
            continue
        cand = row[:width - w] + t
        better = cand < out[w:]
        np.copyto(out[w:], cand, where=better)
        np.copyto(choice[w:], j, where=better)
    return out


def _choose(table: FrontTable, groups: tuple, budget: float, dry: bool = False) -> StageChoice | None:
    """``choose`` on validated groups with a shared front table (``dry``: only its refusals, no DP)."""
    problem = canonical(groups, budget)
    fronts = [table.get(g.kind, g.in_flight) for g in groups]
    how = verdict(problem, table)
    if how.kind == INFEASIBLE:
        return None
    if how.kind == FASTEST:
        counts = [[0] * (len(f.options) - 1) + [g.count] for g, f in zip(groups, fronts)]
        return _assemble(groups, fronts, counts, how.time)
    capacity = how.capacity
    width, n = capacity + 1, sum(g.count for g in groups)
    check_steps(n, table.bucket, "this stage")  # before any float is made from the count
    weight = sum(g.count * option_weight(len(f.options)) for g, f in zip(groups, fronts)) / max(n, 1)
    rooms = buckets_up if table.relaxed else buckets_down  # the relaxed table rounds the budget up

    def width_at(size: float) -> int:
        return rooms(budget, size) + 1

    stride, dtype = traceback_block(n, width, max(len(f.options) for f in fronts), table.bucket, weight,
                                    width_at)  # refuses first
    if dry:
        return None
    steps = [(gi, f) for gi, (g, f) in enumerate(zip(groups, fronts)) for _ in range(g.count)]
    if stride == 0:
        return _choose_kept_rows(groups, fronts, steps, width, capacity)
    firsts = list(range(0, n, stride))
    choices = np.empty((min(stride, n), width), dtype=dtype)

    def block(row: np.ndarray, first: int) -> np.ndarray:
        """The row after the block starting at ``first``, recording its choices."""
        for i, layer in enumerate(range(first, min(n, first + stride))):
            row = _pass_recording(row, steps[layer][1], width, choices[i])
        return row

    # Forward: a checkpoint row before each block; the last block records its choices.
    checkpoints, row = [], zeros_row(width)[0]
    for first in firsts[:-1]:
        checkpoints.append(row)
        for layer in range(first, first + stride):
            row = pass_level(np, row[None, :], None, width, _segment(steps[layer][1]))[0]
    start = _traceback_start(block(row, firsts[-1]), capacity)
    if start is None:
        return None
    best, c = start
    option_counts = [[0] * len(f.options) for f in fronts]
    for k in reversed(range(len(firsts))):
        first = firsts[k]
        if k < len(firsts) - 1:  # recompute this block's choices from its checkpoint
            block(checkpoints[k], first)
        for layer in reversed(range(first, min(n, first + stride))):
            gi, f = steps[layer]
            j = int(choices[layer - first][c])
            option_counts[gi][j] += 1
            c -= int(f.weights[j])
    return _assemble(groups, fronts, option_counts, float(best))


def _traceback_start(last: np.ndarray, capacity: int) -> tuple[float, int] | None:
    """``(least time, least weight with it)`` of the last DP row, None when nothing fits."""
    best = last[capacity]
    if math.isinf(best):
        return None
    return best, int(np.argmax(last == best))


def _choose_kept_rows(groups: tuple, fronts: list[Front], steps: list, width: int,
                      capacity: int) -> StageChoice | None:
    """The traceback when every DP row fits: at each layer, the first (lightest)
    option whose predecessor cell plus its time gives the cell (exact equality:
    the same additions as the pass)."""
    rows = [zeros_row(width)]
    for _, f in steps:
        rows.append(pass_level(np, rows[-1], None, width, _segment(f)))
    start = _traceback_start(rows[-1][0], capacity)
    if start is None:
        return None
    best, c = start
    option_counts = [[0] * len(f.options) for f in fronts]
    for layer in reversed(range(len(steps))):
        gi, f = steps[layer]
        here, before = rows[layer + 1][0], rows[layer][0]
        for j, (w, t) in enumerate(zip(f.weights.tolist(), f.times.tolist())):
            if w <= c and before[c - w] + t == here[c]:
                option_counts[gi][j] += 1
                c -= w
                break
        else:  # pragma: no cover - the DP always has a predecessor
            raise AssertionError("DP traceback found no predecessor")
    return _assemble(groups, fronts, option_counts, float(best))


def choose(groups: Sequence[Layers], fronts: Fronts, budget: float, bucket: float = MEGABYTE,
           bound: bool = False) -> StageChoice | None:
    """The fastest choice of options for ``groups`` within ``budget`` bytes, or None.

    Exact per the contract: all-fastest when it fits in exact bytes, else the
    bucketed multiple-choice knapsack (least time, then least buckets).  With
    ``bound=True`` the choice's ``lower_bound`` is the optimum of the same
    knapsack with weights rounded down and the budget rounded up: no choice
    fitting ``budget`` in exact bytes is faster (equal to ``time`` when the
    bucket divides every option's memory and the budget).
    """
    if not isinstance(bound, (bool, np.bool_)):
        raise ValueError(f"bound must be True or False, got {bound!r}")
    table = FrontTable(fronts, bucket)
    groups = check_groups(groups)
    try:
        choice = _choose(table, groups, budget)
    except ValueError as exc:  # the bound's rows are wider: its refusal names the bucket both need
        if bound and hasattr(exc, "bucket_needed"):
            _choose(FrontTable(fronts, bucket, relaxed=True), groups, budget, dry=True)
        raise
    if choice is None or not bound:
        return choice
    relaxed = _choose(FrontTable(fronts, bucket, relaxed=True), groups, budget)
    return replace(choice, lower_bound=relaxed.time)


def least_times(groups: Sequence[Layers], fronts: Fronts, budget: float, bucket: float = MEGABYTE) -> Callable[[float], float]:
    """``within(room)``: the least time of ``groups`` within ``room`` bytes, for every room.

    One pass over the layers answers every ``0 <= room <= budget``; rooms at
    or above the all-fastest bytes give the all-fastest time; negative rooms
    give ``inf``.  Other rooms above ``budget`` raise ValueError.
    """
    table = FrontTable(fronts, bucket)
    groups = check_groups(groups)
    problem = canonical(groups, budget)
    fronts_ = [table.get(g.kind, g.in_flight) for g in groups]
    fastest_bytes = kept_bytes((g.count, f.memories[-1]) for g, f in zip(groups, fronts_))
    fastest_time = sequential_time([float(f.times[-1]) for f in fronts_], [g.count for g in groups])
    curve = np.full(1, np.inf)
    if budget >= 0:
        if not math.isfinite(fastest_bytes) and math.isinf(budget):
            raise ValueError("budget is inf, and these layers' all-fastest bytes are past any float: every room "
                             "would need a DP row; give a finite budget")
        def width_at(size: float) -> int:  # no row beyond the all-fastest bytes is read
            top = buckets_down(fastest_bytes, size) if math.isfinite(fastest_bytes) else None
            return buckets_down(budget, size, cap=top) + 1

        width = width_at(table.bucket)
        steps = sum(n for _, n in problem.runs)
        check_steps(steps, table.bucket, "this stage's times within each budget")
        rate = sum(n * option_weight(len(table.get(*key).options)) for key, n in problem.runs)
        # the row, the pass's output and its scratch row
        guard(width, lambda w: (3 * 8 * w, math.ceil(w * rate), steps), table.bucket,
              "this stage's times within each budget", width_at)
        row = zeros_row(width)
        for (key, n) in problem.runs:
            f = table.get(*key)
            for _ in range(n):
                row = pass_level(np, row, None, width, _segment(f))
        curve = row[0]

    def within(room: float) -> float:
        check_number(room, "room", allow_inf=True)
        if room < 0:
            return math.inf
        if room >= fastest_bytes:
            return fastest_time
        if room > budget:
            raise ValueError(f"room {room!r} is above the budget {budget!r} this curve was built for")
        return float(curve[buckets_down(room, table.bucket)])

    return within


def suffix_times(layers: Sequence[Layers], fronts: Fronts, budgets: Sequence[float], bucket: float = MEGABYTE) -> list[float]:
    """Entry i: the least bucketed time of ``layers[i:]`` within ``budgets[i]``.

    ``layers`` are single layers (count 1) in model order; ``budgets`` has one
    more entry than ``layers``.  No exact-bytes shortcut: always the bucketed
    optimum; ``inf`` where nothing fits or the budget is negative.
    """
    table = FrontTable(fronts, bucket)
    layers = check_groups(layers, "layers")
    for i, g in enumerate(layers):
        if g.count != 1:
            raise ValueError(f"layers[{i}].count must be 1 for suffix_times, got {g.count}")
    if isinstance(budgets, (str, bytes)) or not isinstance(budgets, (Sequence, np.ndarray)):
        raise ValueError(f"budgets must be a sequence of numbers, got {type(budgets).__name__}")
    if len(budgets) != len(layers) + 1:
        raise ValueError(f"budgets must have len(layers) + 1 = {len(layers) + 1} entries, got {len(budgets)}")
    budgets = [float(check_number(b, f"budgets[{i}]", allow_inf=True)) for i, b in enumerate(budgets)]
    fronts_ = [table.get(g.kind, g.in_flight) for g in layers]
    heaviest = sum(buckets_up(float(f.memories[-1]), table.bucket) for f in fronts_)  # past WEIGHT_CAP too
    caps = [buckets_down(b, table.bucket, cap=heaviest) if b >= 0 else -1 for b in budgets]
    width = max(caps) + 1
    out = [math.inf] * len(budgets)
    if width <= 0:
        return out
    rate = sum(option_weight(len(f.options)) for f in fronts_)
    def width_at(size: float) -> int:  # the rows at another bucket (the heaviest layers' buckets round up)
        top = sum(buckets_up(float(f.memories[-1]), size) for f in fronts_)
        return max(buckets_down(b, size, cap=top) if b >= 0 else -1 for b in budgets) + 1

    guard(width, lambda w: (3 * 8 * w, math.ceil(w * rate), len(layers)), table.bucket, "this stage's suffix times",
          width_at)
    row = zeros_row(width)
    if caps[-1] >= 0:
        out[-1] = 0.0
    for i in range(len(layers) - 1, -1, -1):
        row = pass_level(np, row, None, width, _segment(fronts_[i]))
        if caps[i] >= 0:
            out[i] = float(row[0, caps[i]])
    return out


def check_stages(stages: Any, where: str = "stages") -> tuple:
    """Validate a candidate: a non-empty sequence of :class:`Stage`."""
    if isinstance(stages, (str, bytes)) or not isinstance(stages, Sequence) or len(stages) == 0:
        raise ValueError(f"{where} must be a non-empty sequence of Stage")
    for s, stage in enumerate(stages):
        if not isinstance(stage, Stage):
            raise ValueError(f"{where}[{s}] must be a Stage, got {type(stage).__name__}")
        check_groups(stage.groups, f"{where}[{s}].groups")
        check_number(stage.budget, f"{where}[{s}].budget", allow_inf=True)
        check_time(stage.fixed_time, f"{where}[{s}].fixed_time")
    return tuple(stages)


class Planner:
    """``pp_lite`` for many candidates: one front table, and each distinct stage
    (groups and budget) solved once however many candidates hold it.  With
    ``relaxed=True`` (weights rounded down, budgets up) the stage times are
    lower bounds on what exact bytes allow, not plans."""

    def __init__(self, fronts: Fronts, bucket: float = MEGABYTE, relaxed: bool = False,
                 table: FrontTable | None = None):
        self.fronts = fronts
        self.table = FrontTable(fronts, bucket, relaxed) if table is None else table
        self._cache: dict[tuple, StageChoice | None] = {}

    def __call__(self, stages: Sequence[Stage]) -> PipelineChoice | None:
        """Solve every stage on its own budget; None if any stage has no choice."""
        stages = check_stages(stages)
        for stage in stages:  # validate every kind before solving anything
            for g in stage.groups:
                self.table.get(g.kind, g.in_flight)
        if in_budget():  # the stages' DP sized together before any runs: over the command's limit, refused now
            self._presize(stages)
        choices, times, refused = [], [], []
        for stage in stages:
            try:
                choice = _choose(self.table, stage.groups, stage.budget, dry=True) if refused else self.stage(stage)
            except ValueError as exc:
                if not hasattr(exc, "bucket_needed"):  # not a matter of size
                    raise
                refused.append(exc)
                continue
            if refused:
                continue
            if choice is None:
                return None
            choices.append(choice)
            times.append(choice.time + stage.fixed_time)
        if refused:  # every stage checked: the refusal whose bucket lets them all pass
            raise max(refused, key=lambda exc: exc.bucket_needed)
        return PipelineChoice(tuple(choices), tuple(times))

    def _presize(self, stages: Sequence[Stage]) -> None:
        try:
            todo = {(st.groups, st.budget): st for st in stages if (st.groups, st.budget) not in self._cache}
            with sizing() as cells:
                for st in todo.values():
                    _choose(self.table, st.groups, st.budget, dry=True)
        except (TypeError, ValueError):  # unhashable, or a stage refused alone: the solve says so
            return
        check_budget(sum(c for c, _ in cells), self.table.bucket, f"planning {len(todo)} stage{'' if len(todo) == 1 else 's'}",
                     sum(f for _, f in cells))

    def stage(self, stage: Stage) -> StageChoice | None:
        """The choice of one (validated) stage, solved once per distinct groups and budget."""
        key = (stage.groups, stage.budget)
        try:
            return self._cache[key]
        except KeyError:
            choice = self._cache[key] = _choose(self.table, stage.groups, stage.budget)
            return choice
        except TypeError:  # unhashable groups: solve without the cache
            return _choose(self.table, stage.groups, stage.budget)


def pp_lite(stages: Sequence[Stage], fronts: Fronts, bucket: float = MEGABYTE) -> PipelineChoice | None:
    """Solve every stage on its own budget; None if any stage has no choice."""
    return Planner(fronts, bucket)(stages)
