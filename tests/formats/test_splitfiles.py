"""The distinct rows of a splits file (``rank --splits`` scores each distinct split once)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuknap.formats import splitfiles
from gpuknap.formats.splitfiles import distinct_rows


def _reference(rows: np.ndarray) -> tuple[list, list]:
    """First-appearance order by a plain loop over tuples."""
    seen: dict = {}
    inverse = []
    for r in map(tuple, rows.tolist()):
        inverse.append(seen.setdefault(r, len(seen)))
    return [list(r) for r in seen], inverse


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 400), st.integers(1, 9), st.integers(1, 50))
def test_distinct_rows_match_a_loop(seed, n, width, values):
    rng = np.random.default_rng(seed)
    rows = rng.integers(-values, values + 1, (n, width))
    distinct, inverse = distinct_rows(rows)
    want, want_inverse = _reference(rows)
    assert distinct.tolist() == want and inverse.tolist() == want_inverse
    assert np.array_equal(distinct[inverse], rows)


def test_rows_sharing_a_hash_fall_back_to_sorting_rows(monkeypatch):
    """Every row hashed alike (weights of 0 but for a one): the check sees the collision and the
    answer is still exact."""
    real = np.random.default_rng

    class Zeros:
        def __init__(self, *a):
            self.rng = real(*a)

        def integers(self, low, high, size, dtype):
            return np.zeros(size, dtype=dtype)  # | 1 makes every weight 1: the hash is the row's sum

    monkeypatch.setattr(splitfiles.np.random, "default_rng", Zeros)
    rows = np.array([[1, 2], [2, 1], [1, 2], [3, 0], [0, 3], [2, 1]])
    distinct, inverse = distinct_rows(rows)
    assert distinct.tolist() == [[1, 2], [2, 1], [3, 0], [0, 3]] and inverse.tolist() == [0, 1, 0, 2, 3, 1]


def test_distinct_rows_refuse_what_is_not_a_table():
    with pytest.raises(ValueError):
        distinct_rows(np.zeros((0, 4), dtype=np.int64))
    with pytest.raises(ValueError):
        distinct_rows(np.zeros(4, dtype=np.int64))
