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
from typing import Hashable, Sequence

import numpy as np

from ._options import FrontTable
from ._passes import Segment, option_tables
from ._work import format_bytes

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


@dataclass(frozen=True)
class Knapsack:
    """A problem to solve by DP: its ``runs`` of front keys, ``capacity`` and id."""

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
    factor = -(-(capacity + 1) // cells)
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
        by_runs.setdefault(p.runs, []).append((p.capacity, p.ident))
    key_ids: dict[Hashable, int] = {}
    for runs in by_runs:
        for key, _ in runs:
            key_ids.setdefault(key, len(key_ids))
    ordered = sorted(by_runs, key=lambda runs: tuple((key_ids[k], n) for k, n in runs))
    chunks: list[list[tuple]] = []
    current: list[tuple] = []
    used = 0
    previous, depth = (), 0  # the sequence before, and its steps
    work = 0  # the current chunk's passes, in steps x row bytes
    held = group = 0  # its working memory, counting a chain of sequences as one row; that row's bytes
    for runs in ordered:
        reads = by_runs[runs]
        need = row_bytes(max(c for c, _ in reads))
        if need > max_bytes:
            raise ValueError(too_wide(need // row_bytes(0) - 1, max_bytes, bucket))
        # A sequence that extends the previous one lies on its trie path: one row per level
        # for the whole chain, so against the limit it adds only what it widens that row by.
        shared = _shared_steps(runs, previous)  # passes a cut here would compute again
        chained = bool(current) and shared == depth  # it extends the previous sequence
        grows = max(need - group, 0) if chained else need
        if current and (held + grows > max_bytes
                        or (used + need > target and shared * need <= RECOMPUTE_SHARE * work)):
            chunks.append(current)
            current, used, work, shared, held, chained, grows = [], 0, 0, 0, 0, False, need
        group = max(group, need) if chained else need
        previous, depth = runs, sum(n for _, n in runs)
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
    """Build the trie levels of one chunk of ``(runs, reads)`` entries."""
    parent = [-1]
    step = [-1]
    depth = [0]
    need = [-1]
    reads_at: dict[int, list] = {}
    children: dict[tuple, int] = {}
    key_ids: dict[Hashable, int] = {}
    keys: list[Hashable] = []
    for runs, reads in entries:
        node = 0
        for key, count in runs:
            sid = key_ids.get(key)
            if sid is None:
                sid = key_ids[key] = len(keys)
                keys.append(key)
            for _ in range(count):
                child = children.get((node, sid))
                if child is None:
                    child = children[(node, sid)] = len(parent)
                    parent.append(node)
                    step.append(sid)
                    depth.append(depth[node] + 1)
                    need.append(-1)
                node = child
        need[node] = max(need[node], max(c for c, _ in reads))
        reads_at.setdefault(node, []).extend(reads)
    for node in range(len(parent) - 1, 0, -1):
        if need[node] > need[parent[node]]:
            need[parent[node]] = need[node]
    parent_a = np.asarray(parent)
    step_a = np.asarray(step)
    depth_a = np.asarray(depth)
    need_a = np.asarray(need)
    fronts = [table.get(*k) for k in keys]
    row_of = np.zeros(len(parent), dtype=np.int64)
    levels = []
    for d in range(1, int(depth_a.max()) + 1):
        nodes = np.flatnonzero(depth_a == d)
        nodes = nodes[np.lexsort((row_of[parent_a[nodes]], step_a[nodes]))]
        row_of[nodes] = np.arange(len(nodes))
        steps = step_a[nodes]
        cuts = np.flatnonzero(np.diff(steps)) + 1
        starts = np.concatenate(([0], cuts))
        stops = np.concatenate((cuts, [len(nodes)]))
        parents = row_of[parent_a[nodes]]
        segments = [
            Segment(int(a), int(b), fronts[steps[a]].weights, fronts[steps[a]].times, _source_row(parents[a:b]))
            for a, b in zip(starts.tolist(), stops.tolist())
        ]
        rr, rc, ri = [], [], []
        for r, node in enumerate(nodes.tolist()):
            for cap, ident in reads_at.get(node, ()):
                rr.append(r)
                rc.append(cap)
                ri.append(ident)
        levels.append(Level(
            parent=parents.copy(),
            width=int(need_a[nodes].max()) + 1,
            segments=segments,
            read_rows=np.asarray(rr, dtype=np.int64),
            read_cols=np.asarray(rc, dtype=np.int64),
            read_ids=np.asarray(ri, dtype=np.int64),
        ))
    return Chunk(root_width=int(need_a.max()) + 1, levels=levels)
