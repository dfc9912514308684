"""Lower bounds on a configuration's iteration time from its fastest options alone (memory
ignored), for the sweep's certified pruning (:mod:`._prune`):

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
- Interleaved, the bubble (:func:`interleaved_path_factor`): device ``d``'s
  operations from its first forward of chunk ``c`` (micro-batch 0, which
  must first pass every virtual stage before it) to its last backward of
  chunk ``c`` (which must then pass them all back) run one after the other;
  only the forwards before it and the backwards after it (those of chunks
  before ``c`` in the first and last micro-batch groups) are left out.  Each
  such path is linear in the virtual stages' times, so any weights on the
  paths summing to 1 give ``T >= min_j (weighted coefficient of stage j) *
  F`` for every split, whole layers or not (weak duality); the weights used
  make every coefficient equal.  This sees about half of the interleaved
  bubble, which the bound above misses when the first chunks are small.
- Any schedule: the busiest device does ``M`` times its work, and whole
  layers cannot be shared more evenly than :func:`busiest_device` finds.
- Memory (:func:`fitting_seconds`): the devices together hold every layer,
  each layer's option at least as heavy as at its lightest in-flight count,
  so the options' memory summed over the layers is at most ``P`` times a
  device's room.  The least total time under that one constraint, options
  taken fractionally along each kind's lower hull (a linear relaxation,
  below every split's own options), replaces ``F`` in the bounds above that
  use only the total (the busiest device's share, the continuous path, the
  bubble's share): where memory forces recompute, ``F`` alone looks too fast.

Each least ``T`` is found by :func:`_least`, which tries many times at once
(``reachable`` is array code over them) and returns one it found unreachable.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

from ..schedule import order

#: Layers of other times than the most common one that :func:`busiest_device` groups every way.
SPECIAL_LAYERS = 5


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


def whole_layer_bound(prefix: np.ndarray, stages: int, micro_batches: int, steps: int = 60,
                      send: float = 0.0) -> float:
    """The largest ``T`` found unreachable by stages of whole layers (see the module docstring), a
    lower bound on the one-chunk 1F1B iteration time of any split; at least :func:`span_bound`.
    ``send``: the time of a send between stages, in the same unit (stage ``s``'s path crosses
    ``s`` boundaries each way: ``S_s + M c_s + 2 s send <= T``)."""
    total, m = float(prefix[-1]), micro_batches
    layers = len(prefix) - 1

    def reachable(t: np.ndarray) -> np.ndarray:  # for every time of t at once
        a = np.zeros(len(t), dtype=np.int64)
        done = np.zeros(len(t), dtype=bool)
        for s in range(stages):
            a = np.searchsorted(prefix, (t - 2 * s * send + (m - 1) * prefix[a]) / m, side="right") - 1
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


@functools.lru_cache(maxsize=512)
def device_paths(stages: int, chunks: int, micro_batches: int, schedule: str = "interleaved",
                 group: int | None = None) -> np.ndarray | None:
    """The device paths of the module docstring as a matrix (read-only): row ``c * P + d`` (device
    ``d`` from its first forward of chunk ``c`` to its last backward of chunk ``c``), column ``j``
    the coefficient of virtual stage ``j``'s forward plus backward time.  None when the order
    cannot be built."""
    p, v, m = int(stages), int(chunks), int(micro_batches)
    try:
        ops = order(schedule, p, v, m, group)
    except ValueError:
        return None
    n = p * v
    rows = np.zeros((n, n))
    for d, seq in enumerate(ops):
        kind = np.array([o[0] == "B" for o in seq])
        chunk = np.array([o[1] for o in seq], dtype=np.int64)
        mb = np.array([o[2] for o in seq], dtype=np.int64)
        for c in range(v):
            first = int(np.flatnonzero(~kind & (chunk == c) & (mb == 0))[0])
            last = int(np.flatnonzero(kind & (chunk == c))[-1])
            out = np.ones(len(seq), dtype=bool)
            out[first:last + 1] = False
            # operations of each chunk left out, forwards and backwards counted apart (at most M each)
            left_f = np.bincount(chunk[out & ~kind], minlength=v)
            left_b = np.bincount(chunk[out & kind], minlength=v)
            j = c * p + d
            rows[j, :j] = 1.0  # micro-batch 0 forward to the path's start, the last backward home
            rows[j, np.arange(v) * p + d] += m - np.maximum(left_f, left_b)
    rows.flags.writeable = False
    return rows


def interleaved_path_factor(stages: int, chunks: int, micro_batches: int, schedule: str = "interleaved",
                            group: int | None = None) -> float:
    """``z`` with ``T >= z F + h d`` for every split into ``stages * chunks`` virtual stages of total
    fastest time ``F`` (per micro-batch) run in ``schedule``'s order, ``d`` a send between stages
    (``h``: :func:`interleaved_path_sends`; see the module docstring): weights ``y >= 0`` on the
    rows of :func:`device_paths` from ``A^T y = 1`` (negatives dropped), ``z = min_j (y A)_j /
    sum y``.  0.0 when the order cannot be built or the weights vanish (no bound)."""
    return _path_weights(stages, chunks, micro_batches, schedule, group)[0]


def interleaved_path_sends(stages: int, chunks: int, micro_batches: int, schedule: str = "interleaved",
                           group: int | None = None) -> float:
    """``h`` of :func:`interleaved_path_factor`: the sends on the weighted paths (path ``j`` of
    :func:`device_paths` crosses ``j`` boundaries between virtual stages, each on another device,
    going out and again coming home), ``sum_j 2 j y_j / sum y``; 0.0 where ``z`` is."""
    return _path_weights(stages, chunks, micro_batches, schedule, group)[1]


@functools.lru_cache(maxsize=512)
def _path_weights(stages: int, chunks: int, micro_batches: int, schedule: str, group: int | None) -> tuple:
    """``(z, h)`` of :func:`interleaved_path_factor` and :func:`interleaved_path_sends`."""
    rows = device_paths(stages, chunks, micro_batches, schedule, group)
    if rows is None:
        return 0.0, 0.0
    try:
        y = np.linalg.solve(rows.T, np.ones(len(rows)))
    except np.linalg.LinAlgError:
        return 0.0, 0.0
    y = np.clip(y, 0.0, None)
    if not y.sum() > 0:
        return 0.0, 0.0
    return float((y @ rows).min() / y.sum()), float(2 * np.arange(len(rows)) @ y / y.sum())


def fitting_seconds(model: Any, stages: int, chunks: int, time_unit: float) -> float | None:
    """A lower bound on any split's total time per micro-batch (forward plus backward, seconds)
    when ``stages`` devices of ``model.capacity - model.reserved`` bytes hold its layers (see the
    module docstring); None when even the lightest options exceed the summed room (no claim:
    :func:`gpuknap.sweep._prune.layers_held` decides those)."""
    table = model.in_flight_table(stages, chunks)
    flights = sorted({int(f) for row in table for f in row})
    room = stages * (float(model.capacity) - float(model.reserved))
    counts: dict = {}
    for kind in model.kinds:
        counts[kind] = counts.get(kind, 0) + 1
    base, held, segments = [], [], []
    for kind, n in counts.items():
        points = sorted((o.forward_time + o.backward_time,
                         float(model.static[kind]) + min(o.memory(f) for f in flights)) for o in model.fronts[kind])
        t, mem = points[0]  # the fastest (lightest among equals)
        base.append(n * t)
        held.append(n * mem)
        while True:  # the lower hull towards lighter options: the least time added per byte saved next
            lighter = [((t2 - t) / (mem - m2), t2, m2) for t2, m2 in points if m2 < mem]
            if not lighter:
                break
            slope, t, m2 = min(lighter)
            segments.append((slope, n * (mem - m2)))
            mem = m2
    over = math.fsum(held) - room
    total = math.fsum(base)
    if over > 0:
        for slope, saved in sorted(segments):
            use = min(saved, over)
            total += slope * use
            over -= use
            if over <= 0:
                break
        if over > 1e-9 * room:
            return None
    unit = model.costs.time_unit if getattr(model, "costs", None) is not None else time_unit
    return total * unit * (1.0 - 1e-12)
