"""The simulated search's shared walk (gpuknap.search._groups): partial splits with one
state share a node, and a partial split whose state another bounds from below joins
that one's node.  The order itself is checked on the bounds' own expansion, and the
search against brute force where nodes are shared most: equal layers, ties, top-k,
tiny chunks and every pass interrupted."""
from __future__ import annotations

import random

import numpy as np
import pytest
from test_model import random_model
from test_simulated import brute_simulated, shaped_model

from gpuknap import LayerOption, PipelineModel, best_splits
from gpuknap.search import _groups
from gpuknap.search._partial import Bounds
from gpuknap.search._segments import SegmentTable


def random_bounds(rng: np.random.Generator) -> Bounds:
    """Bounds on a random table: a few distinct times (so states meet and bound each
    other often), forward times known within a range."""
    p = int(rng.integers(2, 6))
    layers = int(rng.integers(p, 10))
    f_low = rng.choice([0.5, 1.0, 2.0], layers)
    f_high = f_low + rng.choice([0.0, 0.0, 0.5, 1.0], layers)
    low, high = (np.concatenate(([0.0], np.cumsum(x))) for x in (f_low, f_high))
    n1, width = layers + 1, layers
    band = np.full((p, n1, width), np.inf)
    for s in range(p):
        for a in range(layers):
            for j in range(min(width, layers - a)):
                if rng.random() < 0.9:
                    band[s, a, j] = high[a + j + 1] - high[a] + rng.choice([0.0, 1.0, 2.0, 3.0]) * (j + 1)
    return Bounds(SegmentTable(band), int(rng.integers(1, 8)), low, high)


def below(B: Bounds, st: dict) -> np.ndarray:
    """``[N, N]``: whether partial split i's state bounds partial split k's from below."""
    same, lower = B.order(st)
    return (same[:, None] == same[None]).all(axis=2) & (lower[:, None] <= lower[None]).all(axis=2)


@pytest.mark.parametrize("seed", range(40))
def test_a_state_bounded_from_below_gives_bounds_and_children_bounded_from_below(seed):
    """The order of Bounds.order: where A's state is at most B's, each child of A has a bound
    at most that of B's child on the same layers, and the children are in the order again."""
    rng = np.random.default_rng(seed)
    B = random_bounds(rng)
    st = B.start()
    for s in range(B.T.p):
        bound, new = B.expand(s, st)
        rel = below(B, st)
        np.fill_diagonal(rel, False)
        for i, k in zip(*np.nonzero(rel)):
            assert (bound[i] <= bound[k]).all(), (s, i, k)
            for j in np.flatnonzero(np.isfinite(bound[k])):
                kids = B.take(st, new, np.array([i, k]), np.array([j, j]))
                assert below(B, kids)[0, 1], (s, i, k, j)
        parent, j = np.nonzero(np.isfinite(bound))
        if not len(parent):
            break
        keep = rng.permutation(len(parent))[:60]
        st = B.take(st, new, parent[keep], j[keep])


def test_the_order_is_used_and_matters():
    """Over the random tables, many pairs are related, and among them chains whose
    ``zc`` differ: without the ``zr - zl zc`` column the order would be wrong."""
    wrong = related = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        B = random_bounds(rng)
        st = B.start()
        for s in range(B.T.p):
            bound, new = B.expand(s, st)
            parent, j = np.nonzero(np.isfinite(bound))
            if not len(parent):
                break
            st = B.take(st, new, parent, j)
            same, lower = B.order(st)
            n = len(same)
            loose = lower[:, :-st["zr"].shape[1]]  # the order without zr - zl zc
            eq = (same[:, None] == same[None]).all(axis=2) & ~np.eye(n, dtype=bool)
            related += int((eq & (lower[:, None] <= lower[None]).all(axis=2)).sum())
            wrong += int((eq & (loose[:, None] <= loose[None]).all(axis=2)
                          & ~(lower[:, None] <= lower[None]).all(axis=2)).sum())
    assert related > 100 and wrong > 0


def equal_model(rng: random.Random, layers: int) -> PipelineModel:
    """One body kind between a head and a tail: many splits meet in one state."""
    body = [LayerOption(f"b{j}", rng.randint(1, 6), rng.choice([1.0, 1.5]), rng.choice([1.0, 2.0, 3.0]),
                        rng.randint(0, 2)) for j in range(rng.randint(1, 3))]
    fronts = {"head": [LayerOption("h", 1, 0.5, 0.5)], "body": body, "tail": [LayerOption("t", 1, 1.0, 0.5)]}
    kinds = ["head"] + ["body"] * (layers - 2) + ["tail"]
    return PipelineModel(kinds, fronts, {"head": 1, "body": 1, "tail": 1}, rng.choice([30, 45, 60, 400]),
                         rng.randint(1, 9), reserved=rng.randint(0, 3))


@pytest.fixture
def shared(monkeypatch):
    """The walk doing the most: a beam of one, every pass stopped once; and the count of
    partial splits that shared a node."""
    import gpuknap.search._simulated as search_simulated

    monkeypatch.setattr(search_simulated, "BEAM", 1)
    monkeypatch.setattr(search_simulated, "LONG_PASS", 0)
    taken = {"same": 0, "below": 0}
    same, below_ = _groups._same, _groups._below

    def count_below(*args, **kwargs):
        out = below_(*args, **kwargs)
        taken["below"] += int((out != np.arange(len(out))).sum())
        return out

    def count_same(rows):
        out = same(rows)
        taken["same"] += len(rows) - len(out[1])
        return out

    monkeypatch.setattr(_groups, "_below", count_below)
    monkeypatch.setattr(_groups, "_same", count_same)
    return taken


def tiny_chunks(monkeypatch):
    """Chunks of one node (nothing shared across them), paths completed one at a time."""
    import gpuknap.search._simulated as search_simulated

    monkeypatch.setattr(search_simulated, "MIN_CHUNK", 1)
    monkeypatch.setattr(search_simulated, "DEFAULT_BYTES", 1)


@pytest.mark.parametrize("seed", range(24))
def test_shared_walk_equals_brute_force_on_equal_layers(seed, shared, monkeypatch):
    if seed % 3 == 2:
        tiny_chunks(monkeypatch)
    if seed % 3 == 1:  # nodes full early: most joins by the order refused
        monkeypatch.setattr(_groups, "JOIN_PATHS", 2)
    rng = random.Random(9000 + seed)
    layers = rng.randint(5, 12)
    p = rng.randint(2, min(6, layers))
    model = equal_model(rng, layers)
    want = brute_simulated(model, p, 1)
    for top in (1, 4, 11):
        got = best_splits(model, p, top, "simulated", 1, backend="numpy")
        assert [(s, c) for c, s, _ in got] == want[:top], top


@pytest.mark.parametrize("seed", range(12))
def test_shared_walk_equals_brute_force_on_random_models(seed, shared, monkeypatch):
    if seed % 3 == 2:
        tiny_chunks(monkeypatch)
    rng = random.Random(9500 + seed)
    if seed % 2:
        p = 2 + seed % 5
        model = shaped_model(rng, rng.randint(p, min(p + 6, 11)), p)
    else:
        model = random_model(rng, rng.randint(5, 12), tight=seed % 4 == 0)
        p = rng.randint(2, min(5, model.layers))
    want = brute_simulated(model, p, 1)
    for top in (1, 5):
        got = best_splits(model, p, top, "simulated", 1, backend="numpy")
        assert [(s, c) for c, s, _ in got] == want[:top], top


def test_the_brute_force_runs_share_nodes(shared):
    """The comparisons above exercise both kinds of sharing (else they would prove little):
    equal states (counted by ``_same`` on the children's states) and states bounded from
    below (``_below``)."""
    for seed in range(12):
        rng = random.Random(9000 + seed)
        layers = rng.randint(5, 12)
        p = rng.randint(2, min(6, layers))
        best_splits(equal_model(rng, layers), p, 4, "simulated", 1, backend="numpy")
    assert shared["same"] > 0 and shared["below"] > 0


def test_paths_of_a_node_in_batches():
    """Every path of the nodes, each once, however small the batches."""
    rng = np.random.default_rng(3)
    link, paths, rows = None, np.ones(1), {0: [()]}
    for depth in range(4):
        n = int(rng.integers(2, 6))
        parent = rng.integers(0, len(paths), 12)
        j = rng.integers(0, 3, 12)
        owner = np.sort(rng.integers(0, n, 12))
        owner[:n] = np.arange(n)
        owner.sort()
        link = (link, paths, parent, j, owner)
        rows = {i: [r + (int(jj) + 1,) for pp, jj, o in zip(parent, j, owner) if o == i for r in rows.get(pp, [])]
                for i in range(n)}
        paths = np.bincount(owner, weights=paths[parent], minlength=n)
    nodes = np.arange(len(paths))
    want = sorted((i, r) for i in nodes for r in rows[i])
    for limit in (1, 2, 5, 1000):
        got = [(int(nodes[i]), tuple(r)) for pos, batch in _groups._prefixes(link, nodes, limit)
               for i, r in zip(pos, batch.tolist())]
        assert sorted(got) == want, limit


@pytest.mark.parametrize("seed", range(20))
def test_a_node_joins_only_a_node_that_bounds_it_from_below(seed):
    """_below's contract: a node joins a node of its class (equal ``same`` row) whose
    ``lower`` row is at most its own in every column, and that node joins none."""
    rng = np.random.default_rng(seed)
    n, cols = int(rng.integers(1, 80)), int(rng.integers(1, 6))
    same = rng.integers(0, 3, (n, 2)).astype(np.float64)
    lower = rng.choice([-np.inf, 0.0, 1.0, 2.0, 3.0], (n, cols))
    target = _groups._below(same, lower, leaders=int(rng.integers(1, 6)))
    for i, t in enumerate(target):
        if t != i:
            assert (same[t] == same[i]).all() and (lower[t] <= lower[i]).all(), (i, t)
            assert target[t] == t


def loop_below(same, lower, leaders):
    """_below's rule written as a loop over the leaders (what it computes all at once)."""
    n = len(same)
    if n < 2:
        return np.arange(n)
    _, cls = np.unique(same, axis=0, return_inverse=True)  # the classes, by equal rows
    cls = cls.ravel()
    order = np.lexsort((np.arange(n), lower[:, 0], cls))
    start = np.searchsorted(cls[order], cls)
    end = np.searchsorted(cls[order], cls, side="right")
    hits = []
    for r in range(leaders):
        at = start + r
        lead = order[np.minimum(at, n - 1)]
        hits.append((lead, (at < end) & (lead != np.arange(n)) & (lower[lead] <= lower).all(axis=1)))
    bounded = np.logical_or.reduce([hit for _, hit in hits])
    target = np.arange(n)
    for lead, hit in reversed(hits):  # the first leader that is itself unbounded wins
        take = hit & ~bounded[lead]
        target[take] = lead[take]
    return target


@pytest.mark.parametrize("seed", range(20))
def test_below_equals_the_loop_over_leaders(seed, monkeypatch):
    """Every node's target, with NaN and -inf in the rows, the columns compared all at once
    or (odd seeds) one at a time."""
    rng = np.random.default_rng(300 + seed)
    if seed % 2:
        monkeypatch.setattr(_groups, "FEW_PAIRS", 0)
    for _ in range(20):
        n, cols = int(rng.integers(1, 120)), int(rng.integers(1, 20))
        same = rng.integers(0, int(rng.integers(1, 5)), (n, 2)).astype(np.float64)
        lower = rng.choice([-np.inf, 0.0, 1.0, 2.0, 3.0, np.nan], (n, cols), p=[0.1, 0.2, 0.25, 0.25, 0.15, 0.05])
        for leaders in (1, 3, 16):
            assert np.array_equal(_groups._below(same, lower, leaders), loop_below(same, lower, leaders))
