"""The work of one call: a documented limit checked before it starts, and progress as it goes.

The DP's work is counted in *cells*: one cell is one bucket of one DP row
after one layer step (each cell costs one addition per useful option and a
minimum; a step of more than :data:`OPTIONS_PER_CELL` useful options counts
``options / 4`` cells a cell on NumPy, ``options / 32`` on the compiled passes, and
every pass its set-up).  The engine counts the cells of a whole batch after packing it and
before any pass runs, and refuses a batch over the limit with the count and
what to change; the single-stage solvers do the same.  The limit is
:data:`DEFAULT_MAX_CELLS` (about a minute of NumPy on a 2-core machine, at most) and
can be raised (or lowered) for a block of code with :func:`work_limit`, or
with ``--max-work`` on the command line.

Progress: the engine and the search call :func:`report` as they go; nothing
is shown unless a caller installed a callback with :func:`reporting` (the
command line draws a bar on a terminal).  Context variables keep callers in
other threads apart.

A search or sweep builds millions of small tuples it keeps (stage problems, their
runs, readouts); each full pass of Python's cycle collector walks all of them
again, about a quarter of a slow sweep configuration's time.  The searches make
almost no cycles, so they run with the collector paused (:func:`paused_collection`).
"""
from __future__ import annotations

import gc
import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

import numpy as np

#: Default limit on DP cells per call (about a minute of NumPy passes on a 2-core machine, 4 options).
DEFAULT_MAX_CELLS = 10_000_000_000
#: Most splits ``best_splits`` returns in one call.
MAX_TOP = 1000

#: Useful options a cell's work is counted for on NumPy: a layer step with more counts ``options / 4``
#: cells a cell (the limit's minute was measured at 4 options; a cell costs one addition per option).
#: The compiled passes count ``options / 32`` (``Backend.options_per_cell``).
OPTIONS_PER_CELL = 4

#: What one DP pass costs besides its cells, counted in cells (a cell is about 6 ns of NumPy on a
#: 2-core machine): a level of the batched engine (its Python, plan and uploads; about 40 us
#: measured on a chain of one-bucket levels) and a layer step of a single-stage solver (about 10 us).
#: A stage of very many layers is refused for this, however narrow its rows.
LEVEL_CELLS = 8_000
STEP_CELLS = 2_000

#: How much a suggested bucket exceeds the ratio of the work to its limit.
SUGGESTION_MARGIN = 1.1
#: Widest DP row any solver builds, whatever the memory limit allows (2**40 buckets, 32 TiB of the
#: batched engine's working memory): a wider one is refused before any count is made from it (its
#: bucket numbers would not fit the engine's integer arrays, nor its cell counts a float).
MAX_ROW_BUCKETS = 2**40
#: Most layer steps a stage may have, whatever the work limit allows: the batched engine sums a
#: stage's counts as 64-bit integers, and the single-stage solvers count its cells as floats.
MAX_STEPS = 2**62
_max_cells: ContextVar[int] = ContextVar("gpuknap_max_cells", default=DEFAULT_MAX_CELLS)
_spent: ContextVar[list | None] = ContextVar("gpuknap_spent_cells", default=None)
_budget: ContextVar[list | None] = ContextVar("gpuknap_command_cells", default=None)
_sizing: ContextVar[list | None] = ContextVar("gpuknap_sizing_cells", default=None)


class WorkTooLarge(ValueError):
    """A computation was refused before it started: its estimated work (``cells``) exceeds the limit."""

    def __init__(self, message: str, cells: int = 0):
        super().__init__(message)
        self.cells = cells


def max_cells() -> int:
    """The work limit in force (DP cells)."""
    return _max_cells.get()


@contextmanager
def work_limit(cells: int) -> Iterator[None]:
    """Allow up to ``cells`` DP cells per call inside the ``with`` block."""
    if isinstance(cells, bool) or not isinstance(cells, (int, float, np.integer, np.floating)) \
            or not 1 <= cells < math.inf:
        raise ValueError(f"the work limit must be a positive number of DP cells, got {cells!r}")
    token = _max_cells.set(int(cells))
    try:
        yield
    finally:
        _max_cells.reset(token)


@contextmanager
def command_budget(cells: int | None = None) -> Iterator[list]:
    """Count every DP call inside the ``with`` block against one limit (default: the work limit in
    force): each call is still refused alone over the per-call limit, and besides, a call that
    would take the calls' total over this one is refused (a command that plans each of many stages,
    or searches in many rounds, stays within the limit its user gave).  Yields ``[cells used, limit,
    fixed cells used]``."""
    limit = max_cells() if cells is None else int(cells)
    used = [0, limit, 0]  # cells used, the limit, and of the used the passes' set-up that no bucket changes
    token = _budget.set(used)
    try:
        yield used
    finally:
        _budget.reset(token)


@contextmanager
def paused_collection() -> Iterator[None]:
    """Python's cycle collector paused inside the block (also a decorator), running again
    after it, exceptions included, when it ran before.  Reference counting still frees
    everything without cycles at once; the few cycles made inside wait for the next
    collection after the block.  The collector is the process's: other threads run
    without it meanwhile, and the first block to end turns it back on for all."""
    was = gc.isenabled()
    try:
        gc.disable()
        yield
    finally:
        if was:
            gc.enable()


def option_weight(options: int) -> float:
    """How many cells one cell of a layer step with ``options`` useful options counts as."""
    return max(options, OPTIONS_PER_CELL) / OPTIONS_PER_CELL


def bucket_factor(ratio: float, width: int | None = None) -> int:
    """How many times coarser a bucket must be to bring work or memory that is ``ratio`` times its
    limit under it: :data:`SUGGESTION_MARGIN` over the ratio (widths round to whole buckets) and,
    with the rows' ``width`` known, enough for the one cell each row keeps beyond its capacity (a
    row of ``width`` cells is at most ``(width - 1) / f + 1`` at a bucket ``f`` times larger)."""
    factor = math.ceil(ratio * SUGGESTION_MARGIN)
    if width is not None and ratio > 1:
        factor = max(factor, math.ceil((width - 1) / (width / ratio - 1)) if width > ratio else max(width, 1))
    return factor


def coarser(bucket: float, ratio: float, width: int | None = None, at_least: int = 1) -> str:
    """Advice for work or memory ``ratio`` times its limit: "a bucket of at least ..." (
    :func:`bucket_factor` times ``bucket``, and at least ``at_least`` times it), or, where no float
    can name that size (a stage's memory near the largest float), "a far larger bucket"."""
    try:
        factor = max(bucket_factor(ratio, width), at_least)
    except OverflowError:
        return bucket_advice(math.inf)
    return bucket_advice(scaled(bucket, factor))


def scaled(bucket: float, factor: int) -> float:
    """``bucket * factor`` (inf past any float)."""
    try:
        return bucket * factor
    except OverflowError:
        return math.inf


def bucket_advice(size: float) -> str:
    """"a bucket of at least" ``size``, or "a far larger bucket" where no float names it."""
    return f"a bucket of at least {format_bytes(size)}" if math.isfinite(size) else "a far larger bucket"


def format_count(n: int, spec: str = "") -> str:
    """``n`` in full (formatted by ``spec``), or its order of magnitude past 15 digits."""
    return format(n, spec) if n < 10**15 else f"about 10^{len(str(n)) - 1}"


@contextmanager
def counting() -> Iterator[list]:
    """Count the DP cells of the calls inside the ``with`` block: the list's one item (a caller
    that makes many calls, each within the limit, can so estimate their total)."""
    spent = [0]
    token = _spent.set(spent)
    try:
        yield spent
    finally:
        _spent.reset(token)


def check_work(cells: int, bucket: float, what: str = "this batch", factor: int = 1,
               passes: int = 0, pass_cells: int = LEVEL_CELLS) -> None:
    """Refuse ``cells`` DP cells and ``passes`` passes of ``pass_cells`` each (work that no bucket
    changes) over the limit, saying what would fit (a bucket at least ``factor`` times this one,
    when another limit needs that)."""
    limit = max_cells()
    fixed = passes * pass_cells
    if cells + fixed <= limit:
        sizing = _sizing.get()
        if sizing is not None:  # a dry pass: recorded, not counted
            sizing.append((cells, fixed))
            return
        check_budget(cells, bucket, what, fixed)
        budget = _budget.get()
        if budget is not None:
            budget[0] += cells + fixed
            budget[2] += fixed
        spent = _spent.get()
        if spent is not None:
            spent[0] += cells + fixed
        return
    if fixed >= limit:
        need, most = amounts(fixed, limit)
        raise WorkTooLarge(
            f"{what} needs {format_count(passes, ',')} DP passes over its layers, {need} DP cells of work "
            f"before any bucket is counted, over the work limit of {most}; a larger bucket does not change "
            "that: use fewer layers per stage, or raise the limit (--max-work, gpuknap.work_limit)", cells + fixed)
    try:
        ratio = cells / (limit - fixed)
    except OverflowError:  # past any float: no float names the bucket either
        ratio = math.inf
    need, most = amounts(cells + fixed, limit)
    raise WorkTooLarge(
        f"{what} needs {need} DP cells, over the work limit of {most}; use {coarser(bucket, ratio, at_least=factor)} "
        "(--bucket), or raise the limit (--max-work, gpuknap.work_limit)", cells + fixed)


def check_budget(cells: int, bucket: float, what: str, fixed: int = 0) -> None:
    """Refuse ``cells`` more DP cells (and ``fixed`` cells of passes' set-up, which no bucket changes)
    when they take the command's calls over its limit (:func:`command_budget`), naming a bucket at
    which all of them would fit."""
    budget = _budget.get()
    if budget is None or budget[0] + cells + fixed <= budget[1]:
        return
    total, limit, pinned = budget[0] + cells + fixed, budget[1], budget[2] + fixed
    need, most = amounts(total, limit)
    said = (f"{format_count(cells + fixed, '.3g')} DP cells, and the command's earlier DP calls used "
            f"{format_count(budget[0], '.3g')}: {need} in all" if budget[0] else f"{need} DP cells")
    # a larger bucket shrinks the rows and can spare whole calls (stages whose fastest options then
    # fit need no DP), so the set-up counted so far is not fixed across buckets: scaled as a whole
    # unless the set-up is under the limit, when the rows alone are scaled
    ratio = total / limit if pinned >= limit else (total - pinned) / (limit - pinned)
    advice = f"use {coarser(bucket, ratio)} (--bucket)"
    raise WorkTooLarge(f"{what} needs {said}, over the work limit of {most} (a command's calls count together); "
                       f"{advice}, or raise the limit (--max-work)", total)


@contextmanager
def sizing() -> Iterator[list]:
    """Inside the block, DP calls that pass the per-call limits record their cells in the yielded
    list instead of counting them: a dry pass that sizes many calls before any of them runs."""
    cells: list = []
    token = _sizing.set(cells)
    try:
        yield cells
    finally:
        _sizing.reset(token)


def in_budget() -> bool:
    """Whether a :func:`command_budget` is counting."""
    return _budget.get() is not None


def amounts(n: int, limit: int) -> tuple[str, str]:
    """Counts of cells ``n`` and ``limit`` to three digits, or as many more as tell them apart
    (their orders of magnitude past any float)."""
    for digits in range(3, 18):
        shown = tuple(f"{x:.{digits}g}" if x < 1e300 else format_count(x) for x in (n, limit))
        if shown[0] != shown[1] or n == limit:
            return shown
    return str(n), str(limit)


def format_bytes(n: float) -> str:
    """A size rounded up to one decimal of the largest binary unit it reaches (past 100,000 of
    it, rounded up to six significant digits: a bucket advised this way is never below the one
    computed)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            q = n / size
            if q < 1e5:
                return f"{math.ceil(q * 10) / 10:g} {unit}"
            step = 10.0 ** (math.floor(math.log10(q)) - 5)
            digits = math.ceil(q / step)
            while float(f"{digits * step:.6g}") * size < n:  # read back as bytes, it fell below: one more
                digits += 1
            return f"{digits * step:.6g} {unit}"
    return f"{math.ceil(n)} bytes"


def format_seconds(seconds: float) -> str:
    """A duration rounded to whole seconds under two minutes, whole minutes under two hours, else
    tenths of hours."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


#: ``callback(stage, done, total)``: ``stage`` names the phase, ``done`` of ``total`` units in it.
Callback = Callable[[str, int, int], None]

_listener: ContextVar[Callback | None] = ContextVar("gpuknap_progress", default=None)


@contextmanager
def reporting(callback: Callback) -> Iterator[None]:
    """Send progress reports to ``callback`` inside the ``with`` block."""
    token = _listener.set(callback)
    try:
        yield
    finally:
        _listener.reset(token)


def listening() -> Callback | None:
    """The callback :func:`report` calls now, if any (a caller that installs its own, to pass
    reports on in other terms, keeps this one to call)."""
    return _listener.get()


def report(stage: str, done: int, total: int) -> None:
    """Tell the listener, if any, that ``done`` of ``total`` units of ``stage`` are done."""
    callback = _listener.get()
    if callback is not None:
        callback(stage, done, total)
