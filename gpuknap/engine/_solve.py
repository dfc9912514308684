"""The batched engine: stage problems -> knapsacks -> trie chunks -> passes -> readouts.

:func:`solve_problems` answers distinct stage problems (all-fastest and
infeasible ones without any pass), :func:`solve_knapsacks` the rest as one
batch.  Backend-independent apart from :meth:`Backend.pass_level`: a chunk's
index arrays and option tables are uploaded once, each level is one pass over
all of its rows, and only the readouts come back to the host.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ._backend import Backend, available_host_bytes, get_backend
from ._batch import Chunk, Knapsack, build_chunk, plan_chunks
from ._options import FrontTable, check_int
from ._passes import MAX_TABLE_WIDTH
from ._problem import FASTEST, KNAPSACK, StageProblem, verdict
from ._work import check_work, format_bytes, paused_collection, report


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


def run_chunk(backend: Backend, chunk: Chunk, on_level: Callable[[int], None] | None = None,
              fused: Any = None, workspace: Any = None) -> np.ndarray:
    """All readouts of a chunk, in the order of its levels' ``read_ids``;
    ``on_level(cells)`` is called after each level (each group of levels when fused).
    ``fused``: the compiled CPU pass's module (:meth:`Backend.fused`), which then runs
    the whole chunk, reusing the buffers of ``workspace``."""
    if fused is not None:
        return fused.run_chunk(chunk, on_level, workspace)
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
    what = f"solving {len(problems):,} stage problem" + ("s" if len(problems) > 1 else "")
    # a chain of too many levels is refused by the plan, before any chunk is built level by level
    chunks = [build_chunk(entries, table)
              for entries in plan_chunks(problems, limit, table.bucket, backend.chunk_bytes(limit), what)]
    total = sum(chunk.cells for chunk in chunks)  # progress counts cells; the limit weighs wide option sets
    check_work(sum(chunk.counted(backend.options_per_cell) for chunk in chunks), table.bucket, what,
               passes=sum(len(chunk.levels) for chunk in chunks))
    if not backend.is_gpu and max_bytes is not None:  # a limit over what the machine has: refused, not run out of
        need, free = max(chunk.peak_bytes for chunk in chunks), available_host_bytes()
        if need > free:  # counted as the plan counts max_bytes (the passes use a half to three quarters of it)
            raise ValueError(f"{what} needs {format_bytes(need)} of working memory in one chunk, more than the "
                             f"{format_bytes(free)} this machine has available; lower max_bytes (--max-memory) so "
                             "the batch is cut into smaller chunks, or use a larger bucket (--bucket)")
    widest = max(chunk.root_width for chunk in chunks)
    if backend.uses_tables and widest > MAX_TABLE_WIDTH:
        raise ValueError(f"a stage of {widest:,} buckets is wider than the {backend.name} pass's 32-bit option "
                         f"weights allow ({MAX_TABLE_WIDTH:,}); use a larger bucket (--bucket)")
    done = 0

    def tick(cells: int) -> None:
        nonlocal done
        done += cells
        report("DP passes", done, total)

    fused = backend.fused(lambda: sum(chunk.work for chunk in chunks))
    workspace = fused.Workspace() if fused is not None else None
    for chunk in chunks:
        ids = np.concatenate([lv.read_ids for lv in chunk.levels])
        values[ids] = run_chunk(backend, chunk, tick, fused, workspace)
    return values


def check_max_bytes(max_bytes: object) -> int:
    """Validate ``max_bytes``: a positive integer number of bytes."""
    return check_int(max_bytes, "max_bytes (bytes, or None)", 1)


@paused_collection()
def solve_problems(problems: Sequence[StageProblem], table: FrontTable, backend: str | None,
                   max_bytes: int | None, verdicts: Sequence[Any] | None = None,
                   known: "Solved | None" = None) -> np.ndarray:
    """Least time of every distinct stage problem (``inf`` where none fits);
    ``verdicts`` are the problems' verdicts when the caller has them already.
    ``known``: a :class:`Solved` of the problems solved before with this table,
    whose times are taken from there; the problems solved now are added to it
    (the rounds of a search)."""
    values = np.full(len(problems), np.inf)
    times = known.times() if known else None
    if times:  # problems solved in an earlier round keep their time
        found = [times.get(problem) for problem in problems]
        new = [i for i, t in enumerate(found) if t is None]
        old = [i for i, t in enumerate(found) if t is not None]
        values[old] = [found[i] for i in old]
    else:
        new = range(len(problems))
    knapsacks, fast, fast_times = [], [], []
    for ident in new:
        how = verdict(problems[ident], table) if verdicts is None else verdicts[ident]
        kind = how.kind
        if kind == KNAPSACK:
            knapsacks.append(Knapsack(problems[ident].runs, how.capacity, ident))
        elif kind == FASTEST:
            fast.append(ident)
            fast_times.append(how.time)
    values[fast] = fast_times
    if knapsacks:
        solved = solve_knapsacks(knapsacks, table, get_backend(backend), max_bytes, len(problems))
        idents = [k.ident for k in knapsacks]
        values[idents] = solved[idents]
    if known is not None:
        known.add([problems[i] for i in new], values[new])
    return values


class Solved:
    """Times of stage problems solved in earlier rounds of a search, for
    :func:`solve_problems`.  Problems are hashed only once a later round asks,
    so a search that ends in one round pays nothing for it."""

    def __init__(self) -> None:
        self._pending: list = []
        self._times: dict = {}

    def __bool__(self) -> bool:
        return bool(self._pending or self._times)

    def __len__(self) -> int:
        return len(self.times())

    def add(self, problems: Sequence[Any], values: np.ndarray) -> None:
        self._pending.append((problems, values))

    def times(self) -> dict:
        """``{problem: least time}`` of every problem added."""
        for problems, values in self._pending:
            self._times.update(zip(problems, values.tolist()))
        self._pending.clear()
        return self._times
