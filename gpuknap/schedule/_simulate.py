"""A pipeline schedule simulator: 1F1B and Megatron-Core's interleaved 1F1B.

Each stage runs its operations (forward or backward of one micro-batch on one
of its chunks) in the order its schedule prescribes.  An operation starts
when the stage is free and its input has arrived: a forward needs the same
micro-batch's forward on the previous virtual stage, a backward the same
micro-batch's backward on the next virtual stage (the last virtual stage's
backward needs its own forward), each ``p2p`` after it ended.  Virtual stage
``c * P + s`` is chunk c of stage s: chunk 0 of stages 0..P-1, then chunk 1.

Orders (Megatron-Core, ``megatron/core/pipeline_parallel/schedules.py``):

- ``1f1b``: stage s of P runs ``min(P - s - 1, M)`` forwards (warm-up), then
  alternates one forward and one backward, then the remaining backwards.
- ``interleaved`` (v > 1 chunks; with one chunk it is 1f1b): the ``M * v`` forwards are taken in groups of
  P micro-batches per chunk (micro-batches 0..P-1 on chunk 0, then on chunk
  1, ..., then micro-batches P..2P-1 on chunk 0, ...); backwards in the same
  groups with the chunks reversed.  Stage s warms up with ``(P - s - 1) * 2
  + (v - 1) * P`` forwards (all of them when M equals P), then alternates,
  then cools down.  Megatron requires M to be a multiple of P here.

The peak number of micro-batches alive on a (stage, chunk) -- forward done,
backward not yet -- depends on the order alone, not on the times.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

SCHEDULES = ("1f1b", "interleaved")
#: Most operations one simulation runs (stages x chunks x micro-batches x 2).
MAX_OPS = 20_000_000


@dataclass(frozen=True)
class Op:
    """One operation: ``kind`` "F" or "B" of ``micro_batch`` on chunk ``chunk`` of ``stage``."""

    stage: int
    chunk: int
    micro_batch: int
    kind: str
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """A simulated iteration: every operation, and what it adds up to."""

    stages: int
    chunks: int
    micro_batches: int
    ops: tuple

    @property
    def iteration_time(self) -> float:
        return max((op.end for op in self.ops), default=0.0)

    @property
    def busy(self) -> list[float]:
        out = [0.0] * self.stages
        for op in self.ops:
            out[op.stage] += op.end - op.start
        return out

    @property
    def idle(self) -> list[float]:
        return [self.iteration_time - b for b in self.busy]

    @property
    def bubble(self) -> float:
        """The idle fraction of all stages over the iteration."""
        total = self.iteration_time * self.stages
        return sum(self.idle) / total if total > 0 else 0.0

    @property
    def peak_in_flight(self) -> list[list[int]]:
        """``[stage][chunk]``: the most micro-batches alive at once (forward done, backward not)."""
        peak = [[0] * self.chunks for _ in range(self.stages)]
        alive = [[0] * self.chunks for _ in range(self.stages)]
        for op in sorted(self.ops, key=lambda o: (o.stage, o.start, o.end)):
            alive[op.stage][op.chunk] += 1 if op.kind == "F" else -1
            peak[op.stage][op.chunk] = max(peak[op.stage][op.chunk], alive[op.stage][op.chunk])
        return peak


def order(schedule: str, stages: int, chunks: int, micro_batches: int) -> list[list[tuple]]:
    """Per stage, its operations in order, each ``(kind, chunk, micro_batch)``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    p, v, m = stages, chunks, micro_batches
    if schedule == "1f1b" or v == 1:  # one chunk per stage: interleaving is plain 1F1B (as in Megatron)
        if v != 1:
            raise ValueError("the 1f1b schedule runs one chunk per stage; use 'interleaved' for chunks > 1")
        out = []
        for s in range(p):
            warm = min(p - s - 1, m)
            ops = [("F", 0, i) for i in range(warm)]
            for i in range(m - warm):
                ops += [("F", 0, warm + i), ("B", 0, i)]
            ops += [("B", 0, i) for i in range(m - warm, m)]
            out.append(ops)
        return out
    if m % p:
        raise ValueError(f"the interleaved schedule needs micro_batches to be a multiple of stages "
                         f"({m} micro-batches, {p} stages)")
    total = m * v

    def virtual(k: int, forward: bool) -> tuple:
        group, within = divmod(k, p * v)
        chunk = within // p
        return (chunk if forward else v - 1 - chunk), group * p + within % p

    out = []
    for s in range(p):
        warm = total if m == p else min((p - s - 1) * 2 + (v - 1) * p, total)
        ops = [("F", *virtual(k, True)) for k in range(warm)]
        for k in range(total - warm):
            ops += [("F", *virtual(warm + k, True)), ("B", *virtual(k, False))]
        ops += [("B", *virtual(k, False)) for k in range(total - warm, total)]
        out.append(ops)
    return out


def _check(times: Any, name: str, stages: int | None) -> list[list[float]]:
    import math
    rows = [list(r) if isinstance(r, (list, tuple)) else [r] for r in times]
    if not rows or (stages is not None and len(rows) != stages) or len({len(r) for r in rows}) != 1:
        raise ValueError(f"{name} must be [stage][chunk] times, one row per stage, every row as long")
    for s, row in enumerate(rows):
        for c, t in enumerate(row):
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
                raise ValueError(f"{name}[{s}][{c}] must be a finite time >= 0, got {t!r}")
    return [[float(t) for t in r] for r in rows]


def simulate(forward: Sequence, backward: Sequence, micro_batches: int, schedule: str = "1f1b",
             p2p: float = 0.0) -> Timeline:
    """Simulate one iteration: ``forward[s][c]`` and ``backward[s][c]`` are per-micro-batch times of
    chunk c on stage s (backward with its recompute), ``p2p`` the transfer time between stages."""
    fwd = _check(forward, "forward", None)
    bwd = _check(backward, "backward", len(fwd))
    p, v = len(fwd), len(fwd[0])
    if len(bwd[0]) != v:
        raise ValueError("forward and backward must have the same chunks per stage")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be an integer >= 1, got {micro_batches!r}")
    if isinstance(p2p, bool) or not isinstance(p2p, (int, float)) or not 0 <= p2p < float("inf"):
        raise ValueError(f"p2p must be a finite time >= 0, got {p2p!r}")
    if 2 * p * v * micro_batches > MAX_OPS:
        raise ValueError(f"{2 * p * v * micro_batches:,} operations is over the limit of {MAX_OPS:,}")
    seq = sequence(schedule, p, v, micro_batches)
    ends = [0.0] * len(seq.stage)
    free, ops = [0.0] * p, []
    for i, (s, c, mb, kind, dep, cross) in enumerate(zip(seq.stage.tolist(), seq.chunk.tolist(), seq.micro_batch.tolist(),
                                                          seq.kind.tolist(), seq.dep.tolist(), seq.cross.tolist())):
        ready = 0.0 if dep < 0 else ends[dep] + (p2p if cross else 0.0)
        start = max(free[s], ready)
        end = start + (fwd[s][c] if kind == 0 else bwd[s][c])
        ends[i] = free[s] = end
        ops.append(Op(s, c, mb, "F" if kind == 0 else "B", start, end))
    return Timeline(p, v, micro_batches, tuple(ops))


@dataclass(frozen=True)
class OpSequence:
    """Every operation of a schedule in one order that respects all its dependencies,
    whatever the times: per operation its stage, chunk, micro-batch, kind (0 forward,
    1 backward), the index of the operation it waits for (-1: none) and whether that
    one ran on another virtual stage (then ``p2p`` is added)."""

    stage: np.ndarray
    chunk: np.ndarray
    micro_batch: np.ndarray
    kind: np.ndarray
    dep: np.ndarray
    cross: np.ndarray


@lru_cache(maxsize=64)
def sequence(schedule: str, stages: int, chunks: int, micro_batches: int) -> OpSequence:
    """The operations of ``order`` merged into one dependency-respecting sequence
    (stages take turns running every operation whose input is ready)."""
    p, v = stages, chunks
    lists = order(schedule, p, v, micro_batches)
    index: dict[tuple, int] = {}  # (kind, virtual stage, micro-batch) -> position in the sequence
    last = p * v - 1
    nxt = [0] * p
    rows: list[tuple] = []
    remaining = sum(len(x) for x in lists)
    while remaining:
        progressed = False
        for s in range(p):
            while nxt[s] < len(lists[s]):
                kind, c, mb = lists[s][nxt[s]]
                vs = c * p + s
                if kind == "F":
                    dep = ("F", vs - 1, mb) if vs > 0 else None
                else:
                    dep = ("B", vs + 1, mb) if vs < last else ("F", vs, mb)
                if dep is not None and dep not in index:
                    break
                index[(kind, vs, mb)] = len(rows)
                rows.append((s, c, mb, 0 if kind == "F" else 1, -1 if dep is None else index[dep],
                             dep is not None and dep[1] != vs))
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - the prescribed orders never deadlock
            raise AssertionError("the schedule deadlocked")
    cols = list(zip(*rows))
    return OpSequence(*(np.asarray(col, dtype=bool if i == 5 else np.int64) for i, col in enumerate(cols)))


def iteration_times(forward: np.ndarray, backward: np.ndarray, micro_batches: int, schedule: str = "1f1b",
                    p2p: float = 0.0) -> np.ndarray:
    """Iteration times of a batch of pipelines at once: ``forward``/``backward`` are
    ``[B, stages, chunks]`` arrays.  The same additions and maxima as :func:`simulate`
    in the same order, so each entry equals ``simulate(...).iteration_time`` exactly."""
    fwd = np.asarray(forward, dtype=np.float64)
    bwd = np.asarray(backward, dtype=np.float64)
    if fwd.ndim != 3 or fwd.shape != bwd.shape:
        raise ValueError("forward and backward must be [batch, stages, chunks] arrays of one shape")
    batch, p, v = fwd.shape
    seq = sequence(schedule, p, v, micro_batches)
    durations = np.stack((fwd, bwd))  # [kind, B, stage, chunk]
    ends = np.empty((len(seq.stage), batch))
    free = np.zeros((p, batch))
    for i, (s, c, kind, dep, cross) in enumerate(zip(seq.stage.tolist(), seq.chunk.tolist(), seq.kind.tolist(),
                                                      seq.dep.tolist(), seq.cross.tolist())):
        if dep < 0:
            start = np.maximum(free[s], 0.0)
        else:
            start = np.maximum(free[s], ends[dep] + p2p if cross else ends[dep])
        np.add(start, durations[kind, :, s, c], out=ends[i])
        free[s] = ends[i]
    return free.max(axis=0) if p else np.zeros(batch)


def in_flight_table(stages: int, chunks: int, micro_batches: int) -> list[list[int]]:
    """``[stage][chunk]`` peak micro-batches alive under Megatron's schedule (1f1b when one chunk):
    what a stage's activation memory must hold, from the order alone."""
    return [list(row) for row in _in_flight(stages, chunks, micro_batches)]


@lru_cache(maxsize=256)
def _in_flight(stages: int, chunks: int, micro_batches: int) -> tuple:
    schedule = "1f1b" if chunks == 1 else "interleaved"
    ones = [[1.0] * chunks for _ in range(stages)]
    return tuple(tuple(row) for row in simulate(ones, ones, micro_batches, schedule).peak_in_flight)
