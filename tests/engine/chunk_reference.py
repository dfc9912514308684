"""The trie of a chunk built node by node with a dict: the reference the array-built
chunks of :func:`gpuknap.engine._batch.build_chunk` are compared with (the engine's
builder before issue 24, kept verbatim apart from its name)."""
from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np

from gpuknap.engine._batch import Chunk, Level, _source_row
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
