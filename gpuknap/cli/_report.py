"""Readouts for people and drivers: stage tables and the stable JSON.

The JSON layout is documented in docs/json.md; ``inf`` becomes ``null``.
Pictures are in :mod:`._plots`.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..engine import MEGABYTE, PipelineChoice, Planner
from ..search import PipelineModel, score_of

JSON_VERSION = 1


def _finite(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def option_label(model: PipelineModel):
    """Option names alone, or ``kind/name`` where two kinds share an option name."""
    owners: dict[str, set] = {}
    for kind in model.kind_order:
        for o in model.fronts[kind]:
            owners.setdefault(getattr(o, "name", str(o)), set()).add(kind)
    clash = any(len(k) > 1 for k in owners.values())
    return lambda kind, opt: f"{kind}/{getattr(opt, 'name', opt)}" if clash else str(getattr(opt, "name", opt))


def split_record(model: PipelineModel, counts: Sequence[int], choice: PipelineChoice, score: str,
                 value: float, in_flight: Any = None, chunks: int = 1, lower_bound: float | None = None,
                 bucket: float = MEGABYTE) -> dict:
    """One solved split as the JSON record (and the source of the human table).

    With a ``lower_bound`` (``best --bound``) the record carries it, and each
    stage its own bound: the stage's time with weights rounded down and the
    budget rounded up, below which no exact-bytes choice can go."""
    stages = model.stages(list(counts), in_flight, chunks)
    relaxed = Planner(model.fronts, bucket, relaxed=True)(stages) if lower_bound is not None else None
    label = option_label(model)
    slowest = choice.slowest
    p = len(stages)
    first = np.concatenate(([0], np.cumsum(counts)))[:-1].tolist()
    rows = []
    for s, (stage, sc, t) in enumerate(zip(stages, choice.stages, choice.times)):
        options: dict[str, int] = {}
        for a in sc.assignments:
            key = label(a.layers.kind, a.option)
            options[key] = options.get(key, 0) + a.count
        rows.append({
            "stage": s,
            "first_layer": first[s] if chunks == 1 else [first[c * p + s] for c in range(chunks)],
            "layers": sum(g.count for g in stage.groups),
            "in_flight": sorted({g.in_flight for g in stage.groups}) if chunks > 1 else
            (stage.groups[0].in_flight if stage.groups else None),
            "budget_bytes": stage.budget,
            "memory_bytes": sc.memory,
            "time": t,
            "options": options,
            "slowest": t == slowest,
        })
        if relaxed is not None:
            rows[-1]["time_lower_bound"] = relaxed.times[s]
    return {
        "counts": [int(c) for c in counts],
        "score": _finite(value),
        "score_kind": score,
        "slowest": slowest,
        "iteration_time_1f1b": (score_of(choice.times, "1f1b", model.micro_batches) if chunks == 1 else
                                ((chunks * model.micro_batches - 1) * slowest + sum(choice.times)) / chunks),
        "stages": rows,
        **({} if lower_bound is None else {"lower_bound": lower_bound}),
    }


def format_split(record: dict, title: str) -> str:
    """A human table of one split: one row per stage, the slowest marked with '*'."""
    bounded = "lower_bound" in record
    certificate = f" (exact-bytes optimum >= {record['lower_bound']:.6g})" if bounded else ""
    lines = [f"{title}: {record['score_kind']} = {record['score']:.6g}{certificate}   counts {record['counts']}",
             f"{'stage':>5} {'layers':>6} {'in-flight':>9} {'memory / budget (MiB)':>24} {'time':>12}"
             + (f" {'>= bound':>11}" if bounded else "") + "  options"]
    for r in record["stages"]:
        mark = "*" if r["slowest"] else " "
        mem = f"{r['memory_bytes'] / MEGABYTE:,.0f} / {r['budget_bytes'] / MEGABYTE:,.0f}"
        opts = " ".join(f"{k}x{v}" for k, v in r["options"].items())
        inflight = r["in_flight"] if not isinstance(r["in_flight"], list) else ",".join(map(str, r["in_flight"]))
        low = f" {r['time_lower_bound']:>11.6g}" if bounded else ""
        lines.append(f"{r['stage']:>5} {r['layers']:>6} {inflight!s:>9} {mem:>24} {r['time']:>11.6g}{mark}{low}  {opts}")
    closed = "interleaved 1F1B closed form" if isinstance(record["stages"][0]["first_layer"], list) else "1F1B closed form"
    simulated = record.get("iteration_time_simulated")
    lines.append(f"slowest stage {record['slowest']:.6g}; {closed} {record['iteration_time_1f1b']:.6g}"
                 + ("" if simulated is None else f"; simulated schedule {simulated:.6g}"))
    return "\n".join(lines)
