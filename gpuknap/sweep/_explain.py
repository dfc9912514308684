"""Rows that explain themselves: the order of a sweep's rows (with its tie rule), the idle share
and memory headroom of a feasible row, and why an infeasible configuration does not fit.

The order: higher throughput first; equal throughput (to the last bit) goes to the
configuration whose GPUs sit idle less (the pipeline bubble's share of the span), then the one
needing less memory on its fullest device, then the smaller tensor-parallel size, then the
configuration's place in the grid and the split's rank.  Infeasible rows come last, in grid
order.
"""
from __future__ import annotations

from typing import Any

import numpy as np

GIB = 2**30


def idle_share(forward: Any, backward: Any, micro_batches: int, span: float) -> float:
    """The share of ``stages x span`` GPU time no stage computes (bubble and sends)."""
    if span <= 0:
        return 0.0
    busy = micro_batches * (np.asarray(forward, dtype=np.float64) + np.asarray(backward, dtype=np.float64))
    return max(0.0, 1.0 - float(busy.sum()) / (busy.shape[0] * span))


def headroom(model: Any, peaks: list) -> list:
    """Bytes left on each stage's device after its peak (static, activations and reserved)."""
    return [model.capacity - model.reserved - peak for peak in peaks]


def infeasible_reason(model: Any, stages: int, chunks: int, held: Any) -> str:
    """Why no split fits: the stage furthest over its memory on an even split with the lightest
    options everywhere (and, with one chunk, how many layers the stages can hold at most)."""
    n = model.layers
    parts = stages * chunks
    counts = [n // parts + (1 if i < n % parts else 0) for i in range(parts)]
    worst, over = model.furthest_over(counts, None, chunks)
    if over <= 0:
        return ("no split found within memory, though an even split fits with the lightest options "
                "before memory is rounded to buckets")
    text = (f"stage {worst} of an even split needs {(model.capacity + over) / GIB:.1f} GiB with the lightest "
            f"options ({model.reserved / GIB:.1f} GiB reserved), {max(over, 0.0) / GIB:.1f} GiB over the "
            f"{model.capacity / GIB:.1f} GiB device")
    if held is not None:
        text += f"; the stages hold at most {held:,} of the {n:,} layers"
    return text


def order_rows(rows: list, configs: list) -> list:
    """Rows in the sweep's order (module docstring)."""
    place = {tuple(sorted(c.items(), key=lambda e: e[0])): i for i, c in enumerate(configs)}

    def key(r: dict) -> tuple:
        where = place.get(tuple(sorted(r["config"].items(), key=lambda e: e[0])), 0)
        if not r["feasible"]:
            return (1, 0.0, 0.0, 0.0, 0, where, r["rank"])
        speed = r["throughput"]["samples_per_second"]
        peak = max(r["peak_memory_bytes"]) if r["peak_memory_bytes"] else 0.0
        return (0, -speed, r.get("idle_share") or 0.0, peak, r["config"]["tensor_parallel"], where, r["rank"])

    return sorted(rows, key=key)
