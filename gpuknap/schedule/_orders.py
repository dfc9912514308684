"""The orders in which each pipeline stage runs its operations, as Megatron-Core prescribes.

An operation is the forward ("F") or backward ("B") of one micro-batch on one
chunk of a stage.  Orders (``megatron/core/pipeline_parallel/schedules.py``):

- ``1f1b``: stage s of P runs ``min(P - s - 1, M)`` forwards (warm-up), then
  alternates one forward and one backward, then the remaining backwards.
- ``interleaved`` (v > 1 chunks; with one chunk it is ``1f1b``), as Megatron-Core
  0.10 and later run it (the "tunable schedule", commit 4295be1, November 2024):
  micro-batches are taken in groups of ``group`` (``--microbatch-group-size-per-
  virtual-pipeline-stage``, default P): micro-batches 0..G-1 on chunk 0, then on
  chunk 1, ..., then the next group (the last group takes every micro-batch
  left).  Backwards come in the same groups with the chunks reversed.  Stage s
  warms up with ``(P - s - 1) * 2 + (v - 1) * G`` forwards, capped at ``M * v``
  (all of them when the cap is reached), alternates, then cools down.  Needs
  ``P <= G <= M`` and the last group empty or at least P micro-batches long, as
  Megatron checks.
- ``interleaved-legacy``: Megatron-Core 0.9 and earlier (and Megatron-LM before
  it): groups of exactly P micro-batches, warm-up ``(P - s - 1) * 2 + (v - 1) * P``,
  except that when M equals P *every* stage runs all its forwards first.  Needs M
  to be a multiple of P.

:func:`sequence` merges the per-stage orders into one sequence that respects
every dependency, and :func:`levels` groups that sequence into waves of
operations that do not depend on one another (the batched simulator runs one
wave per step).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SCHEDULES = ("1f1b", "interleaved", "interleaved-legacy")
#: Most operations (2 x stages x chunks x micro-batches) a schedule is built for: the orders, the
#: merged sequence and its waves are Python lists, about 10 s per million operations on a loaded
#: 2-core machine, so a larger schedule is refused before anything is built.
MAX_OPS = 500_000


def check_schedule(schedule: str, stages: int, chunks: int, micro_batches: int, group: int | None = None) -> int:
    """Validate a schedule's arguments; return the micro-batch group size it uses (P when not given)."""
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    for name, value in (("stages", stages), ("chunks", chunks), ("micro_batches", micro_batches)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    p, v, m = int(stages), int(chunks), int(micro_batches)
    if group is not None and (isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group < 1):
        raise ValueError(f"group must be an integer >= 1 (micro-batches per group per virtual stage), got {group!r}")
    if schedule == "1f1b" or v == 1:
        if schedule == "1f1b" and v != 1:
            raise ValueError("the 1f1b schedule runs one chunk per stage; use 'interleaved' for chunks > 1")
        return p if group is None else int(group)
    if schedule == "interleaved-legacy":
        if group is not None and group != p:
            raise ValueError(f"the interleaved-legacy schedule groups exactly P={p} micro-batches, got group={group}")
        if m % p:
            raise ValueError(f"the interleaved-legacy schedule needs micro_batches to be a multiple of stages "
                             f"({m} micro-batches, {p} stages)")
        return p
    if group is None and m % p:
        near = " or ".join(str(k) for k in sorted({max(m // p, 1) * p, (m // p + 1) * p}))
        raise ValueError(f"the interleaved schedule needs micro_batches to be a multiple of stages ({m} micro-batches, "
                         f"{p} stages; {near} would do), unless Megatron's micro-batch group, larger than the "
                         f"stages, allows it (group= in the Python API)")
    g = p if group is None else int(group)
    if not p <= g <= m:
        raise ValueError(f"the interleaved schedule needs stages <= group <= micro_batches (Megatron's micro-batch "
                         f"group size per virtual stage), got stages={p}, group={g}, micro_batches={m}; "
                         "with the default group (= stages) micro_batches must be a multiple of stages")
    if 0 < m % g < p:
        raise ValueError(f"the interleaved schedule needs micro_batches to be a multiple of group or to leave a last "
                         f"group of at least stages micro-batches ({m} micro-batches, group {g}, {p} stages)")
    return g


def check_ops(stages: int, chunks: int, micro_batches: int) -> int:
    """The operations of a schedule (2 x stages x chunks x micro-batches), refused over :data:`MAX_OPS`
    (a ValueError naming micro_batches) before anything is built."""
    ops = 2 * int(stages) * int(chunks) * int(micro_batches)
    if ops > MAX_OPS:
        raise ValueError(f"micro_batches: {int(micro_batches):,} micro-batches on {int(stages):,} stages x "
                         f"{int(chunks):,} chunks make {ops:,} schedule operations, over the {MAX_OPS:,} gpuknap "
                         "simulates; use fewer micro-batches (or stages)")
    return ops


def schedule_table(m: int, v: int, g: int) -> list[tuple[int, int]]:
    """Megatron's schedule table for M micro-batches, v chunks and groups of g: per virtual
    micro-batch (forward k), ``(micro-batch, chunk)``."""
    out: list[tuple[int, int]] = []
    for first in range(0, m, g):
        last = m if first + g >= m else first + g  # the last group takes every micro-batch left
        out += [(mb, c) for c in range(v) for mb in range(first, last)]
    return out


def order(schedule: str, stages: int, chunks: int, micro_batches: int, group: int | None = None) -> list[list[tuple]]:
    """Per stage, its operations in order, each ``(kind, chunk, micro_batch)``."""
    g = check_schedule(schedule, stages, chunks, micro_batches, group)
    check_ops(stages, chunks, micro_batches)
    p, v, m = int(stages), int(chunks), int(micro_batches)
    if v == 1:  # one chunk per stage: interleaving is plain 1F1B (as in Megatron)
        out = []
        for s in range(p):
            warm = min(p - s - 1, m)
            ops = [("F", 0, i) for i in range(warm)]
            for i in range(m - warm):
                ops += [("F", 0, warm + i), ("B", 0, i)]
            ops += [("B", 0, i) for i in range(m - warm, m)]
            out.append(ops)
        return out
    total = m * v
    table = schedule_table(m, v, g)
    out = []
    for s in range(p):
        if schedule == "interleaved-legacy" and m == p:
            warm = total
        else:
            warm = min((p - s - 1) * 2 + (v - 1) * g, total)
        forward = [("F", c, mb) for mb, c in table]
        backward = [("B", v - 1 - c, mb) for mb, c in table]
        ops = forward[:warm]
        for k in range(total - warm):
            ops += [forward[warm + k], backward[k]]
        ops += backward[total - warm:]
        out.append(ops)
    return out


@dataclass(frozen=True)
class OpSequence:
    """Every operation of a schedule in one order that respects all its dependencies,
    whatever the times: per operation its stage, chunk, micro-batch, kind (0 forward,
    1 backward), the index of the operation it waits for (-1: none), whether that one
    ran on another virtual stage (then ``p2p`` is added), and the index of the
    operation before it on its stage (-1: none)."""

    stage: np.ndarray
    chunk: np.ndarray
    micro_batch: np.ndarray
    kind: np.ndarray
    dep: np.ndarray
    cross: np.ndarray
    prev: np.ndarray


def _key(schedule: str, stages: int, chunks: int, micro_batches: int, group: int | None) -> tuple:
    """The arguments validated (before any cache is asked: ``True`` hashes as ``1``) and made ints."""
    check_schedule(schedule, stages, chunks, micro_batches, group)
    check_ops(stages, chunks, micro_batches)
    return schedule, int(stages), int(chunks), int(micro_batches), None if group is None else int(group)


def sequence(schedule: str, stages: int, chunks: int, micro_batches: int, group: int | None = None) -> OpSequence:
    """The operations of :func:`order` merged into one dependency-respecting sequence
    (stages take turns running every operation whose input is ready).  Virtual stage
    ``c * P + s`` is chunk c of stage s."""
    return _sequence(*_key(schedule, stages, chunks, micro_batches, group))


@lru_cache(maxsize=64)
def _sequence(schedule: str, p: int, v: int, m: int, group: int | None) -> OpSequence:
    lists = order(schedule, p, v, m, group)
    # position in the sequence of (kind, virtual stage, micro-batch), at kind * P * v * M + vs * M + mb
    backward = p * v * m
    index = [-1] * (2 * backward)
    last = p * v - 1
    nxt = [0] * p
    before = [-1] * p
    cols: tuple[list, ...] = ([], [], [], [], [], [], [])
    stage_, chunk_, mb_, kind_, dep_, cross_, prev_ = cols
    remaining = sum(len(x) for x in lists)
    while remaining:
        progressed = False
        for s in range(p):
            ops, i, n = lists[s], nxt[s], len(lists[s])
            while i < n:
                kind, c, mb = ops[i]
                vs = c * p + s
                if kind == "F":
                    d = index[(vs - 1) * m + mb] if vs > 0 else -1
                    if vs > 0 and d < 0:
                        break
                    k, here = 0, vs * m + mb
                else:
                    d = index[backward + (vs + 1) * m + mb] if vs < last else index[vs * m + mb]
                    if d < 0:
                        break
                    k, here = 1, backward + vs * m + mb
                index[here] = len(stage_)
                stage_.append(s)
                chunk_.append(c)
                mb_.append(mb)
                kind_.append(k)
                dep_.append(d)
                cross_.append(d >= 0 and (k == 0 or vs < last))  # the input came from another virtual stage
                prev_.append(before[s])
                before[s] = len(stage_) - 1
                i += 1
                remaining -= 1
                progressed = True
            nxt[s] = i
        if not progressed:  # pragma: no cover - the prescribed orders never deadlock
            raise AssertionError("the schedule deadlocked")
    return OpSequence(*(np.asarray(col, dtype=bool if i == 5 else np.int64) for i, col in enumerate(cols)))


@dataclass(frozen=True)
class Waves:
    """A sequence grouped into waves: ``order`` lists the operations wave by wave and
    ``bounds[w]:bounds[w + 1]`` is wave w; no operation depends on another of its wave."""

    order: np.ndarray
    bounds: np.ndarray


def levels(schedule: str, stages: int, chunks: int, micro_batches: int, group: int | None = None) -> Waves:
    """The waves of :func:`sequence`: an operation's wave is one more than the latest of
    the operation before it on its stage and the one it waits for."""
    return _levels(*_key(schedule, stages, chunks, micro_batches, group))


@lru_cache(maxsize=64)
def _levels(schedule: str, stages: int, chunks: int, micro_batches: int, group: int | None) -> Waves:
    seq = _sequence(schedule, stages, chunks, micro_batches, group)
    waves: list[int] = []
    for d, b in zip(seq.dep.tolist(), seq.prev.tolist()):
        waves.append(max(waves[d] + 1 if d >= 0 else 0, waves[b] + 1 if b >= 0 else 0))
    wave = np.asarray(waves, dtype=np.int64)
    order_ = np.argsort(wave, kind="stable")
    bounds = np.searchsorted(wave[order_], np.arange(int(wave.max(initial=-1)) + 2))
    return Waves(order_, bounds)
