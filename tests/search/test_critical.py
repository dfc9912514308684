"""The simulated score's lower bounds are lengths of real paths of the 1F1B schedule.

Each family of gpuknap.search._critical is built here operation by operation from
the schedule's order (per stage, the order 1F1B runs its forwards and backwards),
every step checked to be an edge of the schedule (the next operation on the same
stage, or the input of the next operation), and its per-stage counts compared with
the coefficients the bounds use.  Then the bounds are checked against the
simulator on random pipelines, with forward times known only within a range.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuknap.schedule import iteration_times, order
from gpuknap.search._critical import caps, segment_floor, split_bounds
from gpuknap.search._segments import segment_rooms


class Schedule:
    def __init__(self, p, m):
        self.p, self.m = p, m
        self.ops = [[(k, mb) for k, _, mb in stage] for stage in order("1f1b", p, 1, m)]
        self.pos = [{op: i for i, op in enumerate(stage)} for stage in self.ops]

    def chain(self, s, first, last):
        """Stage s's operations from ``first`` to ``last`` in its order."""
        a, b = self.pos[s][first], self.pos[s][last]
        assert a <= b, (s, first, last)
        return [(s, op) for op in self.ops[s][a:b + 1]]

    def is_edge(self, u, v):
        (s, (k, i)), (t, (l, j)) = u, v
        if s == t:
            return self.pos[s][(l, j)] == self.pos[s][(k, i)] + 1
        if k == "F" and l == "F" and t == s + 1 and i == j:
            return True
        return k == "B" and l == "B" and t == s - 1 and i == j

    def counts(self, path):
        out = np.zeros((self.p, 2), dtype=int)
        for u, v in zip(path, path[1:]):
            assert self.is_edge(u, v) or (u[0] == v[0] == self.p - 1 and u[1] == ("F", v[1][1])
                                          and v[1][0] == "B"), (u, v)
        for s, (k, _) in path:
            out[s, 0 if k == "F" else 1] += 1
        assert path[0] == (0, ("F", 0)) and path[-1] == (0, ("B", self.m - 1))
        return out


def up(s0, s1, mb):
    return [(j, ("F", mb)) for j in range(s0, s1)]


def down(s0, s1, mb):
    return [(j, ("B", mb)) for j in range(s0, s1, -1)]


def climb(S, s, x, j1):
    """Up to stage s on micro-batch x, the x more forwards run in the warm-up of stage j1."""
    if x == 0:
        return up(0, s, 0)
    return up(0, j1, 0) + S.chain(j1, ("F", 0), ("F", x)) + up(j1 + 1, s, x)


def descend(S, s, y, j2):
    """Down from stage s on micro-batch M-1-y, the y more backwards run in the cool-down of j2."""
    m = S.m
    if y == 0:
        return down(s - 1, -1, m - 1)
    return down(s - 1, j2, m - 1 - y) + S.chain(j2, ("B", m - 1 - y), ("B", m - 1)) + down(j2 - 1, -1, m - 1)


def stay_path(S, s, x, j1, y, j2):
    """Family A: x more warm-up forwards on stage j1, y more cool-down backwards on j2."""
    m = S.m
    return climb(S, s, x, j1) + S.chain(s, ("F", x), ("B", m - 1 - y)) + descend(S, s, y, j2)


def top_first_path(S, s, k, y, j2):
    """Family F: over the top on micro-batch 0, back to s, then up again through k stages on the
    last micro-batch (k = 0: not), y more cool-down backwards on stage j2."""
    p, m = S.p, S.m
    path = up(0, p, 0) + [(p - 1, ("B", 0))] + down(p - 2, s, 0)
    if k == 0:
        path += S.chain(s, ("B", 0), ("B", m - 1 - y))
    else:
        w = min(p - 1 - (s + k), m)
        path += S.chain(s, ("B", 0), ("F", m - 1)) + up(s + 1, s + k, m - 1)
        path += S.chain(s + k, ("F", m - 1), ("B", m - 1 - w)) + down(s + k - 1, s, m - 1 - w)
        path += S.chain(s, ("B", m - 1 - w), ("B", m - 1 - y))
    return path + descend(S, s, y, j2)


def last_up_path(S, s, x, j1):
    """Family B: x more warm-up forwards on j1, stage s up to its last forward, over the top on
    the last micro-batch and down."""
    p, m = S.p, S.m
    path = climb(S, s, x, j1) + S.chain(s, ("F", x), ("F", m - 1)) + up(s + 1, p, m - 1)
    return path + [(p - 1, ("B", m - 1))] + down(p - 2, -1, m - 1)


@pytest.mark.parametrize("p, m", [(1, 1), (1, 4), (2, 1), (2, 2), (3, 2), (4, 4), (4, 9), (5, 3), (6, 6),
                                  (6, 13), (7, 5), (8, 16), (9, 4)])
def test_every_bound_is_the_length_of_a_path_of_the_schedule(p, m):
    S = Schedule(p, m)
    w, c, a = caps(p, m)
    for s in range(p):
        for x in range(c[s] + 1):
            for y in range(c[s] + 1):
                for j in range(s):
                    want = np.ones((p, 2), dtype=int)
                    want[s + 1:] = 0
                    want[s] = (m - x, m - y)
                    if x or y:
                        want[j] += (x, y)
                    assert (S.counts(stay_path(S, s, x, j, y, j)) == want).all()
                if s == 0 and x == y == 0:
                    want = np.zeros((p, 2), dtype=int)
                    want[0] = (m, m)
                    assert (S.counts(stay_path(S, 0, 0, 0, 0, 0)) == want).all()
        if s == p - 1:
            continue
        for y in range(c[s] + 1):
            for j in range(s) if y else [0]:
                want = np.ones((p, 2), dtype=int)
                want[s] = (a[s], m - y)
                want[j, 1] += y
                assert (S.counts(top_first_path(S, s, 0, y, j)) == want).all()
        if m - w[s] >= 2:
            for k in range(1, w[s] + 1):
                for y in range(w[s] - k + 1):
                    for j in range(s) if y else [0]:
                        want = np.ones((p, 2), dtype=int)
                        want[s + 1:s + k + 1] = 2
                        want[s] = (m - w[s], m - k - y)
                        want[j, 1] += y
                        assert (S.counts(top_first_path(S, s, k, y, j)) == want).all()
        for x in range(c[s] + 1):
            for j in range(s) if x else [0]:
                want = np.ones((p, 2), dtype=int)
                want[s] = (m - x, a[s])
                want[j, 0] += x
                assert (S.counts(last_up_path(S, s, x, j)) == want).all()


@pytest.mark.parametrize("seed", range(30))
def test_the_bounds_never_exceed_the_simulated_time(seed):
    """Random pipelines (some stages idle, some far heavier), forward times known only within
    a range: the bound holds for every forward time in it."""
    rng = np.random.default_rng(seed)
    p, m = int(rng.integers(1, 12)), int(rng.integers(1, 40))
    n = 300
    f = rng.uniform(0.1, 2.0, (n, p)) * rng.choice([1.0, 4.0], (n, p), p=[0.85, 0.15])
    b = f * rng.uniform(0.3, 3.0, (n, p))
    f[rng.random((n, p)) < 0.05] = 0.0
    t = f + b
    simulated = iteration_times(f[:, :, None], b[:, :, None], m)
    assert (split_bounds(t, f, f, m) <= simulated * (1 + 1e-12)).all()
    low, high = f * rng.uniform(0.5, 1.0, f.shape), np.minimum(f * rng.uniform(1.0, 1.5, f.shape), t)
    assert (split_bounds(t, low, high, m) <= simulated * (1 + 1e-12)).all()


def test_the_bounds_equal_the_simulated_time_for_equal_stages():
    for p, m in [(4, 8), (8, 32), (16, 16), (6, 3)]:
        t = np.full((1, p), 3.0)
        f = np.full((1, p), 1.0)
        assert split_bounds(t, f, f, m)[0] == pytest.approx(iteration_times(f[:, :, None], (t - f)[:, :, None], m)[0])



def plain_bounds(t, f_low, f_high, m):
    """The bounds without chains written plainly (every term on every stage, then masked):
    :func:`split_bounds` computes them in place, on the stages that have them."""
    from gpuknap.search._critical import least

    n, p = t.shape
    w, c, _ = caps(p, m)
    pre = np.cumsum(t, axis=1) - t
    suf = t.sum(axis=1, keepdims=True) - pre - t
    zero = np.zeros((n, 1))
    fmax = np.maximum.accumulate(np.concatenate((zero, f_low[:, :-1]), axis=1), axis=1)
    bmax = np.maximum.accumulate(np.concatenate((zero, (t - f_high)[:, :-1]), axis=1), axis=1)
    a = np.maximum(m - w, 1)
    bump_f = c * np.maximum(0.0, fmax - f_high)
    bump_b = c * np.maximum(0.0, bmax - (t - f_low))
    h0 = m * t + bump_f + bump_b
    h1 = np.maximum(least(a, m, t, f_low, f_high) + bump_b, least(m, a, t, f_low, f_high) + bump_f)
    h2 = np.where(m - w >= 2, (m - w) * t, -np.inf)
    h1[:, p - 1], h2[:, p - 1] = -np.inf, -np.inf
    return np.maximum.reduce([pre + h0, pre + h1 + suf, pre + h2 + 2 * suf]).max(axis=1)


@pytest.mark.parametrize("seed", range(20))
def test_the_quick_bounds_equal_the_plain_formula_bit_for_bit(seed):
    """Whatever the stage and micro-batch counts (m = 1 included), with idle stages and
    infinite times: the same values, NaN where the plain formula gives NaN."""
    rng = np.random.default_rng(100 + seed)
    n, p, m = 400, int(rng.integers(1, 12)), int(rng.integers(1, 16)) if seed else 1
    f_low = rng.choice([0.0, 0.5, 1.0, 2.5, 1 / 3], (n, p)) * rng.integers(1, 5, (n, p))
    f_high = f_low + rng.choice([0.0, 0.0, 0.25, 1 / 7], (n, p))
    t = f_high + rng.choice([0.0, 1.0, 2.0, 0.1, 1 / 3], (n, p)) * rng.integers(0, 5, (n, p))
    scale = rng.choice([1.0, 10.0, 100.0], (n, p))  # some stages far heavier: every term leads somewhere
    t, f_low, f_high = t * scale, f_low * scale, f_high * scale
    if seed % 4 == 0:
        t[rng.random((n, p)) < 0.1] = np.inf
    with np.errstate(invalid="ignore"):
        want, got = plain_bounds(t, f_low, f_high, m), split_bounds(t, f_low, f_high, m, chains=False)
    assert np.array_equal(want, got, equal_nan=True)


@pytest.mark.parametrize("seed", range(30))
def test_segment_floor_is_below_every_split_using_the_segment(seed):
    """Random layers (a fastest time, a forward range) and random plans: each stage takes at
    least its layers' fastest time, a forward time within its layers' range; the floor of
    every stage's segment is at most the simulated time of the split."""
    rng = np.random.default_rng(7700 + seed)
    layers, p, m = int(rng.integers(2, 14)), 0, int(rng.integers(1, 12))
    p = int(rng.integers(1, min(layers, 7) + 1))
    fl = rng.choice([0.0, 0.5, 1.0, 2.0], layers)
    fh = fl + rng.choice([0.0, 0.0, 0.5, 3.0], layers)
    x = rng.choice([0.5, 1.0, 3.0, 6.0], layers)
    fastest, low, high = (np.concatenate(([0.0], np.cumsum(v))) for v in (x, fl, fh))
    for _ in range(40):
        counts = rng.multinomial(layers - p, np.ones(p) / p) + 1
        ends = np.cumsum(counts)
        starts = ends - counts
        f = rng.uniform(low[ends] - low[starts], high[ends] - high[starts])
        t = np.maximum(fastest[ends] - fastest[starts], f) + rng.choice([0.0, 0.0, 1.0, 4.0], p)
        sim = iteration_times(f[None, :, None], (t - f)[None, :, None], m)[0]
        floor = segment_floor(np.arange(p), starts, ends, p, m, fastest, low, high)
        assert (floor <= sim * (1 + 1e-12)).all(), (counts, floor, sim)


def test_segment_rooms_keeps_exactly_the_segments_whose_floor_is_within_the_score():
    """Each (stage, start) keeps lengths up to the longest whose floor is within the score."""
    rng = np.random.default_rng(5)
    layers, p, m = 12, 4, 6
    fl = rng.choice([0.5, 1.0], layers)
    fastest, low, high = (np.concatenate(([0.0], np.cumsum(v))) for v in (fl * 3, fl, fl * 2))
    rooms = rng.integers(0, 6, (p, layers + 1))
    rooms = np.minimum(rooms, layers - np.arange(layers + 1))[:, :]
    for score in (30.0, 60.0, 120.0):
        cut = segment_rooms(rooms, m, fastest, low, high, score)
        for s in range(p):
            for a in range(layers + 1):
                ok = [n for n in range(1, rooms[s, a] + 1)
                      if segment_floor(np.array(s), np.array(a), np.array(a + n), p, m, fastest, low, high) <= score]
                assert cut[s, a] == max(ok, default=0), (s, a, score)
