"""Certified pruning across configurations: the N best rows of a sweep without searching the rest.

Every configuration gets a lower bound on its iteration time from its fastest
options alone (memory ignored; :mod:`._bounds` has how).  Sends between stages
and each stage's tail (data-parallel communication, the optimizer) only add
time; sends are left out, and of the tails only what no split can avoid is
counted (a lower bound on the longest tail, and a bound of the busiest
stage's last micro-batches plus its tail: :func:`_tail_floor`).
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
from collections import Counter
from typing import Any, Callable

import numpy as np

from ..search import coverage
from ._lpbound import memory_path_bound, worth_solving
from ._bounds import (  # noqa: F401 (the bounds' tests import them from here)
    busiest_device,
    fastest_layer_seconds,
    fastest_prefix_seconds,
    fastest_seconds,
    fitting_seconds,
    interleaved_bound,
    interleaved_path_factor,
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
        self._tails: dict[int, tuple] = {}  # i -> (tail floor, busy-plus-tail bound), seconds
        self._busiest: dict[tuple, float] = {}
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
            floor, busy = tail(p, config["data_parallel"], m)
            self._tails[i] = (floor * (1.0 - 1e-9), busy * (1.0 - 1e-9))  # the longest stage tail's least
            plain = max(float(np.sum(times)) / p, float(np.max(times)))  # busiest_device's least
            # below the refined bound: that starts a hair under span_bound and is at least M * plain
            span = max(span_bound(float(prefix[-1]), p, v, m), m * plain) * (1.0 - 1e-11)
            self.cheap[i] = max(span + self._tails[i][0], self._tails[i][1]) * (1.0 - MARGIN)
        self._programs = any(worth_solving(len(self._of[i][1]), c["stages"], c["interleave"])
                             for i, c in enumerate(configs) if i in self._of)

    def refined(self, i: int) -> float:
        """Configuration i's whole-layer bound (see :mod:`._bounds`)."""
        key, times, prefix = self._of[i]
        config = self.configs[i]
        p, v, m = config["stages"], config["interleave"], config["micro_batches"]
        if (key, p, v, m) not in self._whole:
            if (key, p) not in self._busiest:
                self._busiest[key, p] = busiest_device(times, p)
            if v == 1:
                path = whole_layer_bound(prefix, p, m)
            else:  # the path bound of whole layers and the bubble's share of F (see ._bounds)
                path = max(interleaved_bound(prefix, p, v, m),
                           interleaved_path_factor(p, v, m) * float(prefix[-1]) * (1.0 - 1e-12))
            self._whole[key, p, v, m] = max(path, m * self._busiest[key, p])
        span = max(self._whole[key, p, v, m], self._fitting(i, p, v, m))
        return max(span + self._tails[i][0], self._tails[i][1]) * (1.0 - MARGIN)

    def tight(self, i: int) -> float:
        """Configuration i's refined bound or, if higher, the bound with memory per device and
        chunk (:func:`._lpbound.memory_path_bound`, a linear program: computed last, and only
        on a grid with a costly search, :func:`._lpbound.worth_solving`)."""
        config = self.configs[i]
        p, v = config["stages"], config["interleave"]
        lp = 0.0
        if v > 1 and self._programs:
            try:
                lp = memory_path_bound(self.builder(dict(config)), p, v, self.time_unit)
            except ValueError:
                pass
        return max(self.refined(i), (lp + self._tails[i][0]) * (1.0 - MARGIN) if lp else 0.0)

    def _fitting(self, i: int, p: int, v: int, m: int) -> float:
        """The bounds that use only the total time, with the least total that fits the devices'
        memory (:func:`._bounds.fitting_seconds`) in place of the fastest; 0 when it gives none."""
        try:
            model = self.builder(dict(self.configs[i]))
            total = fitting_seconds(model, p, v, self.time_unit)
        except ValueError:
            return 0.0
        if total is None:
            return 0.0
        out = max(span_bound(total, p, v, m), m * total / p)
        return max(out, interleaved_path_factor(p, v, m) * total * (1.0 - 1e-12)) if v > 1 else out


def _fastest(builder: Callable, config: dict, time_unit: float) -> Any:
    """``(fastest layer times, their prefix sums, tail bounds)`` of a configuration's model (the
    tail bounds: :func:`_tail_floor`), or why it cannot be built."""
    try:
        model = builder(dict(config))
        times = fastest_layer_seconds(model, time_unit)
    except ValueError as exc:
        return str(exc)
    return times, np.concatenate(([0.0], np.cumsum(times))), _tail_floor(model)


def _tail_floor(model: Any) -> Callable[[int, int, int], tuple]:
    """``(stages, data-parallel size, micro-batches) -> (floor, busy)`` in seconds: ``floor`` a
    lower bound on the longest stage tail of any split, to add to a span bound (each stage exposes
    at least its share of :meth:`~gpuknap.costs.ModelCosts.tail_seconds` minus its slowest
    one-micro-batch window; the longest is at least the average), ``busy`` a bound of its own (a
    stage's last ``M - 1`` micro-batches plus its tail, the busiest at least the average); both 0
    without a cost model."""
    costs = getattr(model, "costs", None)
    if costs is None:
        return lambda stages, dp, m: (0.0, 0.0)
    kinds = Counter(model.kinds)
    unit = costs.time_unit
    window = sum(n * max(o.forward_time for o in model.fronts[k]) + n * max(o.backward_time for o in model.fronts[k])
                 for k, n in kinds.items()) * unit
    fastest = sum(n * min(o.forward_time + o.backward_time for o in model.fronts[k]) for k, n in kinds.items()) * unit

    def floor(stages: int, dp: int, m: int) -> tuple[float, float]:
        tails = costs.tail_seconds(kinds, stages, dp) * unit
        # (a tail floor to add to a span bound, a bound of its own: busy_s + tail_s >= (M - 1) x the
        # stage's fastest work + its share of the tails, and the busiest is at least the average)
        return max(tails - window, 0.0) / stages, ((m - 1) * fastest + tails) / stages

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
              time_unit: float, limit: int, bucket: float) -> tuple[list, list, dict]:
    """The ``top`` best rows of ``configs``: ``(rows, skipped, counts)``; ``run(configs) -> (rows,
    skipped)`` searches configurations, ``order(rows)`` sorts rows as the full sweep does.
    ``counts``: configurations ``searched``, ``pruned`` (by bound, never built) and ``invalid``.
    More than ``limit`` searches (bounds too weak for this grid) is refused with a ValueError.
    A configuration that :func:`layers_held` proves infeasible is not searched unless fewer than
    ``top`` rows are feasible (then its infeasible row is among the first ``top``)."""

    def proven_infeasible(config: dict) -> bool:
        try:
            model = builder(dict(config))
            return layers_held(model, config["stages"], config["interleave"], bucket) < model.layers
        except ValueError:
            return False  # the search reports why it cannot be built

    bounds = Bounds(configs, builder, time_unit)
    errors = bounds.errors
    skipped = [{"config": configs[i], "reason": why} for i, why in sorted(errors.items())]
    queue = _Queue(bounds)
    rows: list = []
    deferred: list = []  # configurations no split of which fits (proved without a search)
    searched, size = 0, FIRST_ROUND
    while True:
        cutoff = _nth_time(rows, top)
        at = queue.next(cutoff)
        if at is None:
            break
        if searched >= limit:
            raise ValueError(f"top={top}: {searched:,} configurations searched and {len(queue) + 1:,} more are "
                             f"left, the next within reach of the {top}-th best row; a sweep searches at most "
                             f"{limit:,} (narrow the grid or ask for fewer rows)")
        chunk = []
        while at is not None:
            if proven_infeasible(configs[at]):
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
