"""Packing a batch of knapsack problems into trie levels, in memory-bounded chunks.

Problems whose layer steps extend one another share one chain of passes: the
steps of all problems form a trie, each trie node is one DP row (its parent
node's row after one more layer), and a problem is a readout of its end
node's row at its capacity.  Level ``d`` of the trie is one 2-D array
``[rows, buckets]`` computed by one min-plus pass; its width is the largest
capacity any problem below it reads, so rows narrow as stages fill up.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import itemgetter
from typing import NamedTuple, Sequence

import numpy as np

from ._options import FrontTable
from ._passes import Segment, option_tables
from ._work import (
    LEVEL_CELLS,
    MAX_ROW_BUCKETS,
    MAX_STEPS,
    OPTIONS_PER_CELL,
    check_work,
    coarser,
    format_count,
    max_cells,
)

#: Most passes a cut at the cache target may compute again, as a share of the chunk before it.
RECOMPUTE_SHARE = 0.25
#: Working arrays alive during one level (previous, gathered, output, temporary).
ARRAYS_PER_LEVEL = 4
CELL_BYTES = 8
_COUNT = itemgetter(1)


@dataclass
class Level:
    """One min-plus pass: rows, their parents, shared steps and readouts."""

    parent: np.ndarray
    width: int
    segments: list
    read_rows: np.ndarray
    read_cols: np.ndarray
    read_ids: np.ndarray
    _tables: tuple | None = field(default=None, repr=False)

    @property
    def rows(self) -> int:
        return len(self.parent)

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-row option tables for a kernel (built once)."""
        if self._tables is None:
            self._tables = option_tables(self.segments, self.rows)
        return self._tables


@dataclass
class Chunk:
    """A trie small enough for ``max_bytes``: a root row of zeros, then levels."""

    root_width: int
    levels: list

    @property
    def cells(self) -> int:
        """Cell updates the chunk performs (rows x width summed over levels)."""
        return sum(lv.rows * lv.width for lv in self.levels)

    def counted(self, per_cell: int = OPTIONS_PER_CELL) -> int:
        """The chunk's work as the limit counts it: :attr:`cells`, a step of more than
        ``per_cell`` useful options counting ``options / per_cell`` cells a cell."""
        weighted = sum((seg.stop - seg.start) * lv.width * max(len(seg.weights), per_cell)
                       for lv in self.levels for seg in lv.segments)
        return -(-weighted // per_cell)

    @property
    def peak_bytes(self) -> int:
        """Working bytes of the chunk's largest level, as :func:`row_bytes` counts a row."""
        return max((lv.rows * row_bytes(lv.width - 1) for lv in self.levels), default=0)

    @property
    def work(self) -> int:
        """Cell-options the chunk performs (each cell once per option of its row's step)."""
        return sum((seg.stop - seg.start) * lv.width * len(seg.weights) for lv in self.levels for seg in lv.segments)


class Knapsack(NamedTuple):
    """A problem to solve by DP: its ``runs`` of front keys, ``capacity`` and id
    (immutable; a named tuple, as a batch makes one per problem)."""

    runs: tuple
    capacity: int
    ident: int


def row_bytes(capacity: int) -> int:
    """Working bytes one DP row of ``capacity`` needs while its level runs."""
    return ARRAYS_PER_LEVEL * CELL_BYTES * (capacity + 1)


def too_wide(capacity: int, max_bytes: int, bucket: float) -> str:
    """The message for a DP row of ``capacity`` buckets that ``max_bytes`` cannot hold."""
    if max_bytes > row_bytes(MAX_ROW_BUCKETS - 1):
        return (f"one DP row of {format_count(capacity + 1)} buckets is wider than the engine's limit of 2**40 "
                f"buckets, whatever max_bytes allows; use {coarser(bucket, (capacity + 1) / MAX_ROW_BUCKETS)} (--bucket)")
    cells = max_bytes // row_bytes(0) - 1  # widest capacity that fits
    if cells < 1:
        return (f"max_bytes={max_bytes} (--max-memory) is too small for any DP row; "
                f"allow at least {row_bytes(1)} bytes")
    return (f"one DP row of {format_count(capacity + 1)} buckets needs {format_count(row_bytes(capacity))} bytes of "
            f"working memory, over max_bytes={max_bytes}; use {coarser(bucket, (capacity + 1) / cells)} (--bucket), "
            f"or raise max_bytes (--max-memory)")


def plan_chunks(problems: Sequence[Knapsack], max_bytes: int, bucket: float,
                target: int | None = None, what: str | None = None) -> list[list[tuple]]:
    """Group problems by step sequence and cut them into chunks under ``max_bytes``
    and, where that costs little, under ``target`` bytes (default ``max_bytes``;
    a smaller target keeps chunks cache-sized).  A cut makes the next chunk
    compute again the passes its first sequence shares with the one before; the
    target cuts only where those are at most :data:`RECOMPUTE_SHARE` of the
    chunk's own passes, so a deep chain with a branch at every level is not
    computed once per chunk.

    Returns chunks of ``(runs, [(capacity, ident), ...])``, the sequences in the
    order of :func:`_coded`.  A step sequence whose row alone needs more than
    ``target`` gets a chunk of its own; one too wide for ``max_bytes`` raises
    ValueError naming a bucket that would fit.  With ``what`` (the work's name in a
    refusal), a chain of more levels than the work limit's passes allow is refused
    first (:class:`._work.WorkTooLarge`): the chunks are built level by level.
    """
    target = max_bytes if target is None else min(target, max_bytes)
    index: dict[tuple, int] = {}
    group = [index.setdefault(p.runs, len(index)) for p in problems]
    reads: list[list] = [[] for _ in range(len(index))]
    widest = [-1] * len(index)  # Python ints: a capacity may be too large for any array
    for (_, capacity, ident), g in zip(problems, group):
        reads[g].append((capacity, ident))
        if capacity > widest[g]:
            widest[g] = capacity
    sequences = list(index)
    deepest = max(map(sum, map(map, repeat(_COUNT), sequences)), default=0)  # Python ints: exact at any count
    if what is not None and deepest * LEVEL_CELLS > max_cells():
        check_work(0, bucket, what, passes=deepest)
    if deepest >= MAX_STEPS:
        raise ValueError(f"a stage of {format_count(deepest)} layer steps is more than the engine counts (2**62); "
                         "use fewer layers per stage")
    _, order, _, _, shared, depth = _coded(sequences)
    order = order.tolist()
    unit = row_bytes(0)
    need = [unit * (widest[i] + 1) for i in order]
    for i, n in zip(order, need):
        if n > max_bytes or widest[i] >= MAX_ROW_BUCKETS:
            raise ValueError(too_wide(widest[i], max_bytes, bucket))
    chunks: list[list[tuple]] = []
    current: list[tuple] = []
    used = work = 0  # the current chunk's bytes and passes (steps x row bytes)
    held = row = 0  # its working memory, counting a chain of sequences as one row; that row's bytes
    before = 0  # the steps of the sequence before
    for i, n, s, d in zip(order, need, shared.tolist(), depth.tolist()):
        # A sequence that extends the previous one lies on its trie path: one row per level
        # for the whole chain, so against the limit it adds only what it widens that row by.
        # ``s``: the passes a cut here would compute again.
        chained = bool(current) and s == before
        grows = max(n - row, 0) if chained else n
        if current and (held + grows > max_bytes or (used + n > target and s * n <= RECOMPUTE_SHARE * work)):
            chunks.append(current)
            current, used, work, s, held, chained, grows = [], 0, 0, 0, 0, False, n
        row = max(row, n) if chained else n
        before = d
        current.append((sequences[i], reads[i]))
        used += n
        held += grows
        work += (d - s) * n
    if current:
        chunks.append(current)
    return chunks


def _coded(sequences: Sequence[tuple]) -> tuple:
    """Step sequences (tuples of ``(key, count)`` runs of fewer than :data:`MAX_STEPS` steps
    each) as integer rows:
    ``(keys, order, sid, count, shared, depth)``.  Keys are numbered by first
    appearance; ``order`` sorts the sequences as tuples of ``(key number, count)``
    pairs sort (stable); ``sid`` and ``count`` are the sorted runs padded with
    ``(-1, 0)``; per sorted sequence, ``shared`` is how many first steps it has in
    common with the one before (0 for the first) and ``depth`` its steps."""
    n = len(sequences)
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=n)
    flat = list(chain.from_iterable(sequences))
    names = [key for key, _ in flat]
    ids = {key: i for i, key in enumerate(dict.fromkeys(names))}
    width = int(lengths.max()) if n else 0
    sid = np.full((n, width), -1, dtype=np.int64)
    count = np.zeros((n, width), dtype=np.int64)
    at = (np.repeat(np.arange(n), lengths), np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths))
    sid[at] = np.fromiter(map(ids.__getitem__, names), dtype=np.int64, count=len(flat))
    count[at] = np.fromiter((c for _, c in flat), dtype=np.int64, count=len(flat))
    if width:  # the first run's key number is the last (primary) sort key
        order = np.lexsort([col for r in range(width - 1, -1, -1) for col in (count[:, r], sid[:, r])])
        sid, count = sid[order], count[order]
    else:
        order = np.arange(n)
    depth = count.sum(axis=1)
    shared = np.zeros(n, dtype=np.int64)
    if n > 1 and width:
        same_key = sid[1:] == sid[:-1]
        same = same_key & (count[1:] == count[:-1])
        runs = np.where(same.all(axis=1), width, np.argmin(same, axis=1))  # whole runs in common
        steps = np.concatenate([np.zeros((n - 1, 1), dtype=np.int64), np.cumsum(count[1:], axis=1)], axis=1)
        r, k = np.arange(n - 1), np.minimum(runs, width - 1)
        part = (runs < width) & same_key[r, k] & (sid[1:][r, k] >= 0)  # then the shorter of one more run
        shared[1:] = steps[r, runs] + np.where(part, np.minimum(count[1:][r, k], count[:-1][r, k]), 0)
    return list(ids), order, sid, count, shared, depth


def _last_below(values: list) -> np.ndarray:
    """Per position i, the last position j < i with ``values[j] < values[i]`` (-1: none)."""
    out = np.empty(len(values), dtype=np.int64)
    stack: list[tuple] = []  # (value, position), values increasing
    for i, v in enumerate(values):
        while stack and stack[-1][0] >= v:
            stack.pop()
        out[i] = stack[-1][1] if stack else -1
        stack.append((v, i))
    return out


def _source_row(parents: np.ndarray) -> int:
    """The first parent row when ``parents`` are consecutive rows in order, else -1."""
    if len(parents) == 0 or int(parents[-1]) - int(parents[0]) != len(parents) - 1:
        return -1
    return int(parents[0]) if bool((np.diff(parents) == 1).all()) else -1


def build_chunk(entries: Sequence[tuple], table: FrontTable) -> Chunk:
    """Build the trie levels of one chunk of ``(runs, reads)`` entries, in any order.

    Sorted (:func:`_coded`), the steps a sequence shares with any earlier one are
    those it shares with the one just before; it adds a node at each depth below
    those.  The node it branches from is on the path of the last earlier sequence
    that shares fewer steps with its predecessor (every sequence between keeps that
    path down to this depth), so parents, steps, depths and readouts are array
    operations over all nodes.
    """
    keys, order, sid, count, shared, depth = _coded([runs for runs, _ in entries])
    news = depth - shared  # new nodes of each sequence, numbered in order from 1
    ends = np.cumsum(news)
    firsts = ends - news + 1
    nodes = int(ends[-1]) if len(ends) else 0
    last = _last_below(shared.tolist())
    branch = np.where(shared > 0, firsts[last] + shared - shared[last] - 1, 0)  # node at depth `shared`
    grown = news > 0
    parent = np.concatenate(([-1], np.arange(nodes, dtype=np.int64)))  # node i + 1 follows node i ...
    parent[firsts[grown]] = branch[grown]  # ... except the first new node of each sequence
    within = np.arange(nodes, dtype=np.int64) - np.repeat(firsts - 1, news)  # 0.. per sequence
    node_depth = np.concatenate(([0], np.repeat(shared, news) + within + 1))
    padded = sid >= 0
    flat = np.repeat(sid[padded], count[padded])  # every step of every sequence, in order
    step = np.concatenate(([-1], flat[np.repeat(np.cumsum(depth) - depth + shared, news) + within]))
    ordered = [entries[i][1] for i in order.tolist()]
    reads = np.array(list(chain.from_iterable(ordered)), dtype=np.int64).reshape(-1, 2)
    end = np.where(grown, ends, branch)
    read_node = np.repeat(end, np.fromiter(map(len, ordered), dtype=np.int64, count=len(ordered)))
    return _levels_of(parent, step, node_depth, read_node, reads[:, 0].copy(), reads[:, 1].copy(),
                      [table.get(*k) for k in keys])


def _levels_of(parent: np.ndarray, step: np.ndarray, depth: np.ndarray, read_node: np.ndarray,
               read_cap: np.ndarray, read_id: np.ndarray, fronts: list) -> Chunk:
    """A chunk's levels from its trie (``parent``, ``step`` and ``depth`` of every node, node 0
    the root; a parent is numbered before its children) and its readouts ``(node, capacity, id)``."""
    need = np.full(len(parent), -1, dtype=np.int64)
    np.maximum.at(need, read_node, read_cap)
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2))
    for d in range(len(bounds) - 2, 0, -1):  # the widest capacity read below each node
        nodes = order[bounds[d]:bounds[d + 1]]
        np.maximum.at(need, parent[nodes], need[nodes])
    row_of = np.zeros(len(parent), dtype=np.int64)
    levels = []
    for d in range(1, len(bounds) - 1):
        nodes = order[bounds[d]:bounds[d + 1]]
        nodes = nodes[np.lexsort((row_of[parent[nodes]], step[nodes]))]
        row_of[nodes] = np.arange(len(nodes))
        steps = step[nodes]
        cuts = np.flatnonzero(np.diff(steps)) + 1
        starts = np.concatenate(([0], cuts))
        stops = np.concatenate((cuts, [len(nodes)]))
        parents = row_of[parent[nodes]]
        segments = [
            Segment(int(a), int(b), fronts[steps[a]].weights, fronts[steps[a]].times, _source_row(parents[a:b]))
            for a, b in zip(starts.tolist(), stops.tolist())
        ]
        levels.append(Level(parent=parents, width=int(need[nodes].max()) + 1, segments=segments,
                            read_rows=np.empty(0, dtype=np.int64), read_cols=np.empty(0, dtype=np.int64),
                            read_ids=np.empty(0, dtype=np.int64)))
    at = np.lexsort((row_of[read_node], depth[read_node]))  # readouts by level, then row (stable: entry order)
    cuts = np.searchsorted(depth[read_node][at], np.arange(1, len(levels) + 2))
    for d, lv in enumerate(levels):
        mine = at[cuts[d]:cuts[d + 1]]
        lv.read_rows, lv.read_cols, lv.read_ids = row_of[read_node[mine]], read_cap[mine], read_id[mine]
    return Chunk(root_width=int(need.max()) + 1, levels=levels)
