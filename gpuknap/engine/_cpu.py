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

Where options all reach a cell, four of them are taken per read and write of
the tile.  Jobs of one level, ``(row, tile)`` pairs, run on Numba's threads
in small dynamic chunks; levels too small to pay for a parallel launch (or,
while other processes keep every core busy, for a thread held up by the
system) run on one thread.  A chunk's levels run in one compiled call per
group of levels (progress is reported between groups), writing to two
buffers in turn, so no level allocates memory.  Calls are serialised by a
lock (Numba's workqueue layer must not be entered twice at once).

Numba is imported here only, and this module only by :mod:`._backend` when the
backend is chosen: ``import gpuknap`` never imports Numba.
"""
from __future__ import annotations

import ctypes
import os
import site
import sys
import threading
from typing import Any, Callable

import numpy as np


def _find_tbb() -> None:
    """Make a pip-installed TBB (the ``jit`` extra installs it) visible to Numba.

    Numba prefers its TBB threading layer, which stays fast when the machine
    has more busy threads than cores (GNU OpenMP, its next choice, spins and
    slows down severalfold there), but it looks the library up by name only,
    and pip puts it in ``<prefix>/lib``, outside the loader's path.  Loading it
    from there first lets Numba's own choice find it; nothing else changes.
    """
    name = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib", "win32": "tbb12.dll"}.get(sys.platform)
    if name is None or os.environ.get("NUMBA_THREADING_LAYER", "default") not in ("default", "tbb", "safe",
                                                                                 "threadsafe", "forksafe"):
        return
    try:
        ctypes.CDLL(name)
        return  # on the loader's path already
    except OSError:
        pass
    for base in dict.fromkeys([sys.prefix, sys.base_prefix, getattr(site, "USER_BASE", None) or ""]):
        for folder in ("lib", "Library/bin" if sys.platform == "win32" else "lib"):
            path = os.path.join(base, folder, name)
            if base and os.path.exists(path):
                try:
                    ctypes.CDLL(path, mode=getattr(ctypes, "RTLD_GLOBAL", 0))
                    return
                except OSError:
                    continue


_find_tbb()

import numba  # noqa: E402 - after the TBB library is found

#: Cells of one tile: 2,048 doubles (16 KiB) stay in a 32-48 KiB L1 data cache
#: beside the previous level's cells they are computed from.
TILE = 2048
#: Least work (cells x options) of a level that runs on several threads.
PARALLEL_WORK = 1 << 19
#: The same when the machine's cores are busy with other processes (load average at
#: least the cores): a parallel level then waits for whichever thread the operating
#: system holds up, so only levels long enough to amortise that run on threads.
#: Measured on the 2-core VM with one core busy, the sweep's levels (4 rows x 58k
#: buckets) ran 1.6x slower on two threads than on one at 2**19, as fast at 2**22.
BUSY_PARALLEL_WORK = 1 << 24
#: Jobs (row, tile) a thread takes at a time in a parallel level: small, so that a thread
#: the operating system holds up (a busy machine) leaves its share to the others.
CHUNK_JOBS = 4
#: Work (cells x options) after which a group of levels ends (and progress is reported).
GROUP_WORK = 1 << 27

#: Numba's workqueue layer must not be entered by two threads at once.
_LOCK = threading.Lock()


@numba.njit(nogil=True, boundscheck=False, cache=True)
def _add_min(prev, src, w, t, out, dst, lo, hi):  # pragma: no cover - compiled
    """``out[dst + c] = min(out[dst + c], prev[src + c - w] + t)`` for ``lo <= c < hi``."""
    a = prev[src + lo - w:src + hi - w]
    b = out[dst + lo:dst + hi]
    for i in range(hi - lo):
        v = a[i] + t
        cur = b[i]
        b[i] = v if v < cur else cur


@numba.njit(nogil=True, boundscheck=False, cache=True)
def _tile(prev, src, weights, times, o0, o1, out, dst, c0, c1):  # pragma: no cover - compiled
    """Cells ``c0:c1`` of one row from options ``o0:o1``: the first option that reaches
    the tile writes it (``inf`` below its weight), the others take minima, four options
    at a time where they all reach a cell (one read and write of the tile per four)."""
    o = o0
    while o < o1:
        w = weights[o]
        o += 1
        if w < c1:
            t = times[o - 1]
            lo = max(c0, w)
            out[dst + c0:dst + lo] = np.inf
            a = prev[src + lo - w:src + c1 - w]
            b = out[dst + lo:dst + c1]
            for i in range(c1 - lo):
                b[i] = a[i] + t
            break
    else:
        out[dst + c0:dst + c1] = np.inf
        return
    while o + 4 <= o1:
        w0, w1, w2, w3 = weights[o], weights[o + 1], weights[o + 2], weights[o + 3]
        lo = max(c0, max(max(w0, w1), max(w2, w3)))
        if lo < c1:
            t0, t1, t2, t3 = times[o], times[o + 1], times[o + 2], times[o + 3]
            a0 = prev[src + lo - w0:src + c1 - w0]
            a1 = prev[src + lo - w1:src + c1 - w1]
            a2 = prev[src + lo - w2:src + c1 - w2]
            a3 = prev[src + lo - w3:src + c1 - w3]
            b = out[dst + lo:dst + c1]
            for i in range(c1 - lo):  # the same additions; exact minima in any order (no NaN)
                x = a0[i] + t0
                y = a1[i] + t1
                x = y if y < x else x
                y = a2[i] + t2
                x = y if y < x else x
                y = a3[i] + t3
                x = y if y < x else x
                cur = b[i]
                b[i] = x if x < cur else cur
        for k in range(4):  # cells below the group's largest weight: each option on its own
            w = weights[o + k]
            if max(c0, w) < min(lo, c1):
                _add_min(prev, src, w, times[o + k], out, dst, max(c0, w), min(lo, c1))
        o += 4
    while o < o1:
        w = weights[o]
        if max(c0, w) < c1:
            _add_min(prev, src, w, times[o], out, dst, max(c0, w), c1)
        o += 1


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


def parallel_work() -> int:
    """The least work of a level run on threads, given how busy the machine is."""
    try:
        busy = os.getloadavg()[0] >= (os.cpu_count() or 1) - 0.5
    except OSError:
        busy = False
    return BUSY_PARALLEL_WORK if busy else PARALLEL_WORK


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
    least = parallel_work()  # of a level run on threads
    first = 0
    while first < len(levels):  # groups of levels, progress reported between them
        last, done = first, 0
        while last < len(levels) and (done < GROUP_WORK or last == first):
            done += levels[last].rows * levels[last].width
            last += 1
        with _LOCK:
            chunksize = numba.set_parallel_chunksize(CHUNK_JOBS)
            try:
                _levels(buffers, first, last, *packed, values, TILE, least)
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
