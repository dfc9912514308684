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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class Segment:
    """Rows ``start:stop`` of a level apply the options ``weights``/``times``."""

    start: int
    stop: int
    weights: np.ndarray
    times: np.ndarray


def pass_level(xp: Any, prev: Any, parent: Any, width: int, segments: Sequence[Segment]) -> Any:
    """One layer step for every row of a level (plain xp code).

    ``prev`` is ``[rows_prev, width_prev]`` with ``width_prev >= width``;
    ``parent`` an index array into its rows, or ``None`` for the identity.
    Returns a new ``[len(parent), width]`` float64 array.
    """
    gathered = prev[:, :width] if parent is None else prev[parent, :width]
    out = xp.full(gathered.shape, xp.inf, dtype=xp.float64)
    for seg in segments:
        src = gathered[seg.start:seg.stop]
        dst = out[seg.start:seg.stop]
        for w, t in zip(seg.weights.tolist(), seg.times.tolist()):
            if w >= width:
                continue
            tail = dst[:, w:]
            xp.minimum(tail, src[:, : width - w] + t, out=tail)
    return out


def option_tables(segments: Sequence[Segment], rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row option tables ``weights [rows, O]`` (int32) and ``times [rows, O]``.

    Rows with fewer options are padded with inert options (weight 0, time inf).
    """
    width = max((len(s.weights) for s in segments), default=1)
    weights = np.zeros((rows, width), dtype=np.int32)
    times = np.full((rows, width), np.inf, dtype=np.float64)
    for seg in segments:
        n = len(seg.weights)
        weights[seg.start:seg.stop, :n] = np.minimum(seg.weights, np.iinfo(np.int32).max)
        times[seg.start:seg.stop, :n] = seg.times
    return weights, times
