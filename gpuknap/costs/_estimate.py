"""A solved split of a cost-modelled model as a training run: iteration time in seconds, MFU,
TFLOP/s per GPU and where each stage's time goes.

The iteration is Megatron's schedule simulated (:mod:`gpuknap.schedule`) with every
(stage, chunk)'s forward and backward time from its plan and the pipeline send of
:attr:`ModelCosts.p2p` between virtual stages, followed by each stage's tail (the
exposed data-parallel communication and the optimizer step): the iteration ends with
the last stage to finish.  MFU counts model FLOPs as Megatron does (forward and
backward, recompute not counted) over the whole cluster.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..engine import short
from ..schedule import chunk_times, iteration_time, plan_options
from ..search import pipeline_model
from ._build import ModelCosts

#: Components of a stage's time, in the order reports show them.
COMPONENTS = ("compute", "recompute", "tp", "cp", "ep", "p2p", "dp", "bubble")


@dataclass(frozen=True)
class Estimate:
    """A split run on the cluster: ``iteration_time`` in seconds, ``mfu`` (share of the devices'
    peak spent on model FLOPs), ``tflops_per_gpu``, ``gpus``, per stage the seconds of each
    component of :data:`COMPONENTS` (``stages``), and ``breakdown``: the bottleneck stage's
    (the stage busiest with its own work)."""

    iteration_time: float
    mfu: float
    tflops_per_gpu: float
    gpus: int
    stages: tuple
    breakdown: dict


def estimate(model: Any, counts: Sequence[int], names: Sequence[str], chunks: int = 1) -> Estimate | None:
    """The :class:`Estimate` of a split whose layers run ``names`` (model order), or None when the
    model has no cost model (a measured profile).  ValueError naming ``model``, ``counts``,
    ``chunks`` or ``names[i]`` for a plan that is not one of this model
    (:func:`gpuknap.schedule.plan_options`)."""
    pipeline_model(model)
    times = chunk_times(model, counts, names, chunks)  # validates the plan, cost model or not
    if model.costs is None:
        return None
    p = len(times.forward)
    schedule = "interleaved" if chunks > 1 else "1f1b"
    span = iteration_time(times.forward, times.backward, model.micro_batches, schedule, pipeline_send(model, p))
    return run_of(model, counts, names, chunks, span)


def pipeline_send(model: Any, stages: int) -> float:
    """The time of one micro-batch's send between stages (0 with one stage or no cost model)."""
    costs = getattr(model, "costs", None)
    return costs.p2p if costs is not None and stages > 1 else 0.0


def run_of(model: Any, counts: Sequence[int], names: Sequence[str], chunks: int, span: float) -> Estimate:
    """The :class:`Estimate` of a split whose schedule takes ``span`` (in the model's time unit, from
    any simulation of it with :func:`pipeline_send`): each stage's busy time is its micro-batches'
    forward and backward times, the rest of the iteration its own tail and idle time (the sends'
    share of it, at most all of it, then the bubble, the wait for a later stage's tail included), so
    every stage's parts sum to the iteration time.  ValueError naming ``model``, ``counts``,
    ``chunks``, ``names[i]`` or ``span`` (a finite time >= 0)."""
    counts, options = plan_options(pipeline_model(model), counts, names, chunks)
    if model.costs is None:
        raise ValueError("model: a measured profile (costs is None) has no cost model to estimate a run with")
    if isinstance(span, (bool, np.bool_)) or not isinstance(span, (int, float, np.integer, np.floating)) \
            or not 0 <= span < math.inf:
        raise ValueError(f"span must be a finite time >= 0, got {short(span)}")
    span = float(span)
    costs: ModelCosts = model.costs
    unit = costs.time_unit
    p = len(counts) // chunks
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    parts = [dict.fromkeys(COMPONENTS, 0.0) for _ in range(p)]
    kinds: list[dict] = [{} for _ in range(p)]
    busy = [0.0] * p
    windows = [[0.0, 0.0] for _ in range(p)]  # one micro-batch's forward and backward on each stage
    m = model.micro_batches
    for i in range(len(counts)):
        s = i % p
        for layer in range(bounds[i], bounds[i + 1]):
            kind = model.kinds[layer]
            option = options[layer]
            kinds[s][kind] = kinds[s].get(kind, 0) + 1
            busy[s] += m * (option.forward_time + option.backward_time) * unit
            windows[s][0] += option.forward_time
            windows[s][1] += option.backward_time
            for key, value in getattr(option, "parts", ()):
                parts[s][key] += value * m * unit
    tails = [costs.tail(k, *w) * unit for k, w in zip(kinds, windows)]
    span *= unit
    send = pipeline_send(model, p)
    iteration = max(span + t for t in tails)
    for s in range(p):
        sends = (s > 0) + (s < p - 1) if chunks == 1 else 2
        parts[s]["dp"] = tails[s]
        # the rest of the iteration (the wait for a later stage's tail included) is idle: the sends'
        # share of it, at most all of it (a send delays the receiver; the sender computes on,
        # so sends the schedule hides take no time of the stage), and the bubble
        idle = max(iteration - busy[s] - tails[s], 0.0)
        parts[s]["p2p"] = min(sends * chunks * m * send * unit, idle)
        parts[s]["bubble"] = idle - parts[s]["p2p"]
    tr = costs.training
    gpus = tr.tp * tr.cp * tr.dp * p
    total: dict = {}
    for stage in kinds:
        for k, n in stage.items():
            total[k] = total.get(k, 0) + n
    per_gpu = costs.model_flops(total) / (iteration * gpus) if iteration > 0 else 0.0
    busiest = max(range(p), key=lambda s: busy[s])
    return Estimate(iteration, per_gpu / costs.device.peak_flops, per_gpu / 1e12, gpus,
                    tuple(parts), dict(parts[busiest]))
