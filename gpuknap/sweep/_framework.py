"""A sweep ranked as a framework runs its plans (``framework=``, ``sweep --framework``).

A sweep's rows normally carry the best plan with every layer on its own recompute option.  A
framework states fewer plans: Megatron one recompute setting for every layer, MindFormers one
per stage (:func:`gpuknap.search.constrained_splits`).  With a framework named, each
configuration's rows are the framework-constrained search's best splits, seeded with the
unconstrained search's (the same search ``best --emit`` runs), each with the option every layer
runs as written, and Megatron's even split of an interleaved configuration is a candidate with
the framework's best settings on it (as ``best --emit`` weighs it).  Their times are the
framework's, so the order is the one the emitted settings run in.  The unconstrained search's
bounds stay valid for pruning: no framework plan runs faster than the best plan of all.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..formats import emit
from ..formats import framework as frameworks
from ..schedule import chunk_times
from ..search import best_on_split, constrained_splits, even_candidate, interleaved_score, with_grouped
from ._explain import headroom

#: Frameworks a sweep can be ranked for.
FRAMEWORKS = ("megatron", "mindformers")


def check_framework(name: Any) -> str | None:
    """``name`` validated: one of :data:`FRAMEWORKS`, or None (every layer on its own option)."""
    if name is not None and name not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)} or None, got {name!r}")
    return name


def framework_rows(config: dict, found: list, model: Any, framework: str, score: str, top: int, bucket: float,
                   backend: Any, max_bytes: int | None) -> tuple[list, list]:
    """``(rows, even)`` of one configuration as ``framework`` runs it, their simulated times still to
    fill; ``found``: the unconstrained search's ``(counts, score)`` entries (none: infeasible, and
    then no framework plan fits either).  ValueError where the framework's settings cannot state the
    configuration (the sweep skips it with that reason)."""
    v = config["interleave"]
    named = constrained_splits(model, config["stages"], framework, top, score, bucket, backend, None, max_bytes, v,
                               [list(c) for c, *_ in found])
    exact = bool(getattr(named, "exact", True))
    grouped = with_grouped(model)
    rows = [_row(config, i + 1, counts, value, grouped, names, v, exact)
            for i, (counts, value, _, names, _) in enumerate(named)]
    if not rows:
        return [], []
    try:  # what the framework's settings cannot state (MindFormers: ETP, flex, TP overlap) is skipped
        emit(framework, grouped, named[0][0], chunks=v, names=named[0][3])
    except ValueError as exc:
        raise ValueError(f"--emit {framework} refuses this configuration: {exc}") from None
    even = even_candidate(model, config["stages"], v, [r["counts"] for r in rows]) if v > 1 else None
    names = best_on_split(model, even, framework, v, None, bucket) if even is not None else None
    if names is None:
        return rows, []
    ev = frameworks.evaluate(grouped, even, names, None, v)
    value = float(interleaved_score(np.array([ev.times], dtype=np.float64), score, model.micro_batches, v)[0])
    row = _row(config, 1, even, value, grouped, names, v, False, ev)
    row["even_split"] = True
    return rows, [row]


def _row(config: dict, rank: int, counts: Any, value: float, model: Any, names: list, v: int, exact: bool,
         ev: Any = None) -> dict:
    """A feasible row (``ev``: the split's :func:`gpuknap.formats.framework.evaluate`, when made already)."""
    counts = [int(c) for c in counts]
    ev = frameworks.evaluate(model, counts, names, None, v) if ev is None else ev
    peak = [model.capacity - model.reserved - budget + memory for memory, budget in zip(ev.memory, ev.budgets)]
    return {"config": config, "rank": rank, "counts": counts, "score": float(value), "iteration_time": None,
            "throughput": None, "peak_memory_bytes": peak, "headroom_bytes": headroom(model, peak), "feasible": True,
            "exact": exact, "_times": chunk_times(model, counts, names, v), "_run": (model, names)}
