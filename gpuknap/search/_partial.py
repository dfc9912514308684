"""Bounds of partial splits for the simulated score's branch and bound (:mod:`._simulated`).

A partial split (stages 0..s-1 placed) carries the largest of its own terms of
the path bounds (:mod:`._critical`) by what multiplies the sum of the stage
times still to come (0, 1 or 2), its largest forward and backward times (for
the bumps of later stages), and up to ``CHAINS`` open "over the top, then up
again through m stages" terms of its latest stages.  What the stages still to
place can add is bounded below by two dynamic programs over the table: the
least sum of the remaining stage times, and the least largest term of the
remaining stages, kept for a grid of "largest backward time placed" values.
"""
from __future__ import annotations

import math
from functools import reduce

import numpy as np

from ..schedule import bound_iteration_times
from ._critical import stage_parts, stage_terms, terms_of
from ._segments import SegmentTable

#: Open "up again through m stages" terms a partial split keeps.
CHAINS = 4
#: Points of the grid of "largest backward time placed" for the remaining stages' bound.
GRID = 48
#: Points of that grid at first (a search that runs long refines it to ``GRID``).
FIRST_GRID = 6


def _distinct(values: np.ndarray) -> np.ndarray:
    """The least of each run of values that differ only by rounding (the same backward time
    summed at other positions), ascending: a grid point at the least of a run bounds every
    value of the run from below."""
    values = np.unique(values)
    if len(values) < 2:
        return values
    new = np.concatenate(([True], values[1:] > values[:-1] + 1e-9 * np.abs(values[:-1]) + 1e-12))
    return values[new]


class _Slot:
    """A child's per-chain field: its parent's row with slot ``k`` replaced by ``value``
    (``[N, width]`` per parent and child, one number for all, or None: the parent's own).
    Indexed by ``[parent, j]`` as the ``[N, width, CHAINS]`` array it stands for (that
    array is never built: every child shares its parent's other slots)."""

    def __init__(self, rows: np.ndarray, k: int, value):
        self.rows, self.k, self.value = rows, k, value

    def __getitem__(self, index: tuple) -> np.ndarray:
        parent, j = index
        out = self.rows[parent]
        if self.value is not None:
            out[:, self.k] = self.value[parent, j] if isinstance(self.value, np.ndarray) else self.value
        return out


class Bounds:
    """The bounds of partial splits on one table: each segment's time ``t`` and forward
    time in ``[f_low, f_high]``, and the two dynamic programs over what is left."""

    def __init__(self, T: SegmentTable, m: int, forward_low: np.ndarray, forward_high: np.ndarray):
        self.T, self.m = T, m
        self.fl = T.pull(forward_low, 0.0) - forward_low[:, None]  # [a, j]: least forward of layers a:a+1+j
        self.fh = T.pull(forward_high, 0.0) - forward_high[:, None]
        self._stages()
        self.refine(FIRST_GRID)

    def refine(self, points: int, splits: np.ndarray | None = None) -> None:
        """Keep the remaining stages' bound for a grid of ``points`` values (and 0), and the
        "largest backward time placed" of every prefix of ``splits`` (complete splits)."""
        self.grid = self._grid(points)
        if splits is not None and len(splits):
            t, _, fh = self.times(splits)
            running = np.maximum.accumulate(t - fh, axis=1)
            self.grid = _distinct(np.concatenate((self.grid, running[np.isfinite(running)])))
        self._programs()

    def _grid(self, points: int) -> np.ndarray:
        """The values of "largest backward time placed" the remaining stages' bound is kept for:
        the backward times of the segments no longer than twice an even share of the layers'
        fastest time (the ones splits near the best use), at most ``points`` of them, and 0.
        A partial split's value is rounded down to the grid (a lower bound), so a value that
        partial splits near the best hold exactly bounds them best."""
        T = self.T
        back = T.band - self.fh[None]
        finite = np.isfinite(back)
        short = finite & (T.band <= 2.0 * self._share())
        values = _distinct(back[short if short.any() else finite])
        if len(values) > points:
            values = values[np.linspace(0, len(values) - 1, points).round().astype(np.int64)]
        return np.unique(np.concatenate(([0.0], values)))

    def _share(self) -> float:
        """An even share of the split: the least sum of stage times over the stages."""
        first = self.rest[0, 0]
        return float(first) / self.T.p if math.isfinite(first) else math.inf

    def _stages(self) -> None:
        """What the remaining stages' bound needs whatever its grid: the least sum of the
        remaining stage times (``rest``), and per stage the layers it can start at with the
        terms of its segments there before the backward bump."""
        T, p = self.T, self.T.p
        rest = np.full((p + 1, T.n1), math.inf)
        rest[p, T.n1 - 1] = 0.0
        for s in range(p - 1, -1, -1):
            rest[s] = (T.band[s] + T.pull(rest[s + 1], math.inf)).min(axis=1)
        reach = np.zeros((p + 1, T.n1), dtype=bool)  # the first layers stage s can start at
        reach[0, 0] = True
        for s in range(p):
            a = np.flatnonzero(reach[s])
            reach[s + 1, T.ends[a][np.isfinite(T.band[s][a]) & T.valid[a]]] = True
        self.rest, self._per_stage = rest, []
        for s in range(p):
            a = np.flatnonzero(reach[s] & np.isfinite(rest[s]))
            t, fl, fh, ends, valid = T.band[s][a], self.fl[a], self.fh[a], T.ends[a], T.valid[a]
            after = np.where(valid, rest[s + 1][ends], math.inf)
            dead = ~np.isfinite(t) | ~np.isfinite(after)
            with np.errstate(invalid="ignore"):
                parts = stage_parts(s, p, self.m, t, fl, fh)
            self._per_stage.append((a, t, t - fh, ends, valid, after, dead, parts))

    def _programs(self) -> None:
        T, p = self.T, self.T.p
        worst = np.full((len(self.grid), p + 1, T.n1), math.inf)  # inf where no partial split starts
        worst[:, p, T.n1 - 1] = -math.inf
        q = self.grid[:, None, None]
        for s in range(p - 1, -1, -1):
            a, t, back, ends, valid, after, dead, parts = self._per_stage[s]
            with np.errstate(invalid="ignore"):
                h0, h1, h2 = terms_of(parts, q)  # nothing placed before: no forward bump
                # the later stages see this stage's backward time among the largest before them
                lifted = np.searchsorted(self.grid, np.maximum(q, back[None]), side="right") - 1
                later = np.where(valid[None], worst[lifted, s + 1, ends[None]], math.inf)
                value = np.maximum(np.maximum(t + later, h0), np.maximum(h1 + after, h2 + 2 * after))
                value[:, dead] = math.inf
                worst[:, s, a] = reduce(np.minimum, value.transpose(2, 0, 1)) if value.shape[2] <= 8 \
                    else value.min(axis=2)  # (a min over a short axis is slow)
        self.worst = worst

    def start(self) -> dict:
        zero, none = np.zeros(1), np.full((1, CHAINS), -math.inf)
        return {"a": np.zeros(1, dtype=np.int64), "pre": zero, "fmax": zero, "bmax": zero, "h0": zero - math.inf,
                "h1": zero - math.inf, "h2": zero - math.inf, "zb": none, "zr": none, "zc": np.zeros((1, CHAINS)),
                "zl": np.zeros((1, CHAINS), dtype=np.int64), "counts": np.zeros((1, 0), dtype=np.int32)}

    #: The fields of a partial split's state that :meth:`expand` reads (with the stage placed next).
    STATE = ("a", "pre", "fmax", "bmax", "h0", "h1", "h2", "zb", "zr", "zc", "zl")
    #: Fields with one column per open chain (the others have one column).
    CHAINED = ("zb", "zr", "zc", "zl")
    #: The columns of each ``STATE`` field in :meth:`rows`, in order.
    SPANS = {k: slice(i, i + 1) for i, k in enumerate(STATE[:7])}
    SPANS.update({k: slice(7 + i * CHAINS, 7 + (i + 1) * CHAINS) for i, k in enumerate(CHAINED)})

    @staticmethod
    def order(st: dict) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``(same, lower)`` per partial split of ``st`` (all with the same stages placed)
        such that where A's ``same`` row equals B's and A's ``lower`` row is at most B's in
        every column, :meth:`expand` gives A's every child a bound at most that of B's child
        on the same layers, and A's child and B's child are in the same relation again.

        ``same``: the layer reached and the open chains' remaining lengths ``zl``;
        ``lower``: the stage times summed, the largest forward and backward times, the
        largest terms ``h0, h1, h2``, and per chain ``zb``, ``zr`` and ``zr - zl zc``.

        Why: with the same layer reached, the next stage's time ``t`` and forward range are
        the same; its terms grow with the largest forward and backward times before it
        (the bumps); each new field is a sum or maximum of fields and these terms, so it
        keeps the order, and so does the bound (the sums and maxima of the fields, and
        the remaining stages' bound, looked up at the largest backward time rounded down
        to the grid, which grows with it: a larger value placed makes every later bump
        larger).  A chain's value ``i`` stages on is ``zr + 2 (t_1 + ... + t_i) - i zc``
        for ``i <= zl``: linear in i, so at most B's for every such i when it is at both
        ends (``zr`` and ``zr - zl zc``); one stage on, the same holds for ``zl - 1``.  A
        chain opened by the stage placed starts at ``pre + (m - w) t + w c`` with
        ``c`` growing with the largest backward time, and its ends ``i = 0`` and
        ``i = w - 1`` grow with ``pre`` and ``c``, so the new chains keep the order too."""
        return Bounds.order_rows(Bounds.rows(st))

    @staticmethod
    def rows(st: dict) -> np.ndarray:
        """The ``STATE`` fields of the partial splits ``st`` as one float row each (the counts
        ``a`` and ``zl`` are small integers: exact as floats)."""
        n = len(st["a"])
        return np.concatenate([np.asarray(st[k], dtype=np.float64).reshape(n, -1) for k in Bounds.STATE], axis=1)

    @staticmethod
    def fields(rows: np.ndarray) -> dict:
        """:meth:`rows` back to the ``STATE`` fields."""
        span = Bounds.SPANS
        out = {k: rows[:, span[k]] if k in Bounds.CHAINED else rows[:, span[k].start] for k in Bounds.STATE}
        out["a"] = out["a"].astype(np.int64)
        out["zl"] = out["zl"].astype(np.int64)
        return out

    @staticmethod
    def order_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`order` on :meth:`rows`."""
        span = Bounds.SPANS
        zr, zc, zl = rows[:, span["zr"]], rows[:, span["zc"]], rows[:, span["zl"]]
        same = np.concatenate((rows[:, span["a"]], zl), axis=1)
        # pre, fmax, bmax, h0, h1, h2, zb and zr: the columns between "pre" and "zr" in STATE
        return same, np.concatenate((rows[:, span["pre"].start:span["zr"].stop], zr - zl * zc), axis=1)

    def expand(self, s: int, st: dict) -> tuple[np.ndarray, dict]:
        """Every child of the partial splits ``st`` (stages 0..s-1 placed) taking stage s:
        their bounds ``[N, width]`` (``inf`` where none) and their states.

        Besides the largest term of each kind, a partial split keeps up to ``CHAINS`` open
        "over the top, then up again through m stages" terms of its latest stages (m grows
        with every stage placed after them; the oldest is folded into the other terms)."""
        T, a, m = self.T, st["a"], self.m
        t, fl, fh = T.band[s][a], self.fl[a], self.fh[a]
        end = a[:, None] + 1 + np.arange(T.width)[None, :]
        at = np.minimum(end, T.n1 - 1)
        pre = st["pre"][:, None]
        w = min(T.p - 1 - s, m)
        with np.errstate(invalid="ignore"):
            h0, h1, h2 = stage_terms(s, T.p, m, t, fl, fh, st["fmax"][:, None], st["bmax"][:, None])
            new = {"a": end, "pre": pre + t, "fmax": np.maximum(st["fmax"][:, None], fl),
                   "bmax": np.maximum(st["bmax"][:, None], t - fh),
                   "h0": np.maximum(st["h0"][:, None], pre + h0),
                   "h1": np.maximum(st["h1"][:, None] + t, pre + h1),
                   "h2": np.maximum(st["h2"][:, None] + 2 * t, pre + h2)}
            tt = t[:, :, None]
            live = (st["zl"] > 0)[:, None, :]
            zr = np.where(live, st["zr"][:, None, :] + 2 * tt - st["zc"][:, None, :], -math.inf)
            zb = np.maximum(st["zb"][:, None, :] + tt, zr)
            zl = np.maximum(st["zl"] - 1, 0)  # per parent: the same for every child but in slot k
            k = s % CHAINS  # the slot of this stage's chain: fold the chain it held
            new["h1"] = np.maximum(new["h1"], zb[:, :, k])
            if s < T.p - 1 and m - w >= 2 and w >= 2:
                c = (t - fh) + np.maximum(0.0, st["bmax"][:, None] - (t - fl))
                zr[:, :, k] = pre + (m - w) * t + w * c
                zb[:, :, k] = zr[:, :, k]
                new["zc"], new["zl"] = _Slot(st["zc"], k, c), _Slot(zl, k, w - 1)
            else:
                zr[:, :, k], zb[:, :, k] = -math.inf, -math.inf
                new["zc"], new["zl"] = _Slot(st["zc"], k, None), _Slot(zl, k, 0)
            new.update(zb=zb, zr=zr)
            h1_all = reduce(np.maximum, [zb[:, :, i] for i in range(CHAINS)], new["h1"])  # (a max over a short axis is slow)
            rest = self.rest[s + 1][at]
            g = np.maximum(np.searchsorted(self.grid, new["bmax"], side="right") - 1, 0)
            bound = np.maximum.reduce([new["h0"], h1_all + rest, new["h2"] + 2 * rest,
                                       new["pre"] + self.worst[g, s + 1, at]])
        bound[~np.isfinite(t) | (end >= T.n1) | np.isnan(bound)] = math.inf
        return bound, new

    @staticmethod
    def take(st: dict, new: dict, parent: np.ndarray, j: np.ndarray) -> dict:
        out = {k: v[parent, j] for k, v in new.items()}
        out["counts"] = np.concatenate((st["counts"][parent], (j + 1)[:, None].astype(np.int32)), axis=1)
        return out

    def times(self, splits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stage times, least and most forward times of complete splits ``[N, P]``."""
        starts = np.cumsum(splits, axis=1) - splits
        stage = np.arange(self.T.p)[None, :]
        return self.T.band[stage, starts, splits - 1], self.fl[starts, splits - 1], self.fh[starts, splits - 1]

    def simulate(self, splits: np.ndarray, times: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)`` simulated times of complete splits, each stage's forward time taken
        least and most (equal where the options of a kind share their forward time);
        ``times``: their :meth:`times`, when known."""
        t, fl, fh = self.times(splits) if times is None else times
        high = bound_iteration_times(fh[:, :, None], (t - fl)[:, :, None], self.m)
        if np.array_equal(fl, fh):
            return high, high
        return bound_iteration_times(fl[:, :, None], (t - fh)[:, :, None], self.m), high
