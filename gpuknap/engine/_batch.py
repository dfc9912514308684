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
from operator import itemgetter
from typing import Hashable, NamedTuple, Sequence

import numpy as np

from ._options import FrontTable
from ._passes import Segment, option_tables
from ._work import OPTIONS_PER_CELL, bucket_factor, format_bytes

#: Most passes a cut at the cache target may compute again, as a share of the chunk before it.
RECOMPUTE_SHARE = 0.25
#: Working arrays alive during one level (previous, gathered, output, temporary).
ARRAYS_PER_LEVEL = 4
CELL_BYTES = 8


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
    cells = max_bytes // row_bytes(0) - 1  # widest capacity that fits
    if cells < 1:
        return (f"max_bytes={max_bytes} (--max-memory) is too small for any DP row; "
                f"allow at least {row_bytes(1)} bytes")
    factor = bucket_factor((capacity + 1) / cells)
    return (f"one DP row of {capacity + 1} buckets needs {row_bytes(capacity)} bytes of working memory, "
            f"over max_bytes={max_bytes}; use a bucket of at least {format_bytes(bucket * factor)} (--bucket), "
            f"or raise max_bytes (--max-memory)")


def plan_chunks(problems: Sequence[Knapsack], max_bytes: int, bucket: float,
                target: int | None = None) -> list[list[tuple]]:
    """Group problems by step sequence and cut them into chunks under ``max_bytes``
    and, where that costs little, under ``target`` bytes (default ``max_bytes``;
    a smaller target keeps chunks cache-sized).  A cut makes the next chunk
    compute again the passes its first sequence shares with the one before; the
    target cuts only where those are at most :data:`RECOMPUTE_SHARE` of the
    chunk's own passes, so a deep chain with a branch at every level is not
    computed once per chunk.

    Returns chunks of ``(runs, [(capacity, ident), ...])``.  A step sequence
    whose row alone needs more than ``target`` gets a chunk of its own; one too
    wide for ``max_bytes`` raises ValueError naming a bucket that would fit.
    """
    target = max_bytes if target is None else min(target, max_bytes)
    by_runs: dict[tuple, list] = {}
    for p in problems:
        reads = by_runs.get(p.runs)
        if reads is None:
            by_runs[p.runs] = [(p.capacity, p.ident)]
        else:
            reads.append((p.capacity, p.ident))
    key_ids: dict[Hashable, int] = {}
    coded = []
    for runs in by_runs:
        coded.append((tuple([(key_ids.setdefault(k, len(key_ids)), n) for k, n in runs]), runs))
    coded.sort(key=itemgetter(0))
    unit = row_bytes(0)
    chunks: list[list[tuple]] = []
    current: list[tuple] = []
    used = 0
    previous, depth = (), 0  # the sequence before (coded), and its steps
    work = 0  # the current chunk's passes, in steps x row bytes
    held = group = 0  # its working memory, counting a chain of sequences as one row; that row's bytes
    for code, runs in coded:
        reads = by_runs[runs]
        need = unit * (max([c for c, _ in reads]) + 1)
        if need > max_bytes:
            raise ValueError(too_wide(need // unit - 1, max_bytes, bucket))
        # A sequence that extends the previous one lies on its trie path: one row per level
        # for the whole chain, so against the limit it adds only what it widens that row by.
        shared = _shared_steps(code, previous)  # passes a cut here would compute again
        chained = bool(current) and shared == depth  # it extends the previous sequence
        grows = max(need - group, 0) if chained else need
        if current and (held + grows > max_bytes
                        or (used + need > target and shared * need <= RECOMPUTE_SHARE * work)):
            chunks.append(current)
            current, used, work, shared, held, chained, grows = [], 0, 0, 0, 0, False, need
        group = max(group, need) if chained else need
        depth = 0
        for _, n in code:
            depth += n
        previous = code
        current.append((runs, reads))
        used += need
        held += grows
        work += (depth - shared) * need
    if current:
        chunks.append(current)
    return chunks


def _shared_steps(runs: tuple, previous: tuple) -> int:
    """How many first steps ``runs`` and ``previous`` have in common."""
    steps = 0
    for (key, n), (other, m) in zip(runs, previous):
        if key != other:
            break
        steps += min(n, m)
        if n != m:
            break
    return steps


def _source_row(parents: np.ndarray) -> int:
    """The first parent row when ``parents`` are consecutive rows in order, else -1."""
    if len(parents) == 0 or int(parents[-1]) - int(parents[0]) != len(parents) - 1:
        return -1
    return int(parents[0]) if bool((np.diff(parents) == 1).all()) else -1


def build_chunk(entries: Sequence[tuple], table: FrontTable) -> Chunk:
    """Build the trie levels of one chunk of ``(runs, reads)`` entries.

    The entries are ordered by their runs (as :func:`plan_chunks` orders them):
    then the steps a sequence shares with any earlier one are those it shares
    with the one just before, so only that pair is compared, run by run, and
    the sequence's new nodes are numbered in one go; parents, steps and widths
    are then array operations over all nodes.
    """
    key_ids: dict[Hashable, int] = {}
    keys: list[Hashable] = []
    coded = []
    for runs, reads in entries:
        row = []
        for key, count in runs:
            sid = key_ids.get(key)
            if sid is None:
                sid = key_ids[key] = len(keys)
                keys.append(key)
            row.append((sid, count))
        coded.append((tuple(row), reads))
    coded.sort(key=lambda entry: entry[0])
    path = [0]  # the node at each depth of the sequence before
    previous: tuple = ()
    count = steps = 0  # nodes numbered so far (after the root), steps of every sequence so far
    first_parent, shared_at, news, seq_from = [], [], [], []
    run_sids, run_counts = [], []
    read_node, read_cap, read_id = [], [], []
    for runs, reads in coded:
        shared = 0
        for (sid, n), (other, m) in zip(runs, previous):
            if sid != other:
                break
            shared += min(n, m)
            if n != m:
                break
        depth = 0
        for sid, n in runs:
            run_sids.append(sid)
            run_counts.append(n)
            depth += n
        if depth > shared:  # new nodes count + 1 .. count + new at depths shared + 1 .. depth
            first_parent.append(path[shared])
            shared_at.append(shared)
            news.append(depth - shared)
            seq_from.append(steps + shared)
            del path[shared + 1:]
            path.extend(range(count + 1, count + 1 + depth - shared))
            count += depth - shared
        elif len(path) > depth + 1:
            del path[depth + 1:]
        steps += depth
        end = path[depth]
        for cap, ident in reads:
            read_node.append(end)
            read_cap.append(cap)
            read_id.append(ident)
        previous = runs
    news_a = np.asarray(news, dtype=np.int64)
    within = np.arange(count, dtype=np.int64) - np.repeat(np.cumsum(news_a) - news_a, news_a)  # 0.. per sequence
    parent = np.concatenate(([-1], np.arange(count, dtype=np.int64)))  # node i + 1 follows node i ...
    firsts = np.cumsum(news_a) - news_a + 1
    parent[firsts] = first_parent  # ... except the first new node of each sequence
    depth = np.concatenate(([0], np.repeat(np.asarray(shared_at, dtype=np.int64), news_a) + within + 1))
    flat = np.repeat(np.asarray(run_sids, dtype=np.int64), np.asarray(run_counts, dtype=np.int64))
    step = np.concatenate(([-1], flat[np.repeat(np.asarray(seq_from, dtype=np.int64), news_a) + within]))
    return _levels_of(parent, step, depth, np.asarray(read_node, dtype=np.int64),
                      np.asarray(read_cap, dtype=np.int64), np.asarray(read_id, dtype=np.int64),
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
