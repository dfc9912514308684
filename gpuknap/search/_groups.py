"""Partial splits that share their walk, for the simulated score's branch and bound.

The walk of :mod:`._simulated` expands partial splits stage by stage, and
:meth:`._partial.Bounds.expand` computes a child's bound and state from its
parent's state alone (``Bounds.STATE``: the layers placed, the stage times
summed, the largest forward and backward times, the largest path terms, the open
chains), never from the stage sizes that led there.  Many partial splits meet:

- **the same state**: stages of 2 and 3 layers in another order often sum to the
  same times and leave the same terms.  Their children have the same bounds and
  states, so one node stands for all of them;
- **a state bounded from below by another's** (:meth:`._partial.Bounds.order`):
  if A's state is at most B's in that order, every child of A has a bound at most
  that of B's child on the same layers, and the two children are in the same
  relation again.  So B joins A's node: the node is walked with A's bounds, which
  never cut a completion that B's own bounds would keep.

A node is expanded once for all its partial splits ("paths").  The argument that
this is exact: take any complete split whose every prefix has a bound within the
walk's cut.  Its prefix of one stage is a node, or joined a node with a state at
most its own; by induction every later prefix is reached by a node whose state
is at most the prefix's, so whose bound is at most the prefix's bound, within
the cut: the node's child is kept, and the prefix is among its paths.  At the
last stage, each kept child is completed with every path of its node, and each
complete split is filtered by its own full bound (:func:`._critical.split_bounds`)
and simulated on its own.  So the splits simulated include every split the
walk without nodes would simulate (a cut taken at another moment of the walk is
valid too: every cut is at least the k-th best time at the end, or the pass's
limit).  Nothing is ranked by a node: only the pruning work is shared.

A node keeps its paths as edges to the nodes of its parent's chunk (which node,
which stage size), not as rows of stage sizes: a chunk holds at most one edge per
child of its parent chunk, so memory stays bounded however many paths meet.

Joining by the order has a price: the paths that joined are cut by the node's
bounds, not their own, so more of them reach the last stage, where each one is
completed and bounded on its own.  Where many paths join nodes whose completions
stay close to the cut (layers of their own times, say), that work outgrows what
the shared walk saves; so a node takes others by the order only while it holds at
most ``JOIN_PATHS`` paths (equal states always join: they cost nothing there).
"""
from __future__ import annotations

import numpy as np

#: Most paths a node may hold after others joined it by the order (equal states join always).
JOIN_PATHS = 256
#: Nodes of a class every node of the class is compared with.
LEADERS = 16
#: Most (node, leader, column) comparisons made at once, not one column at a time.
FEW_PAIRS = 2**14


def start(st: dict) -> dict:
    """The root of the walk: one node, one path (no stage placed)."""
    out = {k: v for k, v in st.items() if k != "counts"}
    out["link"], out["paths"] = None, np.ones(1)
    return out


def children(st: dict, new: dict, parent: np.ndarray, j: np.ndarray, B) -> dict:
    """The children ``(parent, j)`` of the nodes ``st`` (their states ``new`` from ``expand``
    of the bounds ``B``) as nodes: one per state, then each node that a leader of its class
    bounds from below (:meth:`._partial.Bounds.order`) joins that leader.  The nodes left
    keep the order of their first child; their edges lead to ``st``'s nodes."""
    c = len(parent)
    rows = np.concatenate([np.asarray(new[k][parent, j], dtype=np.float64).reshape(c, -1) for k in B.STATE], axis=1)
    group, keep = _same(rows)
    rows = rows[keep]
    paths = np.bincount(group, weights=st["paths"][parent], minlength=len(keep))
    target = _below(*B.order_rows(rows))
    total = np.bincount(target, weights=paths, minlength=len(target))
    crowded = (target != np.arange(len(target))) & (total[target] > JOIN_PATHS)
    target[crowded] = np.flatnonzero(crowded)
    heads = np.flatnonzero(target == np.arange(len(target)))
    rank = np.empty(len(target), dtype=np.int64)
    rank[heads] = np.arange(len(heads))
    node = rank[target[group]]
    out = B.fields(rows[heads])
    order = np.argsort(node, kind="stable")
    out["link"] = (st["link"], st["paths"], parent[order], j[order], node[order])
    out["paths"] = np.bincount(node, weights=st["paths"][parent], minlength=len(heads))
    return out


def split(nodes: dict, size: int) -> list:
    """``nodes`` in chunks of at most ``size``, best first, each with its own edges."""
    up, paths, parent, j, owner = nodes["link"]
    out = []
    for lo in range(0, len(nodes["a"]), size):
        hi = min(lo + size, len(nodes["a"]))
        a, b = np.searchsorted(owner, [lo, hi])
        part = {k: v[lo:hi] for k, v in nodes.items() if k != "link"}
        part["link"] = (up, paths, parent[a:b], j[a:b], owner[a:b] - lo)
        out.append(part)
    return out


def complete(st: dict, parent: np.ndarray, j: np.ndarray, limit: int):
    """The complete splits of the children ``(parent, j)`` at the last stage: every path of
    each parent with that child's last stage, ``[N, P]`` arrays of at most about ``limit``
    rows (more only where one path count alone is larger)."""
    order = np.argsort(parent, kind="stable")
    leaf = (st["link"], st["paths"], parent[order], j[order], np.arange(len(parent)))
    for _, rows in _prefixes(leaf, np.arange(len(parent)), limit):
        yield rows.astype(np.int64)


def _prefixes(link, nodes: np.ndarray, limit: int):
    """Batches ``(position in nodes, stage sizes)`` of every path of the nodes ``nodes``
    (ascending) of a chunk whose edges are ``link``."""
    if link is None:  # the root: one path, no stage
        yield np.zeros(1, dtype=np.int64), np.zeros((1, 0), dtype=np.int32)
        return
    up, paths, parent, j, owner = link
    lo, hi = np.searchsorted(owner, nodes), np.searchsorted(owner, nodes, side="right")
    edges = _ranges(lo, hi)
    where = np.repeat(np.arange(len(nodes)), hi - lo)  # each edge's position in nodes
    weight = np.cumsum(paths[parent[edges]])
    batch = np.floor_divide(weight - 1, limit).astype(np.int64)  # an edge larger than limit: a batch alone
    for b in np.unique(batch):
        mine = np.flatnonzero(batch == b)
        ups = np.unique(parent[edges[mine]])
        for pos, rows in _prefixes(up, ups, limit):
            # join: each edge of the batch with every path of its parent in this batch
            by = np.argsort(pos, kind="stable")
            first = np.searchsorted(pos[by], np.arange(len(ups)))
            count = np.bincount(pos, minlength=len(ups))
            k = np.searchsorted(ups, parent[edges[mine]])
            rows_of = by[_ranges(first[k], first[k] + count[k])]
            edge = np.repeat(mine, count[k])
            yield where[edge], np.concatenate((rows[rows_of], (j[edges[edge]] + 1)[:, None].astype(rows.dtype)), axis=1)


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``lo[0]..hi[0]-1, lo[1]..hi[1]-1, ...`` concatenated."""
    length = hi - lo
    offset = np.cumsum(length) - length
    return np.repeat(lo - offset, length) + np.arange(int(length.sum()))


def _below(same: np.ndarray, lower: np.ndarray, leaders: int = LEADERS) -> np.ndarray:
    """For each node, the node it joins (itself when none): nodes with equal ``same`` rows
    form a class; the ``leaders`` of a class with the least first ``lower`` column (ties by
    position) are compared with every node of the class, and a node whose ``lower`` row is
    at least a leader's in every column joins the first such leader that no leader bounds
    in turn (one exists unless two leaders bound each other, equal rows: bounding is
    transitive, so a least one of the leaders that bound the node is bounded by none).
    A node that joins none stays a node: correct, only shared less.

    The pairs (node, leader) are compared one column at a time, from the second column on
    (the first, which orders the leaders, passes almost always), keeping only the pairs
    still bounded: most fail within a few columns."""
    n = len(same)
    if n < 2:
        return np.arange(n)
    order = np.lexsort((np.arange(n), lower[:, 0]) + tuple(same.T[::-1]))  # by class, then the first column
    ranked = same[order]
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.any(ranked[1:] != ranked[:-1], axis=1, out=new[1:])
    bounds = np.append(np.flatnonzero(new), n)  # in sorted order, where each class starts (and the end)
    cls = np.empty(n, dtype=np.int64)
    cls[order] = np.cumsum(new) - 1
    start, end = bounds[cls], bounds[cls + 1]
    # [node, r]: the class's r-th leader, and whether it bounds the node (no class has more members)
    at = start[:, None] + np.arange(min(leaders, int((end - start).max())))[None, :]
    lead = order[np.minimum(at, n - 1)]
    node = np.arange(n)
    hit = (at < end[:, None]) & (lead != node[:, None])
    pair = np.flatnonzero(hit)
    mine, theirs = pair // hit.shape[1], lead.ravel()[pair]
    if len(pair) * lower.shape[1] <= FEW_PAIRS:  # few: all columns at once (fewer calls)
        hit.ravel()[pair] = (lower[theirs] <= lower[mine]).all(axis=1)
    else:
        alive = np.arange(len(pair))
        for column in (*range(1, lower.shape[1]), 0):
            values = lower[:, column]
            bounded = values[theirs] <= values[mine]
            mine, theirs, alive = mine[bounded], theirs[bounded], alive[bounded]
        hit.ravel()[pair] = False
        hit.ravel()[pair[alive]] = True
    take = hit & ~hit.any(axis=1)[lead]  # leaders that no leader bounds
    first = take.argmax(axis=1)  # the first of them wins
    return np.where(take[node, first], lead[node, first], node)


def _same(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows equal bit for bit, grouped: ``(group of each row, first row of each group)``, the
    groups numbered in the order of their first rows.  Rows are hashed, then each row is
    compared with the first row of its hash: a row that differs (a collision) is a group
    of its own.  Each 64-bit word is mixed through all its bits before the columns are
    combined (the times and counts here are floats whose low bits are mostly zero: a
    plain multiply would leave them unmixed, and rows that only swap such values apart
    would collide)."""
    bits = np.ascontiguousarray(rows).view(np.uint64)
    mult = (np.arange(1, bits.shape[1] + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)
    with np.errstate(over="ignore"):
        mixed = bits ^ (bits >> np.uint64(31))  # the high bits down, then a multiply carries them up again
        mixed *= np.uint64(0xBF58476D1CE4E5B9)
        mixed ^= mixed >> np.uint64(29)
        mixed *= mult  # a different odd factor per column
        key = (mixed ^ (mixed >> np.uint64(32))).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    lead = first[inverse.ravel()]
    alone = ~(bits == bits[lead]).all(axis=1)
    lead[alone] = np.flatnonzero(alone)
    heads = np.flatnonzero(lead == np.arange(len(rows)))  # ascending: the order of first rows
    rank = np.empty(len(rows), dtype=np.int64)
    rank[heads] = np.arange(len(heads))
    return rank[lead], heads
