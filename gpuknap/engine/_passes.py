"""The min-plus pass: one layer step of the bucketed knapsack DP over many rows.

Written once against an array module ``xp`` (NumPy or CuPy).  Row ``r`` of a
level reads row ``parent[r]`` of the previous level and applies the options
of its own step::

    out[r, c] = min over options o of  prev[parent[r], c - w[o]] + t[o]

(cells with ``c - w[o] < 0`` take no value from ``o``; no option: ``inf``).
Each cell is one addition per option followed by an exact ``min``, so any
implementation that performs the same additions (the CuPy kernel in
``_kernels``) gives bit-identical results.

Rows are grouped in *segments*, contiguous row ranges that share one step
(one kind at one in-flight count), so the plain xp code shifts whole blocks.

:func:`pass_level_xp` is that plain code, the reference every other pass is
tested against.  :func:`pass_level`, what the single-stage solvers call, is
the same pass on NumPy arrays, handed to the fused CPU pass (:mod:`._cpu`)
once the backend has loaded it, for levels large enough to pay for the call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class Segment:
    """Rows ``start:stop`` of a level apply the options ``weights``/``times``.

    ``source``: when these rows' parents are consecutive rows of the previous
    level, the first of them (the pass then reads a view, no gather); else -1.
    """

    start: int
    stop: int
    weights: np.ndarray
    times: np.ndarray
    source: int = -1


#: The fused CPU pass's module, set by the backend once it has loaded and checked it.
FUSED: Any = None
#: Least work (cells x options) of a level :func:`pass_level` hands to the fused pass.
FUSED_WORK = 1 << 16


def pass_level(xp: Any, prev: Any, parent: Any, width: int, segments: Sequence[Segment]) -> Any:
    """One layer step for every row of a level: :func:`pass_level_xp`, or on NumPy arrays
    the fused CPU pass once loaded (bit-identical) when the level is large enough."""
    if FUSED is not None and xp is np:
        rows = prev.shape[0] if parent is None else len(parent)
        if rows * width * max((len(seg.weights) for seg in segments), default=0) >= FUSED_WORK:
            return FUSED.pass_level(prev, parent, _Level(width, segments))
    return pass_level_xp(xp, prev, parent, width, segments)


@dataclass(frozen=True)
class _Level:
    width: int
    segments: Sequence[Segment]


def pass_level_xp(xp: Any, prev: Any, parent: Any, width: int, segments: Sequence[Segment]) -> Any:
    """One layer step for every row of a level (plain xp code).

    ``prev`` is ``[rows_prev, width_prev]`` with ``width_prev >= width``;
    ``parent`` an index array into its rows, or ``None`` for the identity.
    Returns a new ``[len(parent), width]`` float64 array.
    """
    rows = prev.shape[0] if parent is None else len(parent)
    out = xp.empty((rows, width), dtype=xp.float64)
    whole = None
    if parent is None or not all(seg.source >= 0 for seg in segments):
        whole = _gather(xp, prev, parent, width, view_only=True)
    scratch = None
    for seg in segments:
        if whole is not None:
            src = whole[seg.start:seg.stop]
        elif seg.source >= 0:  # consecutive parents: a view of the previous level
            src = prev[seg.source:seg.source + seg.stop - seg.start, :width]
        else:  # only this segment's rows are gathered
            src = prev[parent[seg.start:seg.stop], :width]
        dst = out[seg.start:seg.stop]
        filled = False
        for w, t in zip(seg.weights.tolist(), seg.times.tolist()):
            if w >= width:
                continue
            if not filled:  # first option: write the shifted row, inf below its weight
                dst[:, :w] = xp.inf
                xp.add(src[:, : width - w], t, out=dst[:, w:])
                filled = True
                continue
            if scratch is None:
                scratch = xp.empty((max(s.stop - s.start for s in segments), width), dtype=xp.float64)
            tmp = scratch[: seg.stop - seg.start, : width - w]
            xp.add(src[:, : width - w], t, out=tmp)
            xp.minimum(dst[:, w:], tmp, out=dst[:, w:])
        if not filled:
            dst[...] = xp.inf
    return out


def _gather(xp: Any, prev: Any, parent: Any, width: int, view_only: bool = False) -> Any:
    """``prev[parent, :width]``, as a view when the parents are rows 0..R-1 in order
    (with ``view_only``, None instead of a copy otherwise)."""
    if parent is None:
        return prev[:, :width]
    rows = len(parent)
    if rows <= prev.shape[0] and (rows == 0 or (int(parent[0]) == 0 and int(parent[-1]) == rows - 1
                                                and bool((parent[1:] - parent[:-1] == 1).all()))):
        return prev[:rows, :width]
    return None if view_only else prev[parent, :width]


def pass_level_tables(xp: Any, prev: Any, parent: Any, weights: Any, times: Any, width: int) -> Any:
    """The same pass as :func:`pass_level_xp`, reading per-row option tables.

    ``weights``/``times`` are ``[rows, O]`` (see :func:`option_tables`); this is
    the plain-xp twin of the CUDA kernel, used to test the table path anywhere.
    """
    src = _gather(xp, prev, parent, width)
    cols = xp.arange(width, dtype=xp.int64)[None, :]
    out = xp.full(src.shape, xp.inf, dtype=xp.float64)
    for o in range(weights.shape[1]):
        idx = cols - weights[:, o:o + 1].astype(xp.int64)
        vals = xp.take_along_axis(src, xp.maximum(idx, 0), axis=1) + times[:, o:o + 1]
        out = xp.where(idx >= 0, xp.minimum(out, vals), out)
    return out


#: Widest row the option tables serve: their weights are 32-bit, so a weight clamped to this
#: must still be over every bucket of the row (wider rows are refused before any pass).
MAX_TABLE_WIDTH = int(np.iinfo(np.int32).max)


def option_tables(segments: Sequence[Segment], rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row option tables ``weights [rows, O]`` (int32) and ``times [rows, O]``.

    Rows with fewer options are padded with inert options (weight 0, time inf).
    Weights over :data:`MAX_TABLE_WIDTH` are clamped to it (they fit no row).
    """
    width = max((len(s.weights) for s in segments), default=1)
    weights = np.zeros((rows, width), dtype=np.int32)
    times = np.full((rows, width), np.inf, dtype=np.float64)
    for seg in segments:
        n = len(seg.weights)
        weights[seg.start:seg.stop, :n] = np.minimum(seg.weights, MAX_TABLE_WIDTH)
        times[seg.start:seg.stop, :n] = seg.times
    return weights, times
