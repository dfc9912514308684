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
    amounts,
    bucket_advice,
    check_work,
    format_bytes,
    format_count,
    max_cells,
    scaled,
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
    if steps * STEP_CELLS > max_cells():
        check_work(0, bucket, what, passes=steps, pass_cells=STEP_CELLS)  # refuses: fixed work over the limit
    if steps >= MAX_STEPS:
        raise ValueError(f"{what} has {format_count(steps)} layer steps, more than the solvers count (2**62); "
                         "use fewer layers per stage")


#: ``need(width) -> (bytes, cells, passes)``: what a solve takes at rows of ``width`` buckets, never
#: less at a wider row.
Need = Callable[[int], tuple]


def guard(width: int, need: Need, bucket: float, what: str,
          width_at: Callable[[float], int] | None = None) -> None:
    """Refuse, before allocating anything, a solve whose tables at rows of ``width`` buckets
    (``need``) are over :func:`table_limit` bytes, whose passes are more work than the limit, or
    whose rows are wider than :data:`._work.MAX_ROW_BUCKETS`; else count its work.  A refusal
    names the smallest bucket whose rows pass all three (found by bisection over narrower rows,
    as ``need`` never falls as rows widen), or says that none does (short of a bucket past the
    budget, where nothing fits).  The rows' width is taken to shrink with the bucket (a budget's
    floor division); ``width_at(bucket)``, where given, is the width at another bucket, and the
    advice is the smallest bucket whose rows of that width pass (doubling, then bisection).  The refusal's ``bucket_needed`` is the bucket it names
    (``inf`` where none helps), so that a caller refusing for several stages names the largest."""
    if width < MAX_ROW_BUCKETS:
        nbytes, cells, passes = need(width)
        if _fits(nbytes, cells, passes):
            check_work(cells, bucket, what, passes=passes, pass_cells=STEP_CELLS)  # passes, and is counted
            return
    try:
        _refuse(width, need, bucket, what, width_at)
    except ValueError as exc:
        if not hasattr(exc, "bucket_needed"):
            exc.bucket_needed = math.inf
        raise


def _refuse(width: int, need: Need, bucket: float, what: str, width_at: Callable[[float], int] | None) -> None:
    nbytes, cells, passes = need(1)
    if not _fits(nbytes, cells, passes):  # rows of one bucket are over: no bucket helps
        _no_bucket(nbytes, cells, passes, bucket, what, "")
    low, high = 1, min(width, MAX_ROW_BUCKETS) - 1  # the widest row that passes, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        if _fits(*need(mid)):
            low = mid
        else:
            high = mid - 1
    # a bucket (width + 1) / low times larger leaves rows of fewer than `low` + 1 buckets (one in
    # width of slack for the budget's float division)
    factor = -(-(width + 1) // low)
    if width_at is not None:  # rows that shrink slower than the bucket grows: grow the advice
        least = width_at(math.inf)  # the narrowest rows any bucket gives
        if not _fits(*need(least)):
            _no_bucket(*need(least), bucket, what, f" (rows of {least:,} buckets are the narrowest any bucket gives)")
        def passes_at(f: int) -> bool:
            narrow = width_at(scaled(bucket, f))
            return narrow < MAX_ROW_BUCKETS and _fits(*need(narrow))
        low_factor = factor - 1  # the largest known to fail (the bisection's factor less one, or none)
        while not passes_at(factor):  # ends: past any float, the size is inf and the rows are `least` wide
            low_factor, factor = factor, factor * 2
        while factor - low_factor > 1:  # the smallest that passes, between the last two tried
            mid = (factor + low_factor) // 2
            if passes_at(mid):
                factor = mid
            else:
                low_factor = mid
    use = f"use {bucket_advice(scaled(bucket, factor))} (--bucket)"
    nbytes, cells, passes = need(min(width, MAX_ROW_BUCKETS - 1))
    if width >= MAX_ROW_BUCKETS:
        exc = ValueError(f"{what} needs DP rows of {format_count(width)} buckets, wider than the solvers' limit of "
                         f"2**40 buckets; {use}")
    elif nbytes > table_limit():
        exc = ValueError(f"{what} needs {format_bytes(nbytes)} of DP tables (over {format_bytes(table_limit())}); "
                         + use + (", or raise --max-memory" if table_limit() < SINGLE_STAGE_LIMIT else ""))
    else:
        work = cells + passes * STEP_CELLS
        shown, most = amounts(work, max_cells())
        exc = WorkTooLarge(f"{what} needs {shown} DP cells, over the work limit of {most}; {use}, "
                           "or raise the limit (--max-work, gpuknap.work_limit)", work)
    exc.bucket_needed = scaled(bucket, factor)
    raise exc


def _no_bucket(nbytes: int, cells: int, passes: int, bucket: float, what: str, where: str) -> None:
    """Refuse what rows as narrow as any bucket makes them cannot do."""
    work = cells + passes * STEP_CELLS
    if work > max_cells():
        if passes * STEP_CELLS > max_cells():  # the passes alone: the usual words
            check_work(0, bucket, what, passes=passes, pass_cells=STEP_CELLS)
        shown, most = amounts(work, max_cells())
        raise WorkTooLarge(f"{what} needs {shown} DP cells of work at any bucket{where}, over the work limit of "
                           f"{most}; a larger bucket does not change that: use fewer layers per stage, or raise "
                           "the limit (--max-work, gpuknap.work_limit)", work)
    raise ValueError(f"{what} needs {format_bytes(nbytes)} of DP tables at any bucket{where}, over "
                     f"{format_bytes(table_limit())}; a larger bucket does not change that: raise --max-memory "
                     "(gpuknap.engine.single_stage_memory)")


def _fits(nbytes: int, cells: int, passes: int) -> bool:
    return nbytes <= table_limit() and cells + passes * STEP_CELLS <= max_cells()


def traceback_block(steps: int, width: int, n_options: int, bucket: float, weight: float = 1.0,
                    width_at: Callable[[float], int] | None = None) -> tuple[int, Any]:
    """``(layers per block, choice dtype)`` for a traceback within :func:`table_limit`.

    Block length 0: every DP row fits, and the traceback reads them.  Otherwise
    the traceback keeps, per block of layers, the option each cell took (one,
    two or four bytes a cell, as the option indices need) plus a checkpoint row
    (8 bytes a cell) before each block; blocks other than the last are
    recomputed from their checkpoint.  One block when everything fits; else the
    block length needing the least memory.  Refuses what still does not fit, or
    more passes than the work limit (``weight``: the steps' mean :func:`._work.option_weight`),
    with the bucket at which one of the three ways fits both limits (``width_at``: see :func:`guard`)."""
    dtype = np.uint8 if n_options <= 2**8 else np.uint16 if n_options <= 2**16 else np.uint32
    cell = np.dtype(dtype).itemsize

    def rate(stride: int) -> int:  # bytes a bucket: checkpoints, choices of one block, three working rows
        return (-(-steps // stride) + 3) * 8 + stride * cell

    one = max(steps, 1)
    best: list[int] = []  # the block length of least bytes, best near sqrt(8 x layers), whatever the width

    def way(w: int) -> tuple[int, int]:  # the block length at rows of w buckets, and its table bytes
        if (steps + 1) * 8 * w <= table_limit():  # every row kept: no choices recorded
            return 0, 0
        if rate(one) * w <= table_limit():
            return one, 0
        if not best:
            best.append(min(range(1, min(one, 2**16) + 1), key=rate))
        return best[0], rate(best[0]) * w

    def need(w: int) -> tuple:  # a checkpointed traceback computes every block but the last twice
        block, nbytes = way(w)
        twice = block not in (0, one)
        return nbytes, math.ceil((2 if twice else 1) * steps * w * weight), (2 if twice else 1) * steps

    guard(width, need, bucket, "this stage", width_at)
    return way(width)[0], dtype
