"""The batched engine: knapsack problems -> trie chunks -> passes -> readouts.

Backend-independent apart from :meth:`Backend.pass_level`: a chunk's index
arrays and option tables are uploaded once, each level is one pass over all
of its rows, and only the readouts come back to the host.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .backend import Backend
from .batch import Chunk, Knapsack, build_chunk, plan_chunks
from .limits import check_work
from .options import FrontTable, check_int
from .progress import report


def _upload(backend: Backend, chunk: Chunk) -> list[tuple]:
    """Per level: ``(parent, tables, read_rows, read_cols)`` on the backend."""
    xp = backend.xp
    levels = chunk.levels
    parents = xp.asarray(np.concatenate([lv.parent for lv in levels]))
    reads_r = xp.asarray(np.concatenate([lv.read_rows for lv in levels]))
    reads_c = xp.asarray(np.concatenate([lv.read_cols for lv in levels]))
    tables = [None] * len(levels)
    if backend.uses_tables:
        n_opt = max(lv.tables()[0].shape[1] for lv in levels)
        ws, ts = [], []
        for lv in levels:
            w, t = lv.tables()
            pad = n_opt - w.shape[1]
            ws.append(np.pad(w, ((0, 0), (0, pad))))
            ts.append(np.pad(t, ((0, 0), (0, pad)), constant_values=np.inf))
        w_all, t_all = xp.asarray(np.concatenate(ws)), xp.asarray(np.concatenate(ts))
    out = []
    row0 = read0 = 0
    for i, lv in enumerate(levels):
        rows, reads = lv.rows, len(lv.read_ids)
        if backend.uses_tables:
            tables[i] = (w_all[row0:row0 + rows], t_all[row0:row0 + rows])
        out.append((parents[row0:row0 + rows], tables[i], reads_r[read0:read0 + reads], reads_c[read0:read0 + reads]))
        row0 += rows
        read0 += reads
    return out


def run_chunk(backend: Backend, chunk: Chunk, on_level: Callable[[int], None] | None = None) -> np.ndarray:
    """All readouts of a chunk, in the order of its levels' ``read_ids``;
    ``on_level(cells)`` is called after each level."""
    xp = backend.xp
    prev = xp.zeros((1, chunk.root_width), dtype=xp.float64)
    values = []
    for lv, (parent, tables, rr, rc) in zip(chunk.levels, _upload(backend, chunk)):
        prev = backend.pass_level(prev, parent, lv, tables)
        if len(lv.read_ids):
            values.append(prev[rr, rc])
        if on_level is not None:
            on_level(lv.rows * lv.width)
    if not values:
        return np.empty(0)
    return backend.to_host(xp.concatenate(values))


def solve_knapsacks(problems: Sequence[Knapsack], table: FrontTable, backend: Backend,
                    max_bytes: int | None, n_ids: int) -> np.ndarray:
    """Least bucketed time of every problem, indexed by ``Knapsack.ident``.

    Entries of ids not among ``problems`` stay ``inf``.
    """
    values = np.full(n_ids, np.inf)
    if not problems:
        return values
    limit = backend.default_max_bytes() if max_bytes is None else check_max_bytes(max_bytes)
    if backend.is_gpu and max_bytes is not None:  # never more than the device has free
        limit = min(limit, backend.default_max_bytes())
    chunks = [build_chunk(entries, table)
              for entries in plan_chunks(problems, limit, table.bucket, backend.chunk_bytes(limit))]
    total = sum(chunk.cells for chunk in chunks)
    check_work(total, table.bucket, f"solving {len(problems):,} stage problems")
    done = 0

    def tick(cells: int) -> None:
        nonlocal done
        done += cells
        report("DP passes", done, total)

    for chunk in chunks:
        ids = np.concatenate([lv.read_ids for lv in chunk.levels])
        values[ids] = run_chunk(backend, chunk, tick)
    return values


def check_max_bytes(max_bytes: object) -> int:
    """Validate ``max_bytes``: a positive integer number of bytes."""
    return check_int(max_bytes, "max_bytes (bytes, or None)", 1)
