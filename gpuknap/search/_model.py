"""A model split into pipeline stages (the contract's 1F1B model level).

``PipelineModel`` holds the kind of every layer in order, the options of each
kind, each kind's static bytes per layer, the device capacity, the reserved
bytes and the number of micro-batches.  A split is a list of layer counts.

Interleaved (virtual) pipelines: with ``chunks=v`` a split has ``P * v``
counts given chunk by chunk -- chunk 0 of stages 0..P-1, then chunk 1 of
stages 0..P-1, and so on -- so the model's layers run through the devices v
times.  A device's stage holds the layers of all its chunks and pays their
static bytes from one budget; the in-flight count is then given per (stage,
chunk) by a table ``in_flight[s][c]``: given, or by default the peak number of
micro-batches alive under Megatron's interleaved 1F1B (:mod:`gpuknap.schedule`).
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from ..engine import (
    MEGABYTE,
    FrozenMap,
    Layers,
    PipelineChoice,
    Planner,
    Ranking,
    Stage,
    check_bucket,
    check_groups,
    check_int,
    check_max_bytes,
    check_number,
    get_backend,
    option_times,
    own_fronts,
    paused_collection,
    pp_lite,
    short,
)
from ..schedule import in_flight_table
from ._classify import kind_counts
from ._ranking import rank_interleaved, rank_plain

#: Most layers a model may have (a bound checked before anything is allocated).
MAX_LAYERS = 1_000_000
#: Stage objects remembered by ``stages`` (the cache is emptied when it grows past this).
STAGE_CACHE = 1 << 18
#: Most micro-batches (and so in-flight counts) a model may have.
MAX_IN_FLIGHT = 1_000_000
#: Rows of a splits array validated at a time.
SPLIT_BLOCK = 1 << 15


def _distinct_names(kind: Hashable, options: Sequence) -> None:
    """ValueError naming the option when two options of ``kind`` share a name (a plan names each
    layer's option: the timelines, estimates and settings read it back by name)."""
    seen: dict = {}
    for j, option in enumerate(options):
        name = getattr(option, "name", None)
        try:
            first = seen.setdefault(name, j) if name is not None else j
        except TypeError:  # an unhashable name of an option-like object: nothing can look it up
            raise ValueError(f"fronts[{kind!r}][{j}].name must be hashable, got {short(name)}") from None
        if first != j:
            raise ValueError(f"fronts[{kind!r}][{j}].name: {short(name)} is also the name of fronts[{kind!r}]"
                             f"[{first}]; names must differ")


@dataclass(frozen=True)
class PipelineModel:
    """Layers in order (``kinds``), their options (``fronts``) and static bytes
    per layer of each kind (``static``), the device ``capacity`` and
    ``reserved`` bytes, and ``micro_batches`` per iteration.  ``costs``: what a cost model
    knows beyond the options (device, parallel sizes, FLOPs, communication; a
    :class:`gpuknap.costs.ModelCosts`), or None for measured profiles; the search never reads it."""

    kinds: tuple
    fronts: Mapping
    static: Mapping
    capacity: float
    micro_batches: int
    reserved: float = 0.0
    costs: Any = field(default=None, repr=False, compare=False)
    _order: tuple = field(init=False, repr=False, compare=False)
    _stages: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if isinstance(self.kinds, (str, bytes)) or not hasattr(self.kinds, "__iter__"):
            raise ValueError(f"kinds must be a sequence of layer kinds, got {type(self.kinds).__name__}")
        kinds = tuple(self.kinds)
        object.__setattr__(self, "kinds", kinds)
        if not kinds:
            raise ValueError("kinds must list at least one layer")
        if not isinstance(self.fronts, Mapping) or not isinstance(self.static, Mapping):
            raise ValueError("fronts and static must be mappings from kind")
        # own read-only copies: a caller changing its dicts (or option lists) later must not change
        # this model, nor may an edit through the model (its stages are cached)
        object.__setattr__(self, "fronts", own_fronts(self.fronts))
        object.__setattr__(self, "static", FrozenMap(self.static))
        order: list[Hashable] = []
        seen: set = set()
        for i, kind in enumerate(kinds):
            try:
                if kind not in seen:
                    seen.add(kind)
                    order.append(kind)
            except TypeError:
                raise ValueError(f"kinds[{i}] is not hashable: {kind!r}") from None
        for kind in order:
            if kind not in self.fronts:
                raise ValueError(f"kind {kind!r} is missing from fronts")
            option_times(kind, self.fronts[kind])  # options and their times now; memory per count on use
            _distinct_names(kind, self.fronts[kind])
            if kind not in self.static:
                raise ValueError(f"kind {kind!r} is missing from static")
            value = check_number(self.static[kind], f"static[{kind!r}]")
            if value < 0:
                raise ValueError(f"static[{kind!r}] must be >= 0, got {value!r}")
        if len(kinds) > MAX_LAYERS:
            raise ValueError(f"kinds: {len(kinds):,} layers is over the limit of {MAX_LAYERS:,}")
        check_number(self.capacity, "capacity")
        check_number(self.reserved, "reserved")
        if self.capacity <= 0:
            raise ValueError(f"capacity must be > 0 bytes, got {self.capacity!r}")
        if not 0 <= self.reserved < self.capacity:
            raise ValueError(f"reserved must be >= 0 and below capacity ({self.capacity!r}), got {self.reserved!r}")
        check_int(self.micro_batches, "micro_batches", 1)
        if self.micro_batches > MAX_IN_FLIGHT:
            raise ValueError(f"micro_batches must be at most {MAX_IN_FLIGHT:,}, got {self.micro_batches!r}")
        object.__setattr__(self, "_order", tuple(order))
        object.__setattr__(self, "_stages", {})

    @property
    def layers(self) -> int:
        """Number of layers."""
        return len(self.kinds)

    @property
    def kind_order(self) -> tuple:
        """Distinct kinds in order of first appearance in the model."""
        return self._order

    def default_in_flight(self, stages: int) -> list[list[int]]:
        """1F1B: stage s of P keeps ``min(P - s, M)`` micro-batches in flight."""
        check_int(stages, "stages", 1)
        return [[min(stages - s, self.micro_batches)] for s in range(stages)]

    def in_flight_table(self, stages: int, chunks: int, in_flight: Any = None) -> list[list[int]]:
        """Validated in-flight counts ``[stage][chunk]``."""
        check_int(stages, "stages", 1)
        check_int(chunks, "chunks", 1)
        if in_flight is None:
            if chunks > 1:  # Megatron's interleaved schedule: the peak micro-batches alive per chunk
                return in_flight_table(stages, chunks, self.micro_batches)
            return self.default_in_flight(stages)
        if isinstance(in_flight, (str, bytes)) or not isinstance(in_flight, (Sequence, np.ndarray)):
            raise ValueError(f"in_flight must be {stages} rows of {chunks} counts (stages x chunks), got {in_flight!r}")
        table = [list(row) if isinstance(row, (Sequence, np.ndarray)) else [row] for row in in_flight]
        if len(table) != stages or any(len(row) != chunks for row in table):
            raise ValueError(f"in_flight must have {stages} rows of {chunks} counts (stages x chunks)")
        for s, row in enumerate(table):
            for c, k in enumerate(row):
                check_int(k, f"in_flight[{s}][{c}]", 1)
                if k > MAX_IN_FLIGHT:
                    raise ValueError(f"in_flight[{s}][{c}] must be at most {MAX_IN_FLIGHT:,}, got {k!r}")
        return [[int(k) for k in row] for row in table]

    def check_counts(self, counts: Any, chunks: int = 1) -> list[int]:
        """Validate one split: counts >= 1 summing to the layer count, P * chunks of them."""
        check_int(chunks, "chunks", 1)
        if isinstance(counts, (str, bytes)) or not hasattr(counts, "__iter__"):
            raise ValueError(f"counts must be a sequence of layer counts, got {type(counts).__name__}")
        counts = [int(n) if isinstance(n, (int, np.integer)) and not isinstance(n, bool) else n for n in counts]
        if not counts or len(counts) % chunks:
            raise ValueError(f"counts must have a positive multiple of chunks={chunks} entries, got {len(counts)}")
        for s, n in enumerate(counts):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"counts[{s}] must be an integer >= 1, got {n!r}")
        if sum(counts) != self.layers:
            raise ValueError(f"counts sum to {sum(counts)}, the model has {self.layers} layers")
        return counts

    def segment_groups(self, start: int, stop: int, in_flight: int) -> list[Layers]:
        """Groups of layers ``start:stop``: one per kind, in order of first appearance."""
        check_int(start, "start", 0)
        check_int(stop, "stop", start)
        check_int(in_flight, "in_flight", 1)
        if stop > self.layers:
            raise ValueError(f"stop must be at most the model's {self.layers} layers, got {stop!r}")
        return self._groups(start, stop, in_flight)

    def _groups(self, start: int, stop: int, in_flight: int) -> list[Layers]:
        """:meth:`segment_groups` of arguments the search has checked (its hot path)."""
        return [Layers(kind, n, in_flight) for kind, n in kind_counts(self.kinds[start:stop])]

    def budget_of(self, groups: Sequence[Layers]) -> float:
        """``capacity - reserved - static bytes of the groups' layers``."""
        groups = check_groups(groups)
        for i, g in enumerate(groups):
            try:
                known = g.kind in self.static
            except TypeError:  # unhashable
                known = False
            if not known:
                raise ValueError(f"groups[{i}].kind {g.kind!r} is not a kind of this model")
        return self._budget(groups)

    def _budget(self, groups: Sequence[Layers]) -> float:
        """:meth:`budget_of` of groups the search built (its hot path)."""
        static = 0.0
        for g in groups:
            static += g.count * float(self.static[g.kind])
        return self.capacity - self.reserved - static

    def stages(self, counts: Sequence[int], in_flight: Any = None, chunks: int = 1) -> list[Stage]:
        """The stages of a split, as the contract builds them."""
        counts = self.check_counts(counts, chunks)
        p = len(counts) // chunks
        table = self.in_flight_table(p, chunks, in_flight)
        bounds = list(accumulate(counts, initial=0))
        out = []
        cache = self._stages
        if len(cache) > STAGE_CACHE:
            cache.clear()
        for s in range(p):
            key = tuple((bounds[c * p + s], bounds[c * p + s + 1], table[s][c]) for c in range(chunks))
            stage = cache.get(key)
            if stage is None:  # equal segments share one Stage object (rank dedups objects first)
                groups = [g for a, b, k in key for g in self._groups(a, b, k)]
                stage = cache[key] = Stage(groups, self._budget(groups))
            out.append(stage)
        return out

    def furthest_over(self, counts: Sequence[int], in_flight: Any = None, chunks: int = 1) -> tuple[int, float]:
        """``(stage, bytes)``: the stage whose lightest options exceed its budget most, and by how
        much (``<= 0``: every stage fits with its lightest options, before rounding to buckets)."""
        worst, over = 0, -math.inf
        for s, stage in enumerate(self.stages(counts, in_flight, chunks)):
            lightest = sum(g.count * min(o.memory(g.in_flight) for o in self.fronts[g.kind]) for g in stage.groups)
            if lightest - stage.budget > over:
                worst, over = s, lightest - stage.budget
        return worst, over

    def plan(self, counts: Sequence[int], bucket: float | None = None, in_flight: Any = None,
             chunks: int = 1) -> list[str | None] | None:
        """Every layer's chosen option name in model order, or None if infeasible.

        Within a stage (chunk), a kind's layers take its chosen options slowest first.
        """
        stages = self.stages(counts, in_flight, chunks)
        choice = pp_lite(stages, self.fronts, MEGABYTE if bucket is None else bucket)
        return None if choice is None else self.option_names(counts, choice, in_flight, chunks)

    def option_names(self, counts: Sequence[int], choice: Any, in_flight: Any = None,
                     chunks: int = 1) -> list[str]:
        """Every layer's option name in model order for a solved split (``choice`` a
        PipelineChoice of ``self.stages(counts, in_flight, chunks)``); within a stage
        (chunk), a kind's layers take its chosen options slowest first."""
        counts = self.check_counts(counts, chunks)
        p = len(counts) // chunks
        if not isinstance(choice, PipelineChoice) or len(choice.stages) != p:
            raise ValueError(f"choice must be the PipelineChoice of these {p} stages, got {type(choice).__name__}")
        queues: dict[tuple, list] = {}
        for s, sc in enumerate(choice.stages):
            for a in sc.assignments:
                key = (s, a.layers.kind, a.layers.in_flight)
                queues.setdefault(key, []).extend([getattr(a.option, "name", str(a.option))] * a.count)
        table = self.in_flight_table(p, chunks, in_flight)
        names: list[str] = []
        bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
        for c in range(chunks):
            for s in range(p):
                i = c * p + s
                for kind in self.kinds[bounds[i]:bounds[i + 1]]:
                    queue = queues.get((s, kind, table[s][c]))
                    if not queue:
                        raise ValueError(f"choice is not a solution of counts {counts}: stage {s} chooses "
                                         f"for other layers")
                    names.append(queue.pop(0))
        return names

    def check_splits(self, splits: Any, chunks: int = 1, where: Any = None) -> np.ndarray:
        """Validate an integer array ``[B, P * chunks]`` of layer counts (returned as int64).

        Errors name a row as ``where(row)`` (default ``"splits row i"``)."""
        return self._valid_splits(splits, chunks, where).astype(np.int64, copy=False)

    def _valid_splits(self, splits: Any, chunks: int = 1, where: Any = None, rows: bool = True) -> np.ndarray:
        """:meth:`check_splits` without converting the array: checked a block of rows at a
        time, so no copy of a large batch is made (integer or integral float dtypes).
        ``rows=False``: the shape and dtype only (the caller checks the rows as it reads them)."""
        where = where or (lambda row: f"splits row {row}")
        if not callable(where):
            raise ValueError(f"where must be a function of the row index naming it, got {where!r}")
        check_int(chunks, "chunks", 1)
        try:
            arr = np.asarray(splits)
        except (ValueError, TypeError):
            raise ValueError("splits must be a 2-D integer array [B, P*chunks] (rows of equal length)") from None
        if arr.ndim != 2 or arr.shape[1] == 0 or arr.shape[1] % chunks:
            raise ValueError(f"splits must be a 2-D integer array [B, P*chunks], got shape {arr.shape}")
        if arr.dtype.kind not in "iuf":
            raise ValueError(f"splits must hold integer layer counts, got dtype {arr.dtype}")
        for lo in range(0, len(arr) if rows else 0, SPLIT_BLOCK):
            self._check_block(arr[lo:lo + SPLIT_BLOCK], lo, where)
        return arr

    def _check_block(self, block: np.ndarray, lo: int, where: Any) -> None:
        """Validate rows ``lo:lo + len(block)`` of a splits array."""
        if block.dtype.kind == "f":
            if not (np.isfinite(block).all() and (block == np.round(block)).all()):
                raise ValueError(f"splits must hold integer layer counts, got dtype {block.dtype}")
        over = np.flatnonzero((block > self.layers).any(axis=1)) if block.size else ()
        if len(over):  # said before any clipping, with the count as given
            row = int(over[0])
            count = block[row][block[row] > self.layers][0]
            raise ValueError(f"{where(lo + row)} has a count of {count.item()!r}, more than the model's "
                             f"{self.layers} layers")
        if block.dtype.kind == "f":
            block = np.clip(block, -1, self.layers + 1).astype(np.int64)  # out-of-range counts stay out of range
        elif block.dtype.kind == "u" or block.dtype.itemsize > 8:
            block = np.clip(block, 0, self.layers + 1)
        block = block.astype(np.int64, copy=False)
        bad = np.flatnonzero(block.min(axis=1, initial=1) < 1) if block.size else np.empty(0, np.int64)
        if len(bad):
            row = int(bad[0])
            raise ValueError(f"{where(lo + row)} has a count < 1: {block[row].tolist()}")
        sums = np.minimum(block, self.layers + 1).sum(axis=1)  # no int64 overflow in the sums
        bad = np.flatnonzero(sums != self.layers)
        if len(bad):
            row = int(bad[0])
            raise ValueError(f"{where(lo + row)} sums to {int(sums[row])}, the model has {self.layers} layers")

    @paused_collection()
    def rank(self, splits: Any, bucket: float | None = None, backend: Any = "auto",
             in_flight: Any = None, chunks: int = 1, max_bytes: int | None = None) -> Ranking:
        """Score every row of ``splits`` (``[B, P]`` layer counts) as ``pp_lite(self.stages(row))``.

        Rows are packed straight into the batch: each distinct (stage, start,
        end) segment becomes one stage problem, solved once.  The splits are
        neither copied nor kept: the ranking holds a small code per stage.
        """
        bucket = check_bucket(MEGABYTE if bucket is None else bucket)
        get_backend(backend)  # a bad backend or max_bytes fails whatever the data
        if max_bytes is not None:
            check_max_bytes(max_bytes)
        arr = self._valid_splits(splits, chunks, rows=chunks > 1)  # not copied; plain rows checked as read
        p = arr.shape[1] // chunks
        table = self.in_flight_table(p, chunks, in_flight)

        plan = Planner(self.fronts, bucket)  # choices of many rows share their stages

        def rebuild(counts: list) -> Any:  # the validated in-flight table: the caller's may change later
            return plan(self.stages(counts, table, chunks))

        if chunks > 1:  # devices hold several chunks: one stage problem per distinct (stage, segments)
            return rank_interleaved(self, arr, p, chunks, table, bucket, backend, max_bytes, rebuild)
        return rank_plain(self, arr, p, table, bucket, backend, max_bytes, rebuild)


def pipeline_model(model: Any) -> PipelineModel:
    """``model`` when it is a :class:`PipelineModel`, else ValueError naming it (the entry points'
    check of their ``model`` argument)."""
    if not isinstance(model, PipelineModel):
        raise ValueError(f"model must be a PipelineModel, got {type(model).__name__}")
    return model
