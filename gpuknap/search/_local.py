"""The local search for interleaved splits of models that are not one kind between their
first and last layer (not proven optimal; the answer says so and carries a lower bound).

A split is ``v * P`` counts in chunk-major order.  The search keeps, per split,
a key ``(overflow, score)``: ``overflow`` is how far the split's stages are
from fitting the device even with their lightest options (bytes over the
budget, summed over the stages; a small positive number for a stage that fits
by that measure but has no plan at the bucket), 0 for a split that fits, so a
start that does not fit is moved towards one that does.  Moves:

- one boundary between adjacent segments by one or two layers, or two
  boundaries by one layer each;
- one layer from any segment to any other (the segments between shift by one);
  with many segments (over 82), the two ends of a move at most :func:`reach`
  segments apart, so a split's moves stay under :data:`MAX_MOVES`.

All the moves of a split are scored in one batch (``model.rank``), and the best
improving one is taken until none improves.  Then deterministic kicks (three
random moves from the best split found) restart the descent, then descents
from ``SPREAD`` random splits (more while no split found fits, at most
``RESTARTS``), until ``MAX_SCORED`` splits have been scored.  Starts:
the caller's (the best plain split of ``v * P`` stages placed round-robin, the
closed form's best) and the most even split; the best ``k`` splits seen are
returned.
"""
from __future__ import annotations

import math
import random
from typing import Any, Callable

import numpy as np

#: Descents restarted from a kicked copy of the best split found.
KICKS = 12
#: Descents from random splits after the kicks (more while no split found fits, up to RESTARTS).
SPREAD = 4
RESTARTS = 40
#: Most descent steps per start.
MAX_STEPS = 10_000
#: Most rows the moves of one split make (a split of 256 segments has 200,000 moves otherwise, and
#: scoring them took 70 s and 3.8 GB); past it a move's two ends are at most :func:`reach` apart.
MAX_MOVES = 20_000
#: Splits scored before the search stops (large models: the moves of a split are many).
MAX_SCORED = 6_000


def even_split(layers: int, parts: int) -> list[int]:
    """The most even split of ``layers`` into ``parts`` (larger parts last)."""
    base, extra = divmod(layers, parts)
    return [base + (1 if i >= parts - extra else 0) for i in range(parts)]


def overflow_rows(model: Any, rows: np.ndarray, chunks: int, in_flight: Any) -> np.ndarray:
    """Bytes by which each split's stages exceed the device with their lightest options
    (static bytes plus each layer's lightest option at its chunk's in-flight count)."""
    p = rows.shape[1] // chunks
    table = model.in_flight_table(p, chunks, in_flight)
    room = model.capacity - model.reserved
    counts = sorted({int(k) for row in table for k in row})
    prefix = {}
    for k in counts:
        cost = [float(model.static[kind]) + min(o.memory(k) for o in model.fronts[kind]) for kind in model.kinds]
        prefix[k] = np.concatenate(([0.0], np.cumsum(cost)))
    ends = np.cumsum(rows, axis=1)
    starts = ends - rows
    load = np.zeros((len(rows), p))
    for c in range(chunks):
        for s in range(p):
            pre = prefix[int(table[s][c])]
            i = c * p + s
            load[:, s] += pre[ends[:, i]] - pre[starts[:, i]]
    return np.maximum(load - room, 0.0).sum(axis=1)


def reach(k: int) -> int:
    """How far apart (in segments) the two ends of a move may be among ``k`` segments: all of
    them while every move of a split makes at most :data:`MAX_MOVES` rows, else the nearest."""
    if 4 * (k - 1) + 2 * (k - 1) * (k - 2) + k * (k - 1) <= MAX_MOVES:
        return k
    return max(1, (MAX_MOVES - 4 * (k - 1)) // (6 * k))


def _moves(counts: tuple) -> list[tuple]:
    """Every split one move away (see the module docstring), the two ends of a move at most
    :func:`reach` segments apart."""
    k = len(counts)
    r = reach(k)
    out = set()
    row = list(counts)
    for i in range(k - 1):
        for d in (1, -1, 2, -2):
            out.add(_shifted(row, ((i, d),)))
        for j in range(i + 1, min(k - 1, i + 1 + r)):
            for d in (1, -1):
                for e in (1, -1):
                    out.add(_shifted(row, ((i, d), (j, e))))
    for i in range(k):
        for j in range(max(0, i - r), min(k, i + r + 1)):
            if i != j and row[i] > 1:
                moved = list(row)
                moved[i] -= 1
                moved[j] += 1
                out.add(tuple(moved))
    out.discard(None)
    out.discard(tuple(counts))
    return sorted(out)


def _shifted(row: list, shifts: tuple) -> tuple | None:
    """Boundaries moved: ``(i, d)`` moves d layers from segment i to segment i + 1."""
    out = list(row)
    for i, d in shifts:
        out[i] -= d
        out[i + 1] += d
    return tuple(out) if min(out) >= 1 else None


def local_search(top: int, starts: list, score_rows: Callable[[np.ndarray], np.ndarray],
                 overflow: Callable[[np.ndarray], np.ndarray] | None = None, seed: int = 0) -> list[tuple]:
    """Best-improvement descents from each start and from kicked copies of the best split;
    ``score_rows(rows [B, P*v]) -> scores [B]`` (``inf`` where a split does not fit),
    ``overflow(rows) -> bytes [B]`` (see the module).  Returns every fitting ``(counts,
    score)`` seen, best first, ties by counts (``top`` is kept for callers that cut it)."""
    seen: dict[tuple, tuple] = {}

    def keys(rows: list) -> list[tuple]:
        new = [r for r in dict.fromkeys(rows) if r not in seen]
        if new:
            arr = np.array(new, dtype=np.int64)
            values = np.asarray(score_rows(arr), dtype=np.float64)
            over = np.asarray(overflow(arr), dtype=np.float64) if overflow is not None else np.zeros(len(new))
            for r, v, o in zip(new, values.tolist(), over.tolist()):
                seen[r] = (0.0, v) if math.isfinite(v) else (max(o, 1e-9), math.inf)
        return [seen[r] for r in rows]

    def descend(current: tuple) -> None:
        value = keys([current])[0]
        for _ in range(MAX_STEPS):
            if len(seen) > MAX_SCORED:
                return
            moves = _moves(current)
            if not moves:
                return
            values = keys(moves)
            best = min(range(len(moves)), key=lambda j: (values[j], moves[j]))
            if not values[best] < value:
                return
            current, value = moves[best], values[best]

    starts = list(dict.fromkeys(tuple(int(c) for c in s) for s in starts))
    for start in starts:
        descend(start)
    rng = random.Random(seed)
    layers, parts = sum(starts[0]), len(starts[0])
    for kick in range(KICKS + RESTARTS):
        fits = any(v[0] == 0.0 for v in seen.values())
        if len(seen) > MAX_SCORED or (kick >= KICKS + SPREAD and fits):
            break  # more restarts only while nothing fits
        if kick < KICKS:  # a few random moves from the best split found
            kicked = min(seen, key=lambda r: (seen[r], r))
            for _ in range(3):
                options = _moves(kicked)
                if not options:
                    break
                kicked = options[rng.randrange(len(options))]
        else:  # a random split
            cuts = sorted(rng.sample(range(1, layers), parts - 1))
            kicked = tuple(b - a for a, b in zip([0] + cuts, cuts + [layers]))
        descend(kicked)
    ranked = sorted((v[1], c) for c, v in seen.items() if v[0] == 0.0 and math.isfinite(v[1]))
    return [(c, v) for v, c in ranked]
