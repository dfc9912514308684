"""Certified pruning across configurations: the N best rows of a sweep without searching the rest.

Every configuration gets a lower bound on its iteration time from its fastest
options alone (memory ignored; :mod:`._bounds` has how).  Sends between stages
and each stage's tail (data-parallel communication, the optimizer) only add
time; sends are left out, and of the tails only what no split can avoid is
counted: the iteration is the schedule's span plus the longest stage tail, and
that tail is at least the traffic and optimizer step of the stage with the most
of them, less one micro-batch of its computation, which is at most the span over
the micro-batches (:func:`_tail_floor`, :meth:`Bounds._plus_tails`).
Configurations are searched best bound first, in rounds; a round's rows give the N-th best iteration time so far, and every
configuration whose bound is above it (beyond a rounding margin) is pruned
unbuilt.  The result equals the first N rows of the full sweep: a pruned
configuration's every row is slower than N rows already found.

The bounds are refined lazily: every configuration first gets a cheap one
(``F``, the busiest device's share and the continuous 1F1B path, array code
over the whole grid), and only a configuration that comes first in the queue
on its cheap bound gets its whole-layer bound (:class:`Bounds`).  The cheap
bound is below the refined one, so configurations still come out in the
order of their refined bounds, and those whose cheap bound is already above
the cutoff are never refined.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from typing import Any, Callable

import numpy as np

from ..search import coverage
from ._pace import check_pace
from ._lpbound import memory_path_bound, worth_solving
from ._bounds import (  # noqa: F401 (the bounds' tests import them from here)
    busiest_device,
    fastest_layer_seconds,
    fastest_prefix_seconds,
    fastest_seconds,
    fitting_seconds,
    interleaved_bound,
    interleaved_path_factor,
    interleaved_path_sends,
    span_bound,
    whole_layer_bound,
)

#: Relative margin between a bound and a time before the bound prunes (the bound's sums and the
#: simulation's add the same numbers in different orders).
MARGIN = 1e-9
#: Configurations searched per round: the first round sets a cutoff soon, later ones share more work.
FIRST_ROUND, ROUND = 16, 48
#: Configuration keys a spec or config.json source's layer times depend on (the data-parallel size,
#: the stages and the micro-batches change memory, sends and tails, not a layer's time).
TIME_KEYS = ("tensor_parallel", "context_parallel", "expert_parallel", "expert_tensor_parallel",
             "micro_batch_size", "device")


def _key(config: dict, shared: bool) -> tuple:
    if shared:
        return tuple(config.get(k) for k in TIME_KEYS)
    return tuple(sorted(config.items(), key=lambda e: e[0]))


class Bounds:
    """Lower bounds on every configuration's iteration time, in seconds: ``cheap`` for all at
    once (``inf`` where the model cannot be built, ``errors[i]`` saying why) and :meth:`refined`
    on demand, never below ``cheap``.  Builders of specs and config.json files
    (``builder.shares_layer_times``) build one model per :data:`TIME_KEYS` group; others one per
    configuration."""

    def __init__(self, configs: list, builder: Callable, time_unit: float):
        shared = bool(getattr(builder, "shares_layer_times", False))
        fastest: dict[tuple, Any] = {}
        self.configs = configs
        self.builder, self.time_unit = builder, time_unit
        self.cheap = np.full(len(configs), math.inf)
        self.errors: dict[int, str] = {}
        self._of: dict[int, tuple] = {}  # i -> (key, times, prefix)
        self._whole: dict[tuple, float] = {}
        self._tails: dict[int, tuple] = {}  # i -> (tail floor, largest tail before overlap, M): _plus_tails
        self._busiest: dict[tuple, float] = {}
        self._models: dict[int, Any] = {}
        for i, config in enumerate(configs):
            key = _key(config, shared)
            f = fastest.get(key)
            if f is None:
                f = _fastest(builder, config, time_unit)
                if shared and isinstance(f, str):  # the group's first configuration failed: try each on its own
                    failure, f = f, _fastest(builder, config, time_unit)
                    if isinstance(f, str):
                        self.errors[i] = failure
                        continue
                    key = _key(config, False)
                fastest[key] = f
            if isinstance(f, str):
                self.errors[i] = f
                continue
            times, prefix, tail = f
            p, v, m = config["stages"], config["interleave"], config["micro_batches"]
            if p * v > len(times):
                self.errors[i] = f"{p} stages x {v} chunks is more than the model's {len(times)} layers"
                continue
            self._of[i] = (key, times, prefix)
            floor, most = tail(p, config["data_parallel"])
            self._tails[i] = (floor * (1.0 - 1e-9), most * (1.0 - 1e-9), m)
            plain = max(float(np.sum(times)) / p, float(np.max(times)))  # busiest_device's least
            # below the refined bound: that starts a hair under span_bound and is at least M * plain
            span = max(span_bound(float(prefix[-1]), p, v, m), m * plain) * (1.0 - 1e-11)
            self.cheap[i] = self._plus_tails(i, span)
        self._programs = any(worth_solving(len(self._of[i][1]), c["stages"], c["interleave"])
                             for i, c in enumerate(configs) if i in self._of)

    def refined(self, i: int) -> float:
        """Configuration i's whole-layer bound (see :mod:`._bounds`), with the sends between stages
        on its paths."""
        key, times, prefix = self._of[i]
        config = self.configs[i]
        p, v, m = config["stages"], config["interleave"], config["micro_batches"]
        model = self.model(i)
        costs = getattr(model, "costs", None)
        # one send between stages (it depends on where the pipeline's ranks sit, so on the DP size too)
        send = costs.p2p * costs.time_unit if costs is not None and p > 1 else 0.0
        if (key, p, v, m, send) not in self._whole:
            if (key, p) not in self._busiest:
                self._busiest[key, p] = busiest_device(times, p)
            if v == 1:
                path = whole_layer_bound(prefix, p, m, send=send)
            else:  # the bubble's share of F, sends on its paths (._bounds; whole layers: tight)
                path = (interleaved_path_factor(p, v, m) * float(prefix[-1])
                        + interleaved_path_sends(p, v, m) * send) * (1.0 - 1e-12)
            self._whole[key, p, v, m, send] = max(path, m * self._busiest[key, p])
        span = max(self._whole[key, p, v, m, send], self._fitting(model, p, v, m, send))
        return self._plus_tails(i, span)

    def model(self, i: int) -> Any:
        """Configuration i's model (built once; None when it cannot be built)."""
        if i not in self._models:
            try:
                self._models[i] = self.builder(dict(self.configs[i]))
            except ValueError:
                self._models[i] = None
        return self._models[i]

    def _plus_tails(self, i: int, span: float) -> float:
        """Configuration i's bound from a lower bound ``span`` on its schedule's span: the
        iteration is the span plus the longest stage tail, which is at least ``floor`` (see
        :func:`_tail_floor`) and at least ``C_s - W_s`` for the stage of the largest ``C_s``,
        where ``W_s`` (its one micro-batch) is at most the span over ``M``."""
        floor, most, m = self._tails[i]
        return max(span + floor, span * (1.0 - 1.0 / m) + most) * (1.0 - MARGIN)

    def tight(self, i: int) -> float:
        """Configuration i's refined bound or, if higher, interleaved, the path bound of whole
        layers (:func:`._bounds.interleaved_bound`) and the bound with memory per device and
        chunk (:func:`._lpbound.memory_path_bound`, a linear program, only on a grid with a
        costly search, :func:`._lpbound.worth_solving`): computed last, for the configurations
        still within reach."""
        config = self.configs[i]
        p, v, m = config["stages"], config["interleave"], config["micro_batches"]
        if v == 1:
            return self.refined(i)
        span = interleaved_bound(self._of[i][2], p, v, m)
        model = self.model(i)
        if self._programs and model is not None:
            try:
                span = max(span, memory_path_bound(model, p, v, self.time_unit))
            except ValueError:
                pass
        return max(self.refined(i), self._plus_tails(i, span))

    def _fitting(self, model: Any, p: int, v: int, m: int, send: float) -> float:
        """The bounds that use only the total time, with the least total that fits the devices'
        memory (:func:`._bounds.fitting_seconds`) in place of the fastest; 0 when it gives none."""
        try:
            total = fitting_seconds(model, p, v, self.time_unit) if model is not None else None
        except ValueError:
            return 0.0
        if total is None:
            return 0.0
        out = max(span_bound(total, p, v, m), m * total / p)
        if v == 1:
            return out
        return max(out, (interleaved_path_factor(p, v, m) * total + interleaved_path_sends(p, v, m) * send)
                   * (1.0 - 1e-12))


def _fastest(builder: Callable, config: dict, time_unit: float) -> Any:
    """``(fastest layer times, their prefix sums, tail bounds)`` of a configuration's model (the
    tail bounds: :func:`_tail_floor`), or why it cannot be built."""
    try:
        model = builder(dict(config))
        times = fastest_layer_seconds(model, time_unit)
    except ValueError as exc:
        return str(exc)
    return times, np.concatenate(([0.0], np.cumsum(times))), _tail_floor(model)


def _tail_floor(model: Any) -> Callable[[int, int], tuple]:
    """``(stages, data-parallel size) -> (floor, most)`` in seconds, the two ways :meth:`Bounds._plus_tails`
    adds the stage tails (data-parallel traffic and the optimizer step, :meth:`~gpuknap.costs.ModelCosts.tail`)
    to a bound on the schedule's span (the iteration is the span plus the longest tail).  With
    ``C_s`` a stage's tail before overlap and ``W_s`` the one micro-batch's forward and backward that
    hides it, a stage's tail is at least ``C_s - W_s``; ``floor`` is the average of that over the
    stages with every layer's slowest options in ``W_s``.  ``most`` is a lower bound on the largest
    ``C_s`` of any split of whole layers (:func:`._bounds.busiest_device` of the layers' shares of
    :meth:`~gpuknap.costs.ModelCosts.tail_seconds`); ``W_s`` is at most the span over ``M``, since
    the stage runs ``M`` micro-batches.  Both 0 without a cost model."""
    costs = getattr(model, "costs", None)
    if costs is None:
        return lambda stages, dp: (0.0, 0.0)
    kinds = Counter(model.kinds)
    unit = costs.time_unit
    window = sum(n * max(o.forward_time for o in model.fronts[k]) + n * max(o.backward_time for o in model.fronts[k])
                 for k, n in kinds.items()) * unit
    known: dict[tuple, tuple] = {}

    def floor(stages: int, dp: int) -> tuple[float, float]:
        if (stages, dp) not in known:
            each = {k: v * unit for k, v in costs.tail_shares(kinds, stages, dp).items()}
            shares = np.array([each[k] for k in model.kinds if each[k] > 0], dtype=np.float64)
            total = float(np.sum(shares))
            if shares.size and np.all(shares == shares[0]):  # one kind of layer: the busiest holds ceil(L / P)
                most = float(shares[0]) * -(-shares.size // stages)
            else:
                most = busiest_device(shares, stages) if shares.size else 0.0
            known[stages, dp] = (max(total - window, 0.0) / stages, most)
        return known[stages, dp]

    return floor


def lower_bounds(configs: list, builder: Callable, time_unit: float) -> tuple[np.ndarray, dict]:
    """``(bounds in seconds, {index: reason})`` for every configuration, every bound tightened
    (:meth:`Bounds.tight`); a configuration whose model cannot be built gets the reason instead
    of a bound (``inf``)."""
    bounds = Bounds(configs, builder, time_unit)
    out = np.array([math.inf if i in bounds.errors else bounds.tight(i) for i in range(len(configs))])
    return out, bounds.errors


def layers_held(model: Any, stages: int, chunks: int, bucket: float) -> int:
    """An upper bound on how many layers the ``stages`` devices hold, each with the lightest option
    everywhere: fewer than ``model.layers`` proves that no split fits, so the search would only say
    so.  One chunk: :func:`gpuknap.search.coverage` (the search's own bound).  Interleaved: a device
    holds at most as many layers as the lightest layers of the model fit its memory, each layer at
    the fewest micro-batches any of the device's chunks keeps (exact bytes; the search rounds memory
    up to buckets, so it can only fit less)."""
    if chunks == 1:
        return coverage(model, stages, bucket)
    table = model.in_flight_table(stages, chunks)
    room = model.capacity - model.reserved
    counts: dict = {}
    for kind in model.kinds:
        counts[kind] = counts.get(kind, 0) + 1
    held = 0
    for row in table:
        flights = set(row)
        weights = sorted((float(model.static[k]) + min(o.memory(f) for o in model.fronts[k] for f in flights), k)
                         for k in counts)
        left = room * (1 + MARGIN)
        for weight, kind in weights:
            take = counts[kind] if weight <= 0 else min(counts[kind], int(max(left, 0.0) // weight))
            held += take
            left -= take * weight
            if take < counts[kind]:
                break
    return held


def best_rows(configs: list, builder: Callable, top: int, run: Callable, order: Callable,
              time_unit: float, limit: int, bucket: float,
              max_seconds: float | None = None) -> tuple[list, list, dict]:
    """The ``top`` best rows of ``configs``: ``(rows, skipped, counts)``; ``run(configs) -> (rows,
    skipped)`` searches configurations, ``order(rows)`` sorts rows as the full sweep does.
    ``counts``: configurations ``searched``, ``pruned`` (by bound, never built) and ``invalid``.
    More than ``limit`` searches (bounds too weak for this grid) is refused with a ValueError, and
    so is a sweep estimated over ``max_seconds`` after any round (:func:`._pace.check_pace`): once
    there are ``top`` rows, the configurations still within reach of the cutoff (an upper bound on
    what is left), before that the next round; the proved infeasible ones counted too; each at
    the time per search so far.
    A configuration that :func:`layers_held` proves infeasible is not searched unless fewer than
    ``top`` rows are feasible (then its infeasible row is among the first ``top``)."""

    def proven_infeasible(at: int) -> bool:
        model, config = bounds.model(at), configs[at]
        if model is None:
            return False  # the search reports why it cannot be built
        try:
            return layers_held(model, config["stages"], config["interleave"], bucket) < model.layers
        except ValueError:
            return False

    bounds = Bounds(configs, builder, time_unit)
    errors = bounds.errors
    skipped = [{"config": configs[i], "reason": why} for i, why in sorted(errors.items())]
    queue = _Queue(bounds)
    rows: list = []
    deferred: list = []  # configurations no split of which fits (proved without a search)
    searched, size = 0, FIRST_ROUND
    start = time.perf_counter()
    while True:
        cutoff = _nth_time(rows, top)
        if searched and max_seconds is not None:  # until there are top rows, no bound: the next round only
            left = queue.within(cutoff) if math.isfinite(cutoff) else min(len(queue), size)
            pending = len(deferred) if sum(r["feasible"] for r in rows) < top else 0  # searched only then
            check_pace(left + pending, top, searched, time.perf_counter() - start, max_seconds)
        at = queue.next(cutoff)
        if at is None:
            break
        if searched >= limit:
            raise ValueError(f"top={top}: {searched:,} configurations searched and {len(queue) + 1:,} more are "
                             f"left, the next within reach of the {top}-th best row; a sweep searches at most "
                             f"{limit:,} (narrow the grid or ask for fewer rows)")
        chunk = []
        while at is not None:
            if proven_infeasible(at):
                deferred.append(configs[at])
            else:
                chunk.append(configs[at])
            if len(chunk) >= min(size, limit - searched):
                break
            at = queue.next(cutoff)
        if not chunk:
            continue
        new_rows, bad = run(chunk)
        skipped += bad
        searched += len(chunk)
        rows = order(rows + new_rows)
        rows = _keep(rows, top)
        size = ROUND
    if deferred and sum(r["feasible"] for r in rows) < top:  # their infeasible rows are among the first
        if searched and max_seconds is not None:
            check_pace(len(deferred), top, searched, time.perf_counter() - start, max_seconds)
        new_rows, bad = run(deferred)
        skipped += bad
        searched += len(deferred)
        rows = _keep(order(rows + new_rows), top)
        deferred = []
    counts = {"searched": searched, "pruned": len(queue), "invalid": len(errors), "infeasible": len(deferred)}
    return rows[:top], skipped, counts


class _Queue:
    """Configurations in the order of their tight bounds (equal bounds: fewer chunks first, their
    searches are cheaper and set the cutoff sooner; then grid order).  A configuration is
    refined only once it comes first on its cheap bound, and tightened only once it comes first
    on its refined one under a finite cutoff (before there is one, nothing can be pruned and it
    is handed out on its refined bound): each level is below the next."""

    def __init__(self, bounds: Bounds):
        self._bounds = bounds
        self._heap = [(float(bounds.cheap[i]), c["interleave"], i, 0)
                      for i, c in enumerate(bounds.configs) if i not in bounds.errors]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def within(self, cutoff: float) -> int:
        """How many configurations left have a bound within ``cutoff`` (bounds only rise as they
        are refined, and the cutoff only falls: at most this many are still searched)."""
        return sum(entry[0] <= cutoff for entry in self._heap)

    def next(self, cutoff: float) -> int | None:
        """Take the next configuration whose bound is within ``cutoff`` (None: every one left
        is above it)."""
        while self._heap:
            bound, chunks, i, level = self._heap[0]
            if bound > cutoff:
                return None
            if level == 2 or (level == 1 and math.isinf(cutoff)):  # no cutoff yet: tightening prunes nothing
                heapq.heappop(self._heap)
                return i
            better = self._bounds.refined(i) if level == 0 else self._bounds.tight(i)
            heapq.heapreplace(self._heap, (better, chunks, i, level + 1))
        return None


def _nth_time(rows: list, top: int) -> float:
    """The N-th best feasible row's iteration time in seconds (inf while fewer are known)."""
    times = [r["iteration_time_s"] for r in rows if r["feasible"]]
    return times[top - 1] if len(times) >= top else math.inf


def _keep(rows: list, top: int) -> list:
    """The rows that can still be among the first ``top``: the first ``top`` feasible ones and,
    while fewer are feasible, the infeasible ones behind them (a full sweep lists those last)."""
    feasible = [r for r in rows if r["feasible"]]
    if len(feasible) >= top:
        return feasible[:top]
    return rows[:top]
