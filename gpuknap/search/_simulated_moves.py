"""Moves of one split while its simulated time falls, for the simulated score's search
(:mod:`._simulated`): one boundary at a time from the beam's best (:func:`_improve`), or one
layer from any stage to any other from the best split found (:func:`_transfers`).  Every
split reached is simulated with the bounds' times; rows whose quick lower bound already
reaches the time to beat are not simulated."""
from __future__ import annotations

from typing import Any

import numpy as np

from ._critical import split_bounds
from ._partial import Bounds

#: Fewest rows of layer moves that are bounded before they are simulated.
FILTER_ROWS = 256


def _improve(B: Bounds, split: np.ndarray, low: float, value: float,
             rounds: int = 200) -> tuple[np.ndarray, float, float]:
    """Move one boundary by one layer while the simulated time falls: the split reached with
    its ``(low, high)`` times (``split``'s own are ``low``, ``value``)."""
    p = B.T.p
    for _ in range(rounds):
        moves = []
        for i in range(p - 1):
            for d in (1, -1):
                row = split.copy()
                row[i] -= d
                row[i + 1] += d
                if row[i] >= 1 and row[i + 1] >= 1:
                    moves.append(row)
        if not moves:
            break
        step = _better(B, np.array(moves), value)
        if step is None:
            break
        split, low, value = step
    return split, low, value


def _better(B: Bounds, rows: np.ndarray, value: float) -> tuple[np.ndarray, float, float] | None:
    """The split of ``rows`` (stages of at least one layer, within the table, every stage
    finite) that simulates fastest, with its ``(low, high)`` times, if its high time is below
    ``value``; else None.
    Rows whose quick lower bound is already at ``value`` are not simulated (the answer is
    the same: their simulated times are at least ``value``)."""
    rows = rows[(rows >= 1).all(axis=1) & (rows <= B.T.width).all(axis=1)]
    if len(rows):
        t, fl, fh = B.times(rows)
        keep = np.isfinite(t).all(axis=1)
        rows, t, fl, fh = rows[keep], t[keep], fl[keep], fh[keep]
        if len(rows) > FILTER_ROWS:  # (on fewer rows the filter costs more than it saves)
            keep = split_bounds(t, fl, fh, B.m, chains=False) < value
            rows, t, fl, fh = rows[keep], t[keep], fl[keep], fh[keep]
    if not len(rows):
        return None
    low, high = B.simulate(rows, (t, fl, fh))
    best = int(np.argmin(high))
    return (rows[best], float(low[best]), float(high[best])) if high[best] < value else None


def _transfers(B: Bounds, found: Any, rounds: int = 50) -> tuple[np.ndarray, tuple]:
    """From the best split found, move one layer from any stage to any other while the
    simulated time falls; every split reached, with their ``(low, high)`` times."""
    splits = np.concatenate([part[0] for part in found.parts])
    high = np.concatenate([part[2] for part in found.parts])
    if not len(splits):
        return splits, (np.empty(0), np.empty(0))
    split, value = splits[int(np.argmin(high))].copy(), float(high.min())
    p = B.T.p
    give, take = np.nonzero(~np.eye(p, dtype=bool))
    reached, lows, highs = [], [], []
    for _ in range(rounds):
        rows = np.repeat(split[None, :], len(give), axis=0)
        rows[np.arange(len(give)), give] -= 1
        rows[np.arange(len(give)), take] += 1
        step = _better(B, rows, value)
        if step is None:
            break
        split, low, value = step
        reached.append(split)
        lows.append(low)
        highs.append(value)
    return np.array(reached, dtype=np.int64).reshape(-1, p), (np.array(lows), np.array(highs))
