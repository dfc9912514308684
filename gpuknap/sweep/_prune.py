"""Certified pruning across configurations: the N best rows of a sweep without searching the rest.

Every configuration gets a lower bound on its iteration time from its fastest
options alone (memory ignored):

- ``F``, the sum over the model's layers of the fastest option's forward plus
  backward time for one micro-batch.  Every split's stages together do at
  least ``F`` per micro-batch, whatever options memory forces.
- One-chunk 1F1B with ``P`` stages and ``M`` micro-batches: stage ``s`` cannot
  start before micro-batch 0 has passed stages ``0..s-1`` forward, does its
  own ``M`` forwards and backwards, and its last backward must still pass
  stages ``s-1..0``; so the iteration takes at least ``S_s + M c_s`` for every
  ``s`` (``c_s`` a stage's time per micro-batch, ``S_s`` the stages' before
  it).  The least possible maximum over ``s`` with ``sum c_s = F`` has every
  term equal, which gives ``F / (1 - (1 - 1/M)^P)`` (``F`` when ``M = 1``,
  tending to ``M F / P`` for large ``M``).  Layers are whole, so the bound
  used is tighter (:func:`whole_layer_bound`): the least ``T`` for which
  stages of whole layers (fastest options, empty stages allowed) satisfy
  ``S_s + M c_s <= T`` for every ``s``.  With ``C(a)`` the fastest time of the
  first ``a`` layers that reads ``C(a_{s+1}) <= (T + (M - 1) C(a_s)) / M``: the
  more layers the stages before hold, the more the next may hold, so taking
  as many as fit stage by stage decides whether a ``T`` is reachable, and a
  search that tries 63 times at once (as array code) finds the least one to a
  relative 1e-9, returning a time it found unreachable.
- Interleaved (``v`` chunks), :func:`interleaved_bound`: the same path through
  every virtual stage, and the path of each device (its every operation
  comes after micro-batch 0 reached its first chunk, and its last one is a
  backward of that chunk, which must still go back to the first stage:
  ``C(a_d) + M W_d <= T``), summed over the devices.  The first chunks are
  taken as small as the virtual paths allow, the rest as large, which
  decides a ``T``.
- Any schedule: the busiest device does ``M`` times its work, and whole
  layers cannot be shared more evenly than :func:`busiest_device` finds.

Sends between stages and each stage's tail (data-parallel communication, the
optimizer) only add time, so they are left out.  Configurations are searched
best bound first, in rounds; a round's rows give the N-th best iteration time
so far, and every configuration whose bound is above it (beyond a rounding
margin) is pruned unbuilt.  The result equals the first N rows of the full
sweep: a pruned configuration's every row is slower than N rows already found.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..search import coverage

#: Relative margin between a bound and a time before the bound prunes (the bound's sums and the
#: simulation's add the same numbers in different orders).
MARGIN = 1e-9
#: Configurations searched per round: the first round sets a cutoff soon, later ones share more work.
FIRST_ROUND, ROUND = 16, 48
#: Layers of other times than the most common one that :func:`busiest_device` groups every way.
SPECIAL_LAYERS = 5
#: Configuration keys a spec or config.json source's layer times depend on (the data-parallel size,
#: the stages and the micro-batches change memory, sends and tails, not a layer's time).
TIME_KEYS = ("tensor_parallel", "context_parallel", "expert_parallel", "expert_tensor_parallel",
             "micro_batch_size", "device")


def fastest_seconds(model: Any, time_unit: float) -> float:
    """``F`` in seconds: the fastest option of every layer, forward plus backward, one micro-batch."""
    return math.fsum(fastest_layer_seconds(model, time_unit).tolist())


def span_bound(fastest: float, stages: int, chunks: int, micro_batches: int) -> float:
    """A lower bound on the iteration time of any split (see the module docstring)."""
    if chunks == 1:
        share = 1.0 - (1.0 - 1.0 / micro_batches) ** stages
        return fastest / share if share > 0 else micro_batches * fastest / stages
    return max(micro_batches * fastest / stages, fastest)


def fastest_layer_seconds(model: Any, time_unit: float) -> np.ndarray:
    """Every layer's fastest forward plus backward time for one micro-batch, in seconds."""
    best = {kind: min(o.forward_time + o.backward_time for o in options) for kind, options in model.fronts.items()}
    unit = model.costs.time_unit if getattr(model, "costs", None) is not None else time_unit
    return np.array([best[k] for k in model.kinds], dtype=np.float64) * unit


def fastest_prefix_seconds(model: Any, time_unit: float) -> np.ndarray:
    """``C``: ``C[a]`` the fastest forward plus backward time of the first ``a`` layers, in seconds."""
    return np.concatenate(([0.0], np.cumsum(fastest_layer_seconds(model, time_unit))))


def busiest_device(times: np.ndarray, devices: int) -> float:
    """A lower bound on the busiest device's work per micro-batch when whole layers of these
    ``times`` are shared by ``devices`` devices in any way (contiguous or not): the layers of the
    most common time are spread as evenly as the others allow, the others (at most
    :data:`SPECIAL_LAYERS`) tried in every grouping.  More kinds of layer: ``sum / devices``."""
    values, counts = np.unique(times, return_counts=True)
    body = int(np.argmax(counts))
    each, many = float(values[body]), int(counts[body])
    others = [float(t) for t in times if t != each]
    plain = max(float(np.sum(times)) / devices, float(np.max(times)))
    if len(others) > SPECIAL_LAYERS or each <= 0:
        return plain
    best = math.inf
    for groups in _groupings(others):
        if len(groups) > devices:
            continue
        loads = np.zeros(devices)
        loads[:len(groups)] = [math.fsum(g) for g in groups]

        def holds(w: np.ndarray, loads: np.ndarray = loads) -> np.ndarray:  # bodies the devices take under
            # each w (a hair generous: a bound)
            return np.floor((w[:, None] - loads[None, :]) / each + 1e-9).clip(min=0).sum(axis=1) >= many

        lo, hi = float(loads.max()), float(loads.max()) + many * each
        best = min(best, _least(holds, lo * (1 - 1e-12), hi, 60, 1e-12))
    return max(plain, best) if math.isfinite(best) else plain


def _groupings(items: list) -> Any:
    """Every way of grouping ``items`` (set partitions)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for groups in _groupings(rest):
        for i in range(len(groups)):
            yield groups[:i] + [[first] + groups[i]] + groups[i + 1:]
        yield [[first]] + groups


def whole_layer_bound(prefix: np.ndarray, stages: int, micro_batches: int, steps: int = 60) -> float:
    """The largest ``T`` found unreachable by stages of whole layers (see the module docstring), a
    lower bound on the one-chunk 1F1B iteration time of any split; at least :func:`span_bound`."""
    total, m = float(prefix[-1]), micro_batches
    layers = len(prefix) - 1

    def reachable(t: np.ndarray) -> np.ndarray:  # for every time of t at once
        a = np.zeros(len(t), dtype=np.int64)
        done = np.zeros(len(t), dtype=bool)
        for _ in range(stages):
            a = np.searchsorted(prefix, (t + (m - 1) * prefix[a]) / m, side="right") - 1
            done |= a >= layers
            if done.all():
                break
        return done

    # unreachable: the continuous relaxation's least; reachable: every layer on the first stage
    return _least(reachable, span_bound(total, stages, 1, m) * (1.0 - 1e-12), (m + stages - 1) * total, steps,
                  1e-9)


#: Times one step of :func:`_least` tries at once by default (each step narrows the interval 64 times).
POINTS = 63


def _least(reachable: Callable[[np.ndarray], np.ndarray], lo: float, hi: float, steps: int,
           tolerance: float, points: int = POINTS) -> float:
    """The largest time found unreachable between ``lo`` (returned as it is when it is
    reachable or ``hi`` is not: the bound falls back to it) and ``hi``: a search that tries
    ``points`` times per step (``reachable`` takes an array of times), as fine as ``steps``
    halvings.  Whatever it returns was tried and found unreachable (or is ``lo``)."""
    if lo >= hi:
        return lo
    ends = reachable(np.array([lo, hi]))
    if ends[0] or not ends[1]:
        return lo
    fractions = np.arange(1, points + 1) / (points + 1)
    for _ in range(-(-steps // max(1, (points + 1).bit_length() - 1))):
        tries = lo + (hi - lo) * fractions
        found = reachable(tries)
        i = int(np.argmax(found)) if found.any() else points
        if i < points:
            hi = float(tries[i])
        if i > 0:
            lo = float(tries[i - 1])
        if hi - lo <= tolerance * hi:
            break
    return lo


def interleaved_bound(prefix: np.ndarray, stages: int, chunks: int, micro_batches: int, steps: int = 40) -> float:
    """The largest ``T`` found unreachable by ``stages * chunks`` virtual stages of whole layers
    (fastest options, empty ones allowed) under both path families of the module docstring, a
    lower bound on the interleaved iteration time of any split; at least :func:`span_bound`."""
    total, m, p = float(prefix[-1]), micro_batches, stages
    layers = len(prefix) - 1
    start = span_bound(total, p, chunks, m) * (1.0 - 1e-12)
    if m == 1:
        return start
    ends = np.arange(layers + 1)

    def reachable(times: np.ndarray) -> np.ndarray:  # for every time at once: rows of t
        t = times[:, None]
        # the round-0 boundaries a_1..a_{P-1} as small as the virtual paths allow, for every a_P at once
        at = np.broadcast_to(ends, (len(times), layers + 1)).copy()
        spent, ok = np.zeros(at.shape), np.ones(at.shape, dtype=bool)
        for _ in range(p - 1):
            need = (m * prefix[at] - t) / (m - 1)
            prev = np.searchsorted(prefix, need, side="left")
            ok &= prev <= at
            at = np.minimum(prev, at)
            spent += prefix[at]
        ok &= m * prefix[at] <= t
        ok &= spent <= p * t - m * total
        some = ok.any(axis=1)
        a = layers - np.argmax(ok[:, ::-1], axis=1)  # the largest a_P allowed (where some is)
        done = some & (a >= layers)
        for _ in range(p * (chunks - 1)):
            a = np.searchsorted(prefix, (times + (m - 1) * prefix[a]) / m, side="right") - 1
            done |= some & (a >= layers)
            if done[some].all():
                break
        return done

    # each try walks every virtual stage: fewer tries per step on long pipelines
    return _least(reachable, start, (m + p * chunks) * total, steps, 1e-9, 15 if p * chunks > 16 else POINTS)


def _key(config: dict, shared: bool) -> tuple:
    if shared:
        return tuple(config.get(k) for k in TIME_KEYS)
    return tuple(sorted(config.items(), key=lambda e: e[0]))


def lower_bounds(configs: list, builder: Callable, time_unit: float) -> tuple[np.ndarray, dict]:
    """``(bounds in seconds, {index: reason})`` for every configuration; a configuration whose model
    cannot be built gets the reason instead of a bound (``inf``).  Builders of specs and config.json
    files (``builder.shares_layer_times``) build one model per :data:`TIME_KEYS` group; others one
    per configuration."""
    shared = bool(getattr(builder, "shares_layer_times", False))
    fastest: dict[tuple, Any] = {}
    whole: dict[tuple, float] = {}
    busiest: dict[tuple, float] = {}
    bounds = np.full(len(configs), math.inf)
    errors: dict[int, str] = {}
    for i, config in enumerate(configs):
        key = _key(config, shared)
        f = fastest.get(key)
        if f is None:
            try:
                model = builder(dict(config))
                f = (fastest_layer_seconds(model, time_unit), model.layers)
            except ValueError as exc:
                f = str(exc)
            if shared and isinstance(f, str):  # the group's first configuration failed: try each on its own
                shared_failure = f
                f = None
                try:
                    model = builder(dict(config))
                    f = (fastest_layer_seconds(model, time_unit), model.layers)
                except ValueError:
                    errors[i] = shared_failure
                    continue
                key = _key(config, False)
            fastest[key] = f
        if isinstance(f, str):
            errors[i] = f
            continue
        times, layers = f
        prefix = np.concatenate(([0.0], np.cumsum(times)))
        p, v, m = config["stages"], config["interleave"], config["micro_batches"]
        if p * v > layers:
            errors[i] = f"{p} stages x {v} chunks is more than the model's {layers} layers"
            continue
        if (key, p, v, m) not in whole:
            if (key, p) not in busiest:
                busiest[key, p] = busiest_device(times, p)
            whole[key, p, v, m] = max(whole_layer_bound(prefix, p, m) if v == 1
                                      else interleaved_bound(prefix, p, v, m), m * busiest[key, p])
        bounds[i] = whole[key, p, v, m] * (1.0 - MARGIN)
    return bounds, errors


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

    bounds, errors = lower_bounds(configs, builder, time_unit)
    skipped = [{"config": configs[i], "reason": why} for i, why in sorted(errors.items())]
    # best bound first; equal bounds one chunk before more (cheaper searches set the cutoff sooner)
    chunks = np.array([c["interleave"] for c in configs])
    todo = [i for i in np.lexsort((chunks, bounds)).tolist() if i not in errors]
    rows: list = []
    deferred: list = []  # configurations no split of which fits (proved without a search)
    searched, at, size = 0, 0, FIRST_ROUND
    while at < len(todo):
        cutoff = _nth_time(rows, top)
        if bounds[todo[at]] > cutoff:
            break
        if searched >= limit:
            raise ValueError(f"top={top}: {searched:,} configurations searched and {len(todo) - at:,} more are "
                             f"within reach of the {top}-th best row; a sweep searches at most {limit:,} "
                             "(narrow the grid or ask for fewer rows)")
        chunk = []
        while at < len(todo) and len(chunk) < min(size, limit - searched) and bounds[todo[at]] <= cutoff:
            config = configs[todo[at]]
            at += 1
            if proven_infeasible(config):
                deferred.append(config)
            else:
                chunk.append(config)
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
    counts = {"searched": searched, "pruned": len(todo) - at, "invalid": len(errors), "infeasible": len(deferred)}
    return rows[:top], skipped, counts


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
