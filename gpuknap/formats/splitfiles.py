"""Files of splits and scores for ``gpuknap rank``, and output paths checked before work starts.

A splits file is CSV (commas or whitespace, ``#`` comments, one split per
line) or a ``.npy`` integer array ``[B, P * chunks]``.  Errors name the file
and the line (CSV) or row (``.npy``) as a person sees them, 1-based for
lines.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ._documents import read_text

#: Largest splits file read: CSV is parsed line by line, so keep it moderate; .npy may be larger.
MAX_CSV_BYTES = 64 * 2**20
MAX_NPY_BYTES = 2 * 2**30
#: File types ``--plot`` can write.
PLOT_SUFFIXES = (".png", ".pdf", ".svg")


@dataclass(frozen=True)
class SplitsFile:
    """Layer counts ``[B, width]`` and, per row, how to name it in an error."""

    path: str
    counts: np.ndarray
    lines: tuple | None  # CSV: the 1-based file line of each row; None for .npy

    def label(self, row: int) -> str:
        """``"line 3"`` (CSV, the file's line) or ``"row 2"`` (.npy, 0-based like NumPy)."""
        return f"row {row}" if self.lines is None else f"line {self.lines[row]}"

    def where(self, row: int) -> str:
        """``"FILE: line 3"`` or ``"FILE: row 2"``, for errors."""
        return f"{self.path}: {self.label(row)}"


def _read_npy(path: str) -> np.ndarray:
    try:
        if os.path.getsize(path) > MAX_NPY_BYTES:
            raise ValueError(f"{path}: over the {MAX_NPY_BYTES // 2**30} GiB limit for a splits file")
        arr = np.load(path, allow_pickle=False, mmap_mode="r")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or 'not a .npy file'})") from None
    except (ValueError, EOFError, TypeError):
        raise ValueError(f"{path}: not a .npy array of layer counts (an integer array saved by numpy.save)") from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "iuf" or arr.ndim not in (1, 2):
        raise ValueError(f"{path}: expected a 1-D or 2-D integer array of layer counts, got "
                         f"{getattr(arr, 'ndim', '?')}-D {getattr(arr, 'dtype', type(arr).__name__)}")
    arr = np.array(arr)
    if arr.size == 0:
        raise ValueError(f"{path}: no splits in the file")
    return arr[None, :] if arr.ndim == 1 else arr


def _read_csv(path: str) -> tuple[np.ndarray, tuple]:
    text = read_text(path, MAX_CSV_BYTES)
    rows, lines = [], []
    width = first = None
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.replace(",", " ").split()
        try:
            row = [int(x) for x in fields]
        except ValueError:
            bad = next(x for x in fields if not x.lstrip("+-").isdigit())
            raise ValueError(f"{path}: line {n}: {bad[:20]!r} is not an integer layer count") from None
        if width is None:
            width, first = len(row), n
        elif len(row) != width:
            raise ValueError(f"{path}: line {n} has {len(row)} counts, line {first} has {width}; "
                             "every line must give one count per stage")
        rows.append(row)
        lines.append(n)
    if not rows:
        raise ValueError(f"{path}: no splits in the file")
    try:
        return np.array(rows, dtype=np.int64), tuple(lines)
    except OverflowError:
        at = next(i for i, r in enumerate(rows) if any(abs(x) >= 2**63 for x in r))
        raise ValueError(f"{path}: line {lines[at]}: a count is far beyond any model's layers") from None


def read_splits(path: str) -> SplitsFile:
    """The splits in a CSV or ``.npy`` file (ValueError naming the file and line)."""
    if path.endswith(".npy"):
        return SplitsFile(path, _read_npy(path), None)
    counts, lines = _read_csv(path)
    return SplitsFile(path, counts, lines)


#: Bytes ranking a splits file holds per row besides its counts: the 64-bit copy of its counts and the
#: distinct rows (8 bytes a count each, the worst case), hashes, sort and inverse indices, scores and
#: the ranking's codes (:func:`rank_bytes`).
ROW_BYTES, COUNT_BYTES = 48, 20


def rank_bytes(rows: int, counts: int) -> int:
    """Memory that ranking ``rows`` splits of ``counts`` counts each holds at its peak, about."""
    return rows * (ROW_BYTES + COUNT_BYTES * counts)


def distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct, inverse)``: the distinct rows of an integer array in the order they first
    appear, and for each row its index among them (``distinct[inverse]`` is ``rows``).  Rows are
    grouped by a 64-bit hash (one sort of integers; ``np.unique(axis=0)`` sorts rows as records,
    about 20 s for a million rows of 16 counts), and the grouping is checked against the rows
    themselves, falling back to ``np.unique(axis=0)`` should two rows share a hash."""
    rows = np.ascontiguousarray(rows)
    if rows.ndim != 2 or len(rows) == 0:
        raise ValueError(f"expected a 2-D array of rows, got shape {rows.shape}")
    weights = np.random.default_rng(0x5EED).integers(1, 2**63, rows.shape[1], dtype=np.uint64) | np.uint64(1)
    step = 1 << 16  # hashed and checked in slices: no 64-bit copy of a large file
    keys = np.empty(len(rows), dtype=np.uint64)
    for lo in range(0, len(rows), step):
        keys[lo:lo + step] = (rows[lo:lo + step].astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    del keys
    inverse = np.asarray(inverse).reshape(-1)
    if not all(np.array_equal(rows[first[inverse[lo:lo + step]]], rows[lo:lo + step])
               for lo in range(0, len(rows), step)):  # a hash shared by two different rows
        distinct, inverse = np.unique(rows, axis=0, return_inverse=True)
        first = np.unique(np.asarray(inverse).reshape(-1), return_index=True)[1]
        inverse = np.asarray(inverse).reshape(-1)
    order = np.argsort(first, kind="stable")  # in the order of first appearance
    place = np.empty_like(order)
    place[order] = np.arange(len(order))
    return rows[first[order]], place[inverse]


def check_output(path: str, flag: str, suffixes: Sequence[str] | None = None) -> None:
    """Refuse an output path that cannot be written, before any work is done."""
    if not path:
        raise ValueError(f"{flag}: empty file name")
    if os.path.isdir(path) or path.endswith(os.sep):
        raise ValueError(f"{flag}: {path} is a directory; give a file name")
    if suffixes is not None and not path.lower().endswith(tuple(suffixes)):
        raise ValueError(f"{flag}: {path}: the file name must end in one of {', '.join(suffixes)}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{flag}: {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag}: {path}: not writable")


def write_scores(path: str, splits: np.ndarray, slowest: np.ndarray) -> None:
    """All scores: ``.npy`` (float64, inf where infeasible) or CSV (row, slowest, counts)."""
    try:
        if path.endswith(".npy"):
            np.save(path, slowest)
            return
        with open(path, "w", newline="") as fh:
            fh.write("row,slowest,counts\n")
            for i, (s, row) in enumerate(zip(slowest.tolist(), splits.tolist())):
                fh.write(f"{i},{'inf' if s == float('inf') else repr(s)},{' '.join(map(str, row))}\n")
    except OSError as exc:
        raise ValueError(f"--out: {path}: cannot write ({exc.strerror or exc})") from None
