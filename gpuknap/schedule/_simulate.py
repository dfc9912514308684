"""A pipeline schedule simulator: 1F1B and Megatron-Core's interleaved 1F1B.

Each stage runs its operations (forward or backward of one micro-batch on one
of its chunks) in the order its schedule prescribes (:mod:`._orders`).  An
operation starts when the stage is free and its input has arrived: a forward
needs the same micro-batch's forward on the previous virtual stage, a backward
the same micro-batch's backward on the next virtual stage (the last virtual
stage's backward needs its own forward), each ``p2p`` after it ended.  Virtual
stage ``c * P + s`` is chunk c of stage s: chunk 0 of stages 0..P-1, then chunk 1.

:func:`simulate` runs one pipeline operation by operation and keeps every
operation; :func:`iteration_times` runs a batch of pipelines wave by wave (the
operations of a wave do not depend on one another) with the same additions and
maxima, so its times are bit-identical to :func:`simulate`'s.

The peak number of micro-batches alive on a (stage, chunk) -- forward done,
backward not yet -- depends on the order alone, not on the times
(:func:`in_flight_table`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Sequence

import numpy as np

from ..engine import WorkTooLarge, max_cells
from ._orders import _key, check_ops, check_schedule, levels, order, sequence

#: Bytes of operation end times the batched simulator holds at once (pipelines are cut into chunks).
BATCH_BYTES = 32 * 2**20


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

    @cached_property
    def iteration_time(self) -> float:
        return max((op.end for op in self.ops), default=0.0)

    @cached_property
    def busy(self) -> list[float]:
        out = [0.0] * self.stages
        for op in self.ops:
            out[op.stage] += op.end - op.start
        return out

    @property
    def idle(self) -> list[float]:
        end = self.iteration_time
        return [end - b for b in self.busy]

    @property
    def bubble(self) -> float:
        """The idle fraction of all stages over the iteration."""
        total = self.iteration_time * self.stages
        return sum(self.idle) / total if total > 0 else 0.0

    @cached_property
    def peak_in_flight(self) -> list[list[int]]:
        """``[stage][chunk]``: the most micro-batches alive at once (forward done, backward not)."""
        peak = [[0] * self.chunks for _ in range(self.stages)]
        alive = [[0] * self.chunks for _ in range(self.stages)]
        for op in sorted(self.ops, key=lambda o: (o.stage, o.start, o.end)):
            alive[op.stage][op.chunk] += 1 if op.kind == "F" else -1
            peak[op.stage][op.chunk] = max(peak[op.stage][op.chunk], alive[op.stage][op.chunk])
        return peak


def _check(times: Any, name: str, stages: int | None) -> list[list[float]]:
    import math
    if isinstance(times, (str, bytes)) or not hasattr(times, "__iter__"):
        raise ValueError(f"{name} must be [stage][chunk] times, got {type(times).__name__}")
    rows = [list(r) if isinstance(r, (list, tuple, np.ndarray)) else [r] for r in times]
    if not rows or (stages is not None and len(rows) != stages) or len({len(r) for r in rows}) != 1:
        raise ValueError(f"{name} must be [stage][chunk] times, one row per stage, every row as long")
    if not rows[0]:
        raise ValueError(f"{name} must have at least one chunk per stage, got empty rows")
    for s, row in enumerate(rows):
        for c, t in enumerate(row):  # NumPy scalars as iteration_times takes them (not bools, nor complex)
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(t) or t < 0:
                raise ValueError(f"{name}[{s}][{c}] must be a finite time >= 0, got {t!r}")
    return [[float(t) for t in r] for r in rows]


def simulate(forward: Sequence, backward: Sequence, micro_batches: int, schedule: str = "1f1b",
             p2p: float = 0.0, group: int | None = None) -> Timeline:
    """Simulate one iteration: ``forward[s][c]`` and ``backward[s][c]`` are per-micro-batch times of
    chunk c on stage s (backward with its recompute), ``p2p`` the transfer time between stages,
    ``group`` the interleaved schedule's micro-batch group size (default: the stages)."""
    fwd = _check(forward, "forward", None)
    bwd = _check(backward, "backward", len(fwd))
    p, v = len(fwd), len(fwd[0])
    if len(bwd[0]) != v:
        raise ValueError("forward and backward must have the same chunks per stage")
    _check_p2p(p2p)
    check_schedule(schedule, p, v, micro_batches, group)
    check_ops(p, v, micro_batches)
    micro_batches = int(micro_batches)
    seq = sequence(schedule, p, v, micro_batches, group)
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


def iteration_times(forward: np.ndarray, backward: np.ndarray, micro_batches: int, schedule: str = "1f1b",
                    p2p: float = 0.0, group: int | None = None) -> np.ndarray:
    """Iteration times of a batch of pipelines at once: ``forward``/``backward`` are
    ``[B, stages, chunks]`` arrays.  Each operation ends at ``max(end of the operation
    before it on its stage, end of its input (+ p2p)) + its time``, as in :func:`simulate`,
    so each entry equals ``simulate(...).iteration_time`` exactly; operations run one
    wave at a time (:func:`._orders.levels`), every pipeline of the batch at once.  Times
    must be finite and >= 0, integers or floats (ValueError naming ``forward`` or ``backward``).
    The whole batch's work, pipelines x operations each, is refused over the work limit
    (:func:`gpuknap.engine.work_limit`, an operation of one pipeline counted as one DP cell:
    about a minute) with :class:`gpuknap.engine.WorkTooLarge`, naming the largest batch that fits."""
    return _iteration_times(forward, backward, micro_batches, schedule, p2p, group, True, True)


def unbounded_iteration_times(forward: np.ndarray, backward: np.ndarray, micro_batches: int,
                              schedule: str = "1f1b", p2p: float = 0.0, group: int | None = None) -> np.ndarray:
    """:func:`iteration_times` without the batch's work limit: for the package's own callers
    whose batches their own limits bound (a search's candidates, one pipeline)."""
    return _iteration_times(forward, backward, micro_batches, schedule, p2p, group, True)


def check_batch(batch: int, ops: int) -> None:
    """Refuse ``batch`` pipelines of ``ops`` operations each over the work limit (WorkTooLarge
    naming the estimate and the largest batch that fits)."""
    limit = max_cells()
    if batch * ops <= limit:
        return
    fit = limit // ops
    raise WorkTooLarge(f"forward and backward: {batch:,} pipelines x {ops:,} schedule operations each make "
                       f"{batch * ops:.3g} operations to simulate, over the work limit of {limit:.3g} (one "
                       f"operation of one pipeline counts as a DP cell); at most {fit:,} pipelines of this "
                       "schedule fit: simulate the batch in parts, or raise the limit (gpuknap.work_limit)",
                       batch * ops)


#: Stages x chunks from which one pipeline's time is quicker by waves (:func:`iteration_times`) than by
#: the event simulator (measured on one row: 2.0 against 17 ms at 40 stages x 64 micro-batches, 11.5
#: against 5.4 ms at 1 stage x 1,024: a wave costs a few array calls, an operation a few Python steps).
WAVES_FROM = 16


def iteration_time(forward: Any, backward: Any, micro_batches: int, schedule: str = "1f1b",
                   p2p: float = 0.0) -> float:
    """One pipeline's ``simulate(...).iteration_time`` (``forward[s][c]``, ``backward[s][c]``),
    bit for bit, by whichever simulator is quicker for its shape (:data:`WAVES_FROM`)."""
    try:
        fwd, bwd = np.asarray(forward), np.asarray(backward)
    except (TypeError, ValueError):  # ragged: simulate names what is wrong
        fwd = bwd = None
    if fwd is not None and fwd.ndim == 2 and fwd.shape[0] * fwd.shape[1] >= WAVES_FROM and fwd.dtype.kind in "iuf":
        return float(unbounded_iteration_times(fwd[None], bwd[None], micro_batches, schedule, p2p)[0])
    return simulate(forward, backward, micro_batches, schedule, p2p).iteration_time


def bound_iteration_times(forward: np.ndarray, backward: np.ndarray, micro_batches: int,
                          schedule: str = "1f1b", p2p: float = 0.0, group: int | None = None) -> np.ndarray:
    """:func:`iteration_times` for bounds: the same maxima and additions (monotone in every
    time), but a time may be negative or infinite, as a bound built from differences of times
    may be (the simulated search's partial splits); only NaN is refused."""
    return _iteration_times(forward, backward, micro_batches, schedule, p2p, group, False)


def _iteration_times(forward: Any, backward: Any, micro_batches: Any, schedule: Any, p2p: Any, group: Any,
                     strict: bool, bounded: bool = False) -> np.ndarray:
    fwd, bwd = _array(forward, "forward"), _array(backward, "backward")  # their values once the work is known
    if fwd.ndim != 3 or fwd.shape != bwd.shape:
        raise ValueError("forward and backward must be [batch, stages, chunks] arrays of one shape, got shapes "
                         f"{fwd.shape} and {bwd.shape}")
    batch, p, v = fwd.shape
    if p == 0 or v == 0:
        raise ValueError(f"forward and backward must have at least one stage and one chunk, got shape {fwd.shape}")
    _check_p2p(p2p)
    check_schedule(schedule, p, v, micro_batches, group)
    ops = check_ops(p, v, micro_batches)
    micro_batches = int(micro_batches)
    if batch == 0:
        return np.zeros(0)
    if bounded:
        check_batch(batch, ops)
    fwd, bwd = _times(fwd, "forward", strict), _times(bwd, "backward", strict)
    n, plan, joined = _wave_plan(*_key(schedule, p, v, micro_batches, group))
    step = max(1, BATCH_BYTES // (8 * (n + 1)))
    out = np.empty(batch)
    for lo in range(0, batch, step):
        out[lo:lo + step] = _run_waves(n, plan, joined, fwd[lo:lo + step], bwd[lo:lo + step], float(p2p))
    return out


@lru_cache(maxsize=64)
def _wave_plan(schedule: str, p: int, v: int, m: int, group: int | None) -> tuple[int, tuple, tuple]:
    """The operation count and, per wave of :func:`levels`, its operations (a range:
    operations are numbered in wave order), the operations they wait for and follow on
    their stage (``n``: none, the row of 0.0), the row of each one's duration in a
    ``[kind * P * v + stage * v + chunk, batch]`` table, and its operations whose input
    crosses virtual stages (None when none do); and :func:`_joined` of it."""
    seq, waves = sequence(schedule, p, v, m, group), levels(schedule, p, v, m, group)
    n = len(seq.stage)
    at = np.empty(n + 1, dtype=np.int64)  # each operation's number in wave order; n stays n
    at[waves.order], at[n] = np.arange(n), n
    prev = at[np.where(seq.prev >= 0, seq.prev, n)]
    dep = at[np.where(seq.dep >= 0, seq.dep, n)]
    row = (seq.kind * p + seq.stage) * v + seq.chunk
    plan = []
    for w in range(len(waves.bounds) - 1):
        lo, hi = int(waves.bounds[w]), int(waves.bounds[w + 1])
        ops = waves.order[lo:hi]
        cross = seq.cross[ops]
        plan.append((lo, hi, dep[ops], prev[ops], row[ops], cross if cross.any() else None))
    return n, tuple(plan), _joined(plan)


def _array(values: Any, name: str) -> np.ndarray:
    """``values`` as an integer or float array, not read yet (ValueError naming ``name``)."""
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be an array of times: {exc}") from None
    if arr.dtype.kind not in "iuf":  # not bools, complex numbers (their imaginary part lost), strings, objects
        raise ValueError(f"{name} must hold real times (integers or floats), got dtype {arr.dtype}")
    return arr


def _times(arr: np.ndarray, name: str, strict: bool = True) -> np.ndarray:
    """An :func:`_array` as floats, of finite times >= 0 (``strict``), else of times that are not
    NaN (ValueError naming ``name``)."""
    arr = arr.astype(np.float64, copy=False)
    if strict and arr.size and not (np.isfinite(arr).all() and (arr >= 0).all()):
        bad = arr[~(np.isfinite(arr) & (arr >= 0))][0]
        raise ValueError(f"{name} must hold finite times >= 0, got {float(bad)!r}")
    if not strict and np.isnan(arr).any():
        raise ValueError(f"{name} must hold times, got NaN")
    return arr


def _check_p2p(p2p: Any) -> None:
    if isinstance(p2p, bool) or not isinstance(p2p, (int, float, np.integer, np.floating)) \
            or not 0 <= p2p < float("inf"):
        raise ValueError(f"p2p must be a finite time >= 0, got {p2p!r}")


def _run_waves(n: int, plan: tuple, joined: tuple, fwd: np.ndarray, bwd: np.ndarray, p2p: float) -> np.ndarray:
    durations = np.stack((fwd, bwd)).transpose(0, 2, 3, 1).reshape(-1, fwd.shape[0])  # [kind, stage, chunk] x B
    ends = np.zeros((n + 1, fwd.shape[0]))  # row n: the 0.0 of "no operation before"
    if p2p and any(cross is not None for *_, cross in plan):
        for lo, hi, dep, prev, row, cross in plan:
            ready = ends[dep]
            if cross is not None:
                ready[cross] += p2p
            np.maximum(ends[prev], ready, out=ready)
            ready += durations[row]
            ends[lo:hi] = ready
        return ends[:n].max(axis=0)
    # each wave: one gather of what its operations follow and wait for, written in place
    # (the same maxima and additions); durations in wave order up front while they stay small
    rows, waves = joined
    ordered = durations[rows] if n * fwd.shape[0] <= SMALL_BATCH else None
    for lo, hi, both, k in waves:
        before = ends[both]
        out = ends[lo:hi]
        np.maximum(before[:k], before[k:], out=out)
        out += durations[rows[lo:hi]] if ordered is None else ordered[lo:hi]
    return ends[:n].max(axis=0)


#: Most (operation, pipeline) durations gathered in wave order before the waves run.
SMALL_BATCH = 2**18


def _joined(plan: tuple) -> tuple:
    """Per wave of a :func:`_wave_plan`: ``(lo, hi, prev and dep joined, their split)``, and
    every operation's duration row in wave order."""
    rows = np.concatenate([row for *_, row, _ in plan]) if plan else np.zeros(0, dtype=np.int64)
    return rows, tuple((lo, hi, np.concatenate((prev, dep)), hi - lo) for lo, hi, dep, prev, _, _ in plan)


def in_flight_table(stages: int, chunks: int, micro_batches: int, schedule: str | None = None,
                    group: int | None = None) -> list[list[int]]:
    """``[stage][chunk]`` peak micro-batches alive under Megatron's schedule (``1f1b`` when one
    chunk, else ``interleaved`` unless ``schedule`` names another): what a stage's activation
    memory must hold, read from the order alone (forwards done, backwards not yet)."""
    name = schedule or ("1f1b" if chunks == 1 else "interleaved")
    check_schedule(name, stages, chunks, micro_batches, group)
    if chunks == 1:  # 1F1B: stage s warms up with min(P - s - 1, M) forwards, then one more before a backward
        return [[min(int(stages) - s, int(micro_batches))] for s in range(int(stages))]
    return [list(row) for row in _in_flight(name, int(stages), int(chunks), int(micro_batches), group)]


@lru_cache(maxsize=256)
def _in_flight(schedule: str, stages: int, chunks: int, micro_batches: int, group: int | None) -> tuple:
    out = []
    for ops in order(schedule, stages, chunks, micro_batches, group):
        alive, peak = [0] * chunks, [0] * chunks
        for kind, c, _ in ops:
            alive[c] += 1 if kind == "F" else -1
            peak[c] = max(peak[c], alive[c])
        out.append(tuple(peak))
    return tuple(out)
