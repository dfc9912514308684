"""Readouts for people and drivers: stage tables and the stable JSON.

The JSON layout is documented in docs/json.md; ``inf`` becomes ``null``.
Pictures are in :mod:`._plots`.
"""
from __future__ import annotations

import math

GIB = 2**30
from typing import Any, Sequence

import numpy as np

from ..engine import MEGABYTE, PipelineChoice, Planner
from ..costs import estimate
from ..search import PipelineModel, score_of

JSON_VERSION = 1


def whole_bytes(payload: Any) -> Any:
    """``payload`` with every ``*_bytes`` value (or list of values) that is a whole number written as
    an integer, however it was computed (a size read as ``1MiB`` is a float, the default an int):
    drivers see one type for one field.  A timeline's ``ops`` are left as they are (none are bytes)."""
    if isinstance(payload, list):
        return [whole_bytes(v) for v in payload]
    if not isinstance(payload, dict):
        return payload
    out = {}
    for key, value in payload.items():
        if isinstance(key, str) and key.endswith("_bytes"):
            value = [_whole(v) for v in value] if isinstance(value, list) else _whole(value)
        elif key != "ops" and isinstance(value, (dict, list)):
            value = whole_bytes(value)
        out[key] = value
    return out


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


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
    in_flight_table = model.in_flight_table(len(stages), chunks, in_flight)
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
            "in_flight": [int(k) for k in in_flight_table[s]] if chunks > 1 else
            (stage.groups[0].in_flight if stage.groups else None),
            "budget_bytes": stage.budget,
            "memory_bytes": sc.memory,
            **_memory(model, stage, sc),
            "time": t,
            "options": options,
            "slowest": t == slowest,
        })
        if relaxed is not None:
            rows[-1]["time_lower_bound"] = relaxed.times[s]
    run = run_record(model, counts, model.option_names(list(counts), choice, in_flight, chunks), chunks)
    for row, parts in zip(rows, run.pop("stage_breakdown")):
        row["breakdown"] = parts
    return {
        "counts": [int(c) for c in counts],
        "score": _finite(value),
        "score_kind": score,
        "slowest": slowest,
        # the record's own score when it is this one (a search ranks on its own sums, which can
        # differ from the exact closed form rounded once by an ulp on interleaved splits)
        "iteration_time_1f1b": value if score == "1f1b" else score_of(choice.times, "1f1b", model.micro_batches,
                                                                      chunks),
        "stages": rows,
        **run,
        **({} if lower_bound is None else {"lower_bound": lower_bound}),
    }


def _memory(model: PipelineModel, stage: Any, sc: Any) -> dict:
    """A stage's bytes: static (weights, gradients, optimizer), activations, fp32 logits (kept once
    on the last stage), reserved, and the device's capacity."""
    logits = 0.0
    for a in sc.assignments:
        logits += a.count * float(getattr(a.option, "held_once", 0.0))
    static = model.capacity - model.reserved - stage.budget
    return {"static_bytes": static, "activation_bytes": sc.memory - logits, "logits_bytes": logits,
            "reserved_bytes": model.reserved, "capacity_bytes": model.capacity}


def run_times(model: Any, plans: Sequence[tuple], chunks: int = 1) -> list[float] | None:
    """Each plan's ``(counts, every layer's option name)`` run time in seconds, its pipeline
    sends, data-parallel tail and optimizer step included (how a sweep ranks its rows); None for
    measured profiles, which have no run."""
    if getattr(model, "costs", None) is None:
        return None
    return [estimate(model, list(counts), list(names), chunks).iteration_time for counts, names in plans]


def run_record(model: PipelineModel, counts: Sequence[int], names: Sequence[str], chunks: int = 1) -> dict:
    """The split as a training run (cost-modelled models; None values for measured profiles):
    ``iteration_time_s``, ``mfu``, ``tflops_per_gpu``, ``gpus``, ``breakdown`` (seconds per
    component of the bottleneck stage) and ``stage_breakdown`` (each stage's)."""
    est = estimate(model, counts, names, chunks)
    if est is None:
        return {"iteration_time_s": None, "mfu": None, "tflops_per_gpu": None, "gpus": None, "device": None,
                "breakdown": None, "stage_breakdown": [None] * (len(counts) // chunks)}
    return {"iteration_time_s": est.iteration_time, "mfu": est.mfu, "tflops_per_gpu": est.tflops_per_gpu,
            "gpus": est.gpus, "device": model.costs.device.name, "breakdown": est.breakdown,
            "stage_breakdown": list(est.stages)}


def format_split(record: dict, title: str) -> str:
    """A human table of one split: one row per stage (memory in GiB: static, activations, fp32
    logits, and the total with the reserved bytes against the device's capacity), the slowest
    marked with '*', then the run's iteration time, MFU and where the bottleneck stage's time goes."""
    bounded = "lower_bound" in record
    certificate = f" (exact-bytes optimum >= {record['lower_bound']:.6g})" if bounded else ""
    timed = record.get("iteration_time_s") is not None
    unit = "time (ms)" if timed else "time"
    lines = [f"{title}: {record['score_kind']} = {record['score']:.6g}{certificate}   counts {record['counts']}",
             f"{'stage':>5} {'layers':>6} {'in-flight':>9} {'static':>7} {'activ.':>7} {'logits':>7} "
             f"{'total / capacity GiB':>21} {unit:>12}" + (f" {'>= bound':>11}" if bounded else "") + "  options"]
    for r in record["stages"]:
        mark = "*" if r["slowest"] else " "
        total = r["static_bytes"] + r["activation_bytes"] + r["logits_bytes"] + r["reserved_bytes"]
        share = f"{total / GIB:.1f} / {r['capacity_bytes'] / GIB:.1f}"
        mem = (f"{r['static_bytes'] / GIB:>7.1f} {r['activation_bytes'] / GIB:>7.1f} {r['logits_bytes'] / GIB:>7.1f} "
               f"{share:>21}")
        opts = " ".join(f"{k}x{v}" for k, v in r["options"].items())
        inflight = r["in_flight"]
        low = f" {r['time_lower_bound']:>11.6g}" if bounded else ""
        lines.append(f"{r['stage']:>5} {r['layers']:>6} {inflight!s:>9} {mem} {r['time']:>11.6g}{mark}{low}  {opts}")
    reserved = record["stages"][0]["reserved_bytes"]
    closed = "interleaved 1F1B closed form" if isinstance(record["stages"][0]["first_layer"], list) else "1F1B closed form"
    simulated = record.get("iteration_time_simulated")
    lines.append(f"slowest stage {record['slowest']:.6g}; {closed} {record['iteration_time_1f1b']:.6g}"
                 + ("" if simulated is None else f"; simulated schedule {simulated:.6g}")
                 + (f"; {reserved / GIB:.1f} GiB reserved on every device" if reserved else ""))
    if timed:
        lines.append(run_summary(record))
    return "\n".join(lines)


def run_summary(run: dict) -> str:
    """Two lines: the run's iteration time, MFU and TFLOP/s, and the busiest stage's breakdown."""
    parts = ", ".join(f"{k} {_seconds(v)}" for k, v in run["breakdown"].items() if v > 0)
    return (f"as a run on {run['gpus']} x {run['device']}: iteration {_seconds(run['iteration_time_s'])} "
            f"(schedule with communication), MFU {100 * run['mfu']:.1f}%, {run['tflops_per_gpu']:.0f} TFLOP/s per GPU\n"
            f"  the busiest stage's time: {parts}")


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value >= 1 else f"{1e3 * value:.3g} ms"
