"""Exact sums of segment times: every time (a float) is an integer times a power of two,
so sums are integers in units of the smallest power.  They can exceed 64 bits (a time of
4.3 has 50 fractional bits, a sum of 64 stages of 1000 reaches 2**66), so tables hold them
as two int64 limbs, ``hi * 2**40 + lo``, added with a carry and compared limb by limb:
exact, and a few times the cost of plain int64 instead of Python integers in object arrays.
"""
from __future__ import annotations

import numpy as np

from ._segments import SegmentTable

LIMB = 40
MASK = (1 << LIMB) - 1


class Wide:
    """Exact non-negative integers ``hi * 2**LIMB + lo`` in two arrays; ``hi >= inf_hi`` is infinity.

    With values beyond what two int64 limbs hold, ``hi`` is an object array of
    Python integers: slower, still exact.
    """

    __slots__ = ("hi", "lo", "inf_hi")

    def __init__(self, hi: np.ndarray, lo: np.ndarray, inf_hi: int):
        self.hi, self.lo, self.inf_hi = hi, lo, inf_hi

    @classmethod
    def infinite(cls, shape: tuple, like: "Wide") -> "Wide":
        return cls(np.full(shape, like.inf_hi, dtype=like.hi.dtype), np.zeros(shape, dtype=np.int64), like.inf_hi)

    def __getitem__(self, key) -> "Wide":
        return Wide(self.hi[key], self.lo[key], self.inf_hi)

    def __setitem__(self, key, value: "Wide") -> None:
        self.hi[key], self.lo[key] = value.hi, value.lo

    def __add__(self, other: "Wide") -> "Wide":
        lo = self.lo + other.lo
        hi = self.hi + other.hi + (lo >> LIMB)
        out = Wide(hi, lo & MASK, self.inf_hi)
        return out.clamp()

    def clamp(self) -> "Wide":
        """Every infinite entry as the one infinity (so sums of infinities stay in range)."""
        over = self.hi >= self.inf_hi
        if over.any():
            self.hi = np.where(over, self.inf_hi, self.hi)
            self.lo = np.where(over, 0, self.lo)
        return self

    def where(self, cond: np.ndarray) -> "Wide":
        """This value where ``cond``, infinity elsewhere."""
        return Wide(np.where(cond, self.hi, self.inf_hi), np.where(cond, self.lo, 0), self.inf_hi)

    def pull(self, table: SegmentTable) -> "Wide":
        """``self[a + 1 + j]`` per band cell ``(a, j)``, infinity past the last layer."""
        return Wide(table.pull(self.hi, self.inf_hi), table.pull(self.lo, 0), self.inf_hi)

    def min_rows(self) -> "Wide":
        """The least value of each row (last axis)."""
        hi = self.hi.min(axis=-1)
        lo = np.where(self.hi == hi[..., None], self.lo, MASK + 1).min(axis=-1)
        return Wide(hi, lo, self.inf_hi)

    def minimum(self, other: "Wide") -> "Wide":
        mine = (self.hi < other.hi) | ((self.hi == other.hi) & (self.lo <= other.lo))
        return Wide(np.where(mine, self.hi, other.hi), np.where(mine, self.lo, other.lo), self.inf_hi)

    def value(self, *index) -> int | None:
        """The entry as a Python integer, None for infinity."""
        hi = int(self.hi[index])
        return None if hi >= self.inf_hi else (hi << LIMB) + int(self.lo[index])


class ExactTimes:
    """Segment times as exact integers in units of ``1 / scale`` (a power of two)."""

    def __init__(self, T: SegmentTable):
        finite = np.isfinite(T.band)
        values = np.unique(T.band[finite])
        ratios = [v.as_integer_ratio() for v in values.tolist()]
        self.scale = max((d for _, d in ratios), default=1)
        ints = [n * (self.scale // d) for n, d in ratios]
        top = (T.p + 1) * (max(ints, default=0) + 1)  # above any sum of stage times
        if top < 1 << (LIMB + 60):
            inf_hi, hi_dtype = 1 << 61, np.int64
            his = np.array([v >> LIMB for v in ints], dtype=np.int64)
            los = np.array([v & MASK for v in ints], dtype=np.int64)
        else:  # times spanning hundreds of binary orders of magnitude: the high limb a Python integer
            inf_hi, hi_dtype = (4 * top >> LIMB) + 1, object
            his = np.array([v >> LIMB for v in ints] + [0], dtype=object)[:-1]
            los = np.array([v & MASK for v in ints], dtype=np.int64)
        where = np.searchsorted(values, T.band[finite])
        self.band = Wide(np.full(T.band.shape, inf_hi, dtype=hi_dtype), np.zeros(T.band.shape, dtype=np.int64),
                         inf_hi)
        self.band.hi[finite], self.band.lo[finite] = his[where], los[where]

    def value(self, x: float) -> int:
        n, d = x.as_integer_ratio()
        return n * (self.scale // d)

    def to_float(self, n: int) -> float:
        return int(n) / self.scale  # int / int is correctly rounded
