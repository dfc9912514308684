"""The single-stage solvers' limits: the bytes of their DP tables, their work, the width of a row.

A single-stage solve (``choose``, ``least_times``, ``suffix_times``, ``pp_lite``
and the plans built on them) checks these before it allocates anything, and a
refusal names a bucket that passes all of them.  When every DP row of a stage
does not fit, its traceback keeps the option each cell took for a block of
layers and a checkpoint row before each block; :func:`traceback_block` picks the block.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

import numpy as np

from ._options import check_int
from ._work import (
    MAX_ROW_BUCKETS,
    MAX_STEPS,
    STEP_CELLS,
    WorkTooLarge,
    amount,
    bucket_factor,
    check_work,
    coarser,
    format_bytes,
    format_count,
    max_cells,
)

#: Largest DP table (bytes) a single-stage solve may build before it refuses.
SINGLE_STAGE_LIMIT = 2**31
_table_cap: ContextVar[int | None] = ContextVar("gpuknap_single_stage_bytes", default=None)


def table_limit() -> int:
    """The bytes a single-stage solve may hold: :data:`SINGLE_STAGE_LIMIT`, or less inside
    :func:`single_stage_memory`."""
    cap = _table_cap.get()
    return SINGLE_STAGE_LIMIT if cap is None else min(SINGLE_STAGE_LIMIT, cap)


@contextmanager
def single_stage_memory(max_bytes: int) -> Iterator[None]:
    """Hold single-stage solves (``choose``, ``least_times``, ``suffix_times``) to ``max_bytes``
    inside the ``with`` block, as ``max_bytes`` holds the batched engine (``--max-memory``)."""
    token = _table_cap.set(check_int(max_bytes, "single_stage_memory max_bytes (bytes)", 1))
    try:
        yield
    finally:
        _table_cap.reset(token)


def check_steps(steps: int, bucket: float, what: str) -> None:
    """Refuse a stage of ``steps`` layer steps whose passes alone are over the work limit (no
    bucket helps), or that no float count of cells can hold (over :data:`._work.MAX_STEPS`)."""
    if steps * STEP_CELLS >= max_cells():
        check_work(0, bucket, what, passes=steps, pass_cells=STEP_CELLS)  # refuses: fixed work over the limit
    if steps >= MAX_STEPS:
        raise ValueError(f"{what} has {format_count(steps)} layer steps, more than the solvers count (2**62); "
                         "use fewer layers per stage")


def guard(width: int, byte_rate: int, cells: Callable[[int], int], bucket: float, what: str,
           passes: int, least: tuple[int, int, int] | None = None) -> None:
    """Refuse, before allocating anything, a solve whose arrays (``byte_rate`` bytes a bucket of its
    rows' ``width``) need over :func:`table_limit` bytes, whose ``passes`` over ``cells(width)`` DP
    cells are more work than the limit, or whose rows are wider than
    :data:`._work.MAX_ROW_BUCKETS`, suggesting a bucket that passes all three.  ``least``: the
    bytes, cells and passes the solve needs at any bucket, at rows of one bucket (default: these
    rows' at width 1); over a limit, the refusal says that no bucket helps."""
    if width >= MAX_ROW_BUCKETS:  # nothing is counted at this width: advise from a narrower row
        if passes * STEP_CELLS >= max_cells():
            check_work(0, bucket, what, passes=passes, pass_cells=STEP_CELLS)  # no bucket helps: refuses
        shrink = -(-width // (MAX_ROW_BUCKETS // 2))
        narrow = -(-width // shrink)
        advice = coarser(bucket * shrink, _overrun(narrow, byte_rate, cells, passes), narrow)
        raise ValueError(f"{what} needs DP rows of {format_count(width)} buckets, wider than the solvers' limit of "
                         f"2**40 buckets; use {advice} (--bucket)")
    nbytes, counted = byte_rate * width, cells(width)
    over = _overrun(width, byte_rate, cells, passes)
    if over <= 1:
        check_work(counted, bucket, what, passes=passes, pass_cells=STEP_CELLS)  # passes (and is counted)
        return
    limit = table_limit()
    least_bytes, least_cells, least_passes = least if least is not None else (byte_rate, cells(1), passes)
    least_work = least_cells + least_passes * STEP_CELLS
    if least_work > max_cells():
        if least_passes * STEP_CELLS >= max_cells():  # the passes alone: the usual words
            check_work(0, bucket, what, passes=least_passes, pass_cells=STEP_CELLS)
        raise WorkTooLarge(f"{what} needs {amount(least_work)} DP cells of work at any bucket, over the work limit "
                           f"of {amount(max_cells())}; a larger bucket does not change that: use fewer layers per "
                           "stage, or raise the limit (--max-work, gpuknap.work_limit)", least_work)
    if least_bytes > limit:
        raise ValueError(f"{what} needs {format_bytes(least_bytes)} of DP tables at any bucket, over "
                         f"{format_bytes(limit)}; a larger bucket does not change that: raise --max-memory "
                         "(gpuknap.engine.single_stage_memory)")
    factor = bucket_factor(over, width)
    check_work(counted, bucket, what, factor, passes, STEP_CELLS)
    if nbytes > limit:
        raise ValueError(f"{what} needs {format_bytes(nbytes)} of DP tables (over {format_bytes(limit)}); "
                         f"use {coarser(bucket, over, width)}"
                         + (" (--bucket), or raise --max-memory" if limit < SINGLE_STAGE_LIMIT else ""))


def _overrun(width: int, byte_rate: int, cells: Callable[[int], int], passes: int) -> float:
    """How many times over its limits (table bytes, work) a solve at ``width`` buckets is."""
    return max(byte_rate * width / table_limit(), cells(width) / max(max_cells() - passes * STEP_CELLS, 1))


def traceback_block(steps: int, width: int, n_options: int, bucket: float, weight: float = 1.0) -> tuple[int, Any]:
    """``(layers per block, choice dtype)`` for a traceback within :func:`table_limit`.

    Block length 0: every DP row fits, and the traceback reads them.  Otherwise
    the traceback keeps, per block of layers, the option each cell took (one,
    two or four bytes a cell, as the option indices need) plus a checkpoint row
    (8 bytes a cell) before each block; blocks other than the last are
    recomputed from their checkpoint.  One block when everything fits; else the
    block length needing the least memory.  Refuses what still does not fit, or
    more passes than the work limit (``weight``: the steps' mean :func:`._work.option_weight`)."""
    dtype = np.uint8 if n_options <= 2**8 else np.uint16 if n_options <= 2**16 else np.uint32
    cell = np.dtype(dtype).itemsize

    def rate(stride: int) -> int:  # bytes a bucket: checkpoints, choices of one block, three working rows
        return (-(-steps // stride) + 3) * 8 + stride * cell

    def once(w: int) -> int:
        return math.ceil(steps * w * weight)

    if (steps + 1) * 8 * width <= table_limit():  # every row kept: no choices recorded
        guard(width, 0, once, bucket, "this stage", steps)
        return 0, dtype
    if rate(max(steps, 1)) * width <= table_limit():
        guard(width, 0, once, bucket, "this stage", steps)
        return max(steps, 1), dtype
    stride = min(range(1, min(max(steps, 1), 2**16) + 1), key=rate)  # best near sqrt(8 x layers)
    least = (min((steps + 1) * 8, rate(stride)), once(1), steps)  # at width 1, the better way
    guard(width, rate(stride), lambda w: math.ceil(2 * steps * w * weight), bucket, "this stage", 2 * steps, least)
    return stride, dtype
