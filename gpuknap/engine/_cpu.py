"""The fused min-plus pass on the CPU, compiled with Numba (private).

The plain NumPy pass (:mod:`._passes`) makes a temporary array per option and
reads and writes every cell once per option.  Here one compiled loop nest does
a whole level: for each row and each *tile* of cells (small enough to stay in
the L1 cache), the row's options are looped over the tile::

    out[c] = prev[parent, c - w0] + t0          for c >= w0 (inf below)
    out[c] = min(out[c], prev[parent, c - w] + t)   for every later option

So each cell is read from the previous level and written once (16 bytes), and
gets exactly the additions of the NumPy pass followed by exact minima.  Times
are finite or ``inf`` and never NaN (options are validated; ``inf + t`` stays
``inf``), so the minimum does not depend on the order it is taken in and the
results are bit-identical to NumPy's, which the tests check.

Jobs of one level, ``(row, tile)`` pairs, run on Numba's threads; levels too
small to pay for a parallel launch run on one thread.  A chunk's levels run in
one compiled call per group of levels (progress is reported between groups),
writing to two buffers in turn, so no level allocates memory.

Numba is imported here only, and this module only by :mod:`._backend` when the
backend is chosen: ``import gpuknap`` never imports Numba.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import numba
import numpy as np

#: Cells of one tile: 2,048 doubles (16 KiB) stay in a 32-48 KiB L1 data cache
#: beside the previous level's cells they are computed from.
TILE = 2048
#: Least work (cells x options) of a level that runs on several threads.
PARALLEL_WORK = 1 << 19
#: Jobs (row, tile) a thread takes at a time in a parallel level: small, so that a thread
#: the operating system holds up (a busy machine) leaves its share to the others.
CHUNK_JOBS = 4
#: Work (cells x options) after which a group of levels ends (and progress is reported).
GROUP_WORK = 1 << 27

#: Numba's workqueue layer must not be entered by two threads at once.
_LOCK = threading.Lock()


@numba.njit(nogil=True, boundscheck=False, cache=True)
def _tile(prev, src, weights, times, o0, o1, out, dst, c0, c1):  # pragma: no cover - compiled
    """Cells ``c0:c1`` of one row: ``out[dst + c]`` from ``prev[src + c - w] + t``."""
    filled = False
    for o in range(o0, o1):
        w = weights[o]
        if w >= c1:
            continue
        t = times[o]
        lo = max(c0, w)
        a = prev[src + lo - w:src + c1 - w]
        b = out[dst + lo:dst + c1]
        if not filled:  # the first option writes (inf below its weight)
            out[dst + c0:dst + lo] = np.inf
            for i in range(c1 - lo):
                b[i] = a[i] + t
            filled = True
        else:
            for i in range(c1 - lo):
                v = a[i] + t
                cur = b[i]
                b[i] = v if v < cur else cur
    if not filled:
        out[dst + c0:dst + c1] = np.inf


@numba.njit(nogil=True, boundscheck=False, cache=True)
def _level_serial(prev, prev_width, parent, lo, hi, weights, times, out, rows, width, tile):  # pragma: no cover
    for r in range(rows):
        for c0 in range(0, width, tile):
            _tile(prev, parent[r] * prev_width, weights, times, lo[r], hi[r], out, r * width, c0,
                  min(c0 + tile, width))


@numba.njit(nogil=True, boundscheck=False, parallel=True, cache=True)
def _level_parallel(prev, prev_width, parent, lo, hi, weights, times, out, rows, width, tile):  # pragma: no cover
    tiles = (width + tile - 1) // tile
    for job in numba.prange(rows * tiles):
        r = job // tiles
        c0 = (job - r * tiles) * tile
        _tile(prev, parent[r] * prev_width, weights, times, lo[r], hi[r], out, r * width, c0,
              min(c0 + tile, width))


@numba.njit(nogil=True, boundscheck=False, cache=True)
def _levels(buffers, first, last, widths, row_at, parents, lo, hi, weights, times, read_at, read_rows,
            read_cols, values, tile, parallel_work):  # pragma: no cover - compiled
    """Levels ``first:last`` of a chunk; level ``d`` reads ``buffers[(d + 1) % 2]`` (the
    root row, for level 0) and writes ``buffers[d % 2]``; its readouts go to ``values``.
    ``widths[d]`` is the width of the row level ``d`` reads, ``widths[d + 1]`` its own."""
    for d in range(first, last):
        prev = buffers[(d + 1) % 2]
        out = buffers[d % 2]
        width = widths[d + 1]
        r0, r1 = row_at[d], row_at[d + 1]
        rows = r1 - r0
        work = 0
        for r in range(r0, r1):
            work += hi[r] - lo[r]
        if work * width >= parallel_work:
            _level_parallel(prev, widths[d], parents[r0:r1], lo[r0:r1], hi[r0:r1], weights, times, out, rows,
                            width, tile)
        else:
            _level_serial(prev, widths[d], parents[r0:r1], lo[r0:r1], hi[r0:r1], weights, times, out, rows,
                          width, tile)
        for k in range(read_at[d], read_at[d + 1]):
            values[k] = out[read_rows[k] * width + read_cols[k]]


def pack(levels: list, root_width: int) -> tuple:
    """A chunk's levels as flat arrays for :func:`_levels`: widths (the root's first),
    where each level's rows and readouts start, the rows' parents, each row's range
    ``lo:hi`` in one list of the chunk's distinct steps' options, and the readouts."""
    n = len(levels)
    row_at = np.zeros(n + 1, dtype=np.int64)
    read_at = np.zeros(n + 1, dtype=np.int64)
    row_at[1:] = np.cumsum([lv.rows for lv in levels])
    read_at[1:] = np.cumsum([len(lv.read_ids) for lv in levels])
    option_at: dict[int, int] = {}  # id(weights of a step) -> where its options start
    weights, times = [], []
    seg_rows, seg_lo, seg_n = [], [], []
    used = 0
    for lv in levels:
        for seg in lv.segments:
            at = option_at.get(id(seg.weights))
            if at is None:
                at = option_at[id(seg.weights)] = used
                weights.append(seg.weights)
                times.append(seg.times)
                used += len(seg.weights)
            seg_rows.append(seg.stop - seg.start)
            seg_lo.append(at)
            seg_n.append(len(seg.weights))
    rows = np.asarray(seg_rows, dtype=np.int64)
    lo = np.repeat(np.asarray(seg_lo, dtype=np.int64), rows)
    hi = lo + np.repeat(np.asarray(seg_n, dtype=np.int64), rows)
    all_w = np.concatenate(weights).astype(np.int64) if weights else np.zeros(0, np.int64)
    all_t = np.concatenate(times).astype(np.float64) if times else np.zeros(0)
    widths = np.asarray([root_width] + [lv.width for lv in levels], dtype=np.int64)
    parents = np.concatenate([lv.parent for lv in levels]).astype(np.int64, copy=False)
    reads = [np.concatenate([getattr(lv, name) for lv in levels]).astype(np.int64, copy=False)
             for name in ("read_rows", "read_cols")]
    return widths, row_at, parents, lo, hi, all_w, all_t, read_at, reads[0], reads[1]


class Workspace:
    """The two level buffers, kept from one chunk to the next of a batch (no page
    faults on fresh memory for every chunk)."""

    def __init__(self) -> None:
        self._buffers = np.empty((2, 0))

    def buffers(self, cells: int) -> np.ndarray:
        if self._buffers.shape[1] < cells:
            self._buffers = np.empty((2, cells))
        return self._buffers


def run_chunk(chunk: Any, on_level: Callable[[int], None] | None = None,
              workspace: Workspace | None = None) -> np.ndarray:
    """All readouts of a chunk (as :func:`._solve.run_chunk`), fused and compiled."""
    levels = chunk.levels
    if not levels:
        return np.empty(0)
    packed = pack(levels, chunk.root_width)
    cells = max(chunk.root_width, max(lv.rows * lv.width for lv in levels))
    buffers = (workspace or Workspace()).buffers(cells)
    buffers[1, :chunk.root_width] = 0.0
    values = np.empty(int(packed[7][-1]))
    first = 0
    while first < len(levels):  # groups of levels, progress reported between them
        last, done = first, 0
        while last < len(levels) and (done < GROUP_WORK or last == first):
            done += levels[last].rows * levels[last].width
            last += 1
        with _LOCK:
            chunksize = numba.set_parallel_chunksize(CHUNK_JOBS)
            try:
                _levels(buffers, first, last, *packed, values, TILE, PARALLEL_WORK)
            finally:
                numba.set_parallel_chunksize(chunksize)
        if on_level is not None:
            on_level(done)
        first = last
    return values


def pass_level(prev: np.ndarray, parent: Any, level: Any) -> np.ndarray:
    """One level on its own (``[rows, width]``), as :func:`._passes.pass_level` returns it."""
    prev = np.ascontiguousarray(prev, dtype=np.float64)
    rows = prev.shape[0] if parent is None else len(parent)
    parent = np.arange(rows, dtype=np.int64) if parent is None else np.asarray(parent, dtype=np.int64)
    packed = pack([_Single(parent, level)], prev.shape[1])
    buffers = np.empty((2, max(prev.size, rows * level.width, 1)))
    buffers[1, :prev.size] = prev.ravel()
    with _LOCK:
        chunksize = numba.set_parallel_chunksize(CHUNK_JOBS)
        try:
            _levels(buffers, 0, 1, *packed, np.empty(0), TILE, PARALLEL_WORK)
        finally:
            numba.set_parallel_chunksize(chunksize)
    return buffers[0, :rows * level.width].reshape(rows, level.width).copy()


class _Single:
    """A level given as ``parent`` and the segments of ``level`` (for :func:`pass_level`)."""

    def __init__(self, parent: np.ndarray, level: Any):
        self.parent, self.width, self.segments = parent, level.width, level.segments
        self.read_rows = self.read_cols = self.read_ids = np.zeros(0, dtype=np.int64)

    @property
    def rows(self) -> int:
        return len(self.parent)
