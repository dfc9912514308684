"""The schedule of a solved split: per-chunk times from its plan, simulated, summarised, drawn.

A split's plan gives every layer an option; a (stage, chunk)'s forward time is
the sum of its layers' forward times, its backward time the sum of their
backward times (recompute included), of which the recompute is the part
above each layer's least backward time among its kind's options.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..engine import short
from ._orders import MAX_OPS
from ._simulate import Timeline, simulate, unbounded_iteration_times

#: Most operations the command line simulates and prints (2 x stages x chunks x micro-batches): half
#: the schedule's own limit (:data:`MAX_OPS`), as every operation is also kept, summed and written.
MAX_TIMELINE_OPS = MAX_OPS // 2


@dataclass(frozen=True)
class ChunkTimes:
    """Per-micro-batch times ``[stage][chunk]``: forward, backward, and the recompute inside backward."""

    forward: list
    backward: list
    recompute: list


def check_model(model: Any) -> Any:
    """``model`` when it is a pipeline model (:class:`gpuknap.search.PipelineModel`), else ValueError."""
    if not all(hasattr(model, a) for a in ("check_counts", "kinds", "kind_order", "fronts", "micro_batches", "layers")):
        raise ValueError(f"model must be a PipelineModel, got {type(model).__name__}")
    return model


def plan_options(model: Any, counts: Sequence[int], names: Sequence[str], chunks: int = 1) -> tuple[list, list]:
    """``(counts, every layer's option)`` of a plan, validated: ``counts`` a split of the model into
    ``P * chunks`` segments (``model.check_counts``), ``names`` one option name per layer, each an
    option of that layer's kind (ValueError naming ``counts``, ``chunks`` or ``names[i]``)."""
    counts = check_model(model).check_counts(counts, chunks)
    if isinstance(names, (str, bytes)) or not isinstance(names, (Sequence, np.ndarray)):
        raise ValueError(f"names must be a sequence of option names, one per layer, got {type(names).__name__}")
    if len(names) != model.layers:
        raise ValueError(f"names must have {model.layers} entries (one option name per layer), got {len(names)}")
    by_kind: dict = {}
    options = []
    for i, (kind, name) in enumerate(zip(model.kinds, names)):
        named = by_kind.get(kind)
        if named is None:  # the first option of a name (a model refuses two of one name)
            named = by_kind[kind] = {}
            for o in model.fronts[kind]:
                named.setdefault(getattr(o, "name", str(o)), o)  # as model.option_names names it
        try:
            option = None if name is None else named.get(name)
        except TypeError:  # unhashable
            option = None
        if option is None:
            known = ", ".join(str(n) for n in list(named)[:12]) + (", ..." if len(named) > 12 else "")
            raise ValueError(f"names[{i}]: {short(name)} is not an option of kind {short(kind)} (its options: {known})")
        options.append(option)
    return counts, options


def chunk_times(model: Any, counts: Sequence[int], names: Sequence[str], chunks: int = 1) -> ChunkTimes:
    """The times of every (stage, chunk) of a split whose layers run ``names`` (validated by
    :func:`plan_options`)."""
    counts, options = plan_options(model, counts, names, chunks)
    p = len(counts) // chunks
    least = {kind: min(o.backward_time for o in model.fronts[kind]) for kind in model.kind_order}
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    fwd = [[0.0] * chunks for _ in range(p)]
    bwd = [[0.0] * chunks for _ in range(p)]
    rec = [[0.0] * chunks for _ in range(p)]
    for c in range(chunks):
        for s in range(p):
            i = c * p + s
            for layer in range(bounds[i], bounds[i + 1]):
                option = options[layer]
                fwd[s][c] += option.forward_time
                bwd[s][c] += option.backward_time
                rec[s][c] += option.backward_time - least[model.kinds[layer]]
    return ChunkTimes(fwd, bwd, rec)


def stage_forward_backward(model: Any, start: int, stop: int, choice: Any) -> tuple[float, float]:
    """Forward and backward time of one stage (one chunk) on layers ``start:stop`` under its
    solved ``choice``, summed layer by layer in model order as :func:`chunk_times` does
    (a kind's layers take its chosen options slowest first, as ``model.option_names``)."""
    queues: dict[Any, list] = {}
    for a in choice.assignments:
        queues.setdefault(a.layers.kind, []).extend([a.option] * a.count)
    fwd = bwd = 0.0
    for kind in model.kinds[start:stop]:
        option = queues[kind].pop(0)
        fwd += option.forward_time
        bwd += option.backward_time
    return fwd, bwd


def timeline_of(model: Any, counts: Sequence[int], names: Sequence[str], chunks: int = 1,
                p2p: float = 0.0) -> tuple[Timeline, ChunkTimes]:
    """Simulate Megatron's schedule (interleaved when ``chunks > 1``) for a solved split."""
    counts = plan_options(model, counts, names, chunks)[0]
    ops = 2 * len(counts) * model.micro_batches
    if ops > MAX_TIMELINE_OPS:
        raise ValueError(f"micro_batches: the timeline would have {ops:,} operations (2 x {len(counts):,} stages "
                         f"and chunks x {model.micro_batches:,} micro-batches), over {MAX_TIMELINE_OPS:,}; "
                         "use fewer micro-batches or stages")
    times = chunk_times(model, counts, names, chunks)
    schedule = "interleaved" if chunks > 1 else "1f1b"
    return simulate(times.forward, times.backward, model.micro_batches, schedule, p2p), times


def of_split(model: Any, counts: Sequence[int], bucket: float, in_flight: Any = None, chunks: int = 1,
             p2p: float = 0.0) -> tuple | None:
    """``(timeline, chunk times, closed-form 1F1B score or None)`` of a split's best plan, None when
    it does not fit; ``in_flight`` is used when it is a table for this split's stages and chunks."""
    counts = check_model(model).check_counts(counts, chunks)
    p = len(counts) // chunks
    if in_flight is not None and not _is_table(in_flight, p, chunks):
        in_flight = None
    names = model.plan(counts, bucket, in_flight, chunks)
    return None if names is None else of_plan(model, counts, names, chunks, p2p)


def _is_table(in_flight: Any, rows: int, columns: int) -> bool:
    """Whether ``in_flight`` has ``rows`` rows of ``columns`` entries (its values checked on use)."""
    try:
        return len(in_flight) == rows and all(len(row) == columns for row in in_flight)
    except TypeError:
        return False


def of_plan(model: Any, counts: Sequence[int], names: Sequence[str], chunks: int = 1,
            p2p: float = 0.0) -> tuple:
    """:func:`of_split` of a split whose layers run ``names`` (every layer's option, model order)."""
    t, times = timeline_of(model, counts, names, chunks, p2p)
    closed = None
    if chunks == 1:
        stage_times = [f[0] + b[0] for f, b in zip(times.forward, times.backward)]
        closed = (model.micro_batches - 1) * max(stage_times) + sum(stage_times)
    return t, times, closed


def simulated_times(model: Any, found: Sequence[tuple], in_flight: Any = None, chunks: int = 1) -> list[float]:
    """The simulated iteration time (Megatron's schedule, no transfer time) of each solved
    split ``(counts, score, choice, ...)``, all in one batch."""
    return simulated_plans(model, [(e[0], model.option_names(e[0], e[2], in_flight, chunks)) for e in found], chunks)


def simulated_plans(model: Any, plans: Sequence[tuple], chunks: int = 1) -> list[float]:
    """:func:`simulated_times` of splits given as ``(counts, every layer's option name)``."""
    if not plans:
        return []
    times = [chunk_times(model, counts, names, chunks) for counts, names in plans]
    p = len(times[0].forward)
    for i, t in enumerate(times):
        if len(t.forward) != p:
            raise ValueError(f"plans[{i}] has {len(t.forward)} stages, plans[0] {p}: simulate one pipeline shape")
    fwd = np.array([t.forward for t in times], dtype=np.float64)  # [plans, stages, chunks]
    bwd = np.array([t.backward for t in times], dtype=np.float64)
    # as many pipelines as plans, each built in Python above (a search's found, up to MAX_TOP)
    return unbounded_iteration_times(fwd, bwd, model.micro_batches, "interleaved" if chunks > 1 else "1f1b").tolist()


def record(t: Timeline, times: ChunkTimes, counts: Sequence[int]) -> dict:
    """The timeline's numbers for the JSON output (docs/json.md)."""
    busy = t.busy
    end = t.iteration_time
    total = end * t.stages
    idle = [end - b for b in busy]
    return {"counts": [int(c) for c in counts], "stages": t.stages, "chunks": t.chunks,
            "micro_batches": t.micro_batches, "iteration_time": end, "bubble": sum(idle) / total if total > 0 else 0.0,
            "busy": busy, "idle": idle, "peak_in_flight": t.peak_in_flight,
            "forward": times.forward, "backward": times.backward, "recompute": times.recompute,
            "ops": [{"stage": o.stage, "chunk": o.chunk, "micro_batch": o.micro_batch, "kind": o.kind,
                     "start": o.start, "end": o.end} for o in t.ops]}


def summary(t: Timeline, title: str, closed_form: float | None = None) -> str:
    """A table per stage: busy and idle time, peak micro-batches alive per chunk."""
    if not isinstance(t, Timeline):
        raise ValueError(f"t must be a Timeline (from simulate or timeline_of), got {type(t).__name__}")
    lines = [f"{title}: iteration time {t.iteration_time:.6g}, bubble {100 * t.bubble:.1f}% "
             f"({t.stages} stages" + (f" x {t.chunks} chunks" if t.chunks > 1 else "")
             + f", {t.micro_batches} micro-batches)",
             f"{'stage':>5} {'busy':>12} {'idle':>12}  peak in flight per chunk"]
    peak = t.peak_in_flight  # each property walks every operation: once each
    for s, (busy, idle) in enumerate(zip(t.busy, t.idle)):
        lines.append(f"{s:>5} {busy:>12.6g} {idle:>12.6g}  {peak[s]}")
    if closed_form is not None:
        lines.append(f"closed-form 1F1B score (M - 1) * slowest + sum: {closed_form:.6g} "
                     f"({100 * (closed_form / t.iteration_time - 1):+.2f}% against the simulation)")
    return "\n".join(lines)
