"""References for the engine's chunks, kept verbatim apart from their names:

- the trie of a chunk built node by node with a dict, which the array-built chunks of
  :func:`gpuknap.engine._batch.build_chunk` are compared with (the engine's builder
  before issue 24);
- the chunk plan made one sequence at a time with Python tuples, which
  :func:`gpuknap.engine._batch.plan_chunks` (sequences coded and compared as integer
  arrays since 2026-12-03) is compared with."""
from __future__ import annotations

from operator import itemgetter
from typing import Hashable, Sequence

import numpy as np

from gpuknap.engine._batch import RECOMPUTE_SHARE, Chunk, Knapsack, Level, _source_row, row_bytes, too_wide
from gpuknap.engine._options import FrontTable
from gpuknap.engine._passes import Segment


def build_chunk_by_dict(entries: Sequence[tuple], table: FrontTable) -> Chunk:
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


def plan_chunks_by_loop(problems: Sequence[Knapsack], max_bytes: int, bucket: float,
                        target: int | None = None) -> list[list[tuple]]:
    """:func:`gpuknap.engine._batch.plan_chunks` one sequence at a time (its contract)."""
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
