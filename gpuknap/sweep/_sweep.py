"""``sweep``: score a whole space of parallel configurations in one batch.

A configuration is ``stages`` (P), ``tensor_parallel`` (TP), ``micro_batch_size``,
``interleave`` (v), and what follows from the cluster: ``data_parallel`` =
gpus / (P * TP) and ``micro_batches`` = global_batch / (DP * micro_batch_size)
(:mod:`._grid`).  Every configuration's search runs in lockstep with the others
(:mod:`._run`), in process or sharded over a Dask cluster (:mod:`._cluster`);
models come from a spec, a Hugging Face config or a callable (:mod:`._sources`).
The ``simulated`` score is not swept (every row carries its simulated
iteration time anyway).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from ..engine import MAX_TOP, MEGABYTE, check_int, check_max_bytes, get_backend
from ._cluster import run_on_cluster
from ._grid import Sweep, expand
from ._run import SCORES, order_rows, run_configs
from ._sources import builder_of


def _source(source: Any, capacity: Any, reserved: Any, seq: Any, bucket: Any, training: dict) -> tuple:
    """``(builder(config) -> PipelineModel, name, bucket, tokens per sample or None)``."""
    if callable(source):
        if any(v is not None for v in training.values()):
            name = next(k for k, v in training.items() if v is not None)
            raise ValueError(f"{name}: a callable source builds its models itself; give it the {name} there")
        return source, getattr(source, "__name__", "model"), MEGABYTE if bucket is None else bucket, seq
    return builder_of(source, capacity, reserved, seq, bucket, training)


def sweep(source: Any, grid: Mapping, *, gpus: int, global_batch: int, score: str = "1f1b", top: int = 1,
          backend: Any = "auto", scheduler: Any = None, capacity: Any = None, reserved: Any = None,
          seq: Any = None, bucket: Any = None, max_bytes: int | None = None, time_unit: float = 1e-3,
          shards: int | None = None, device: Any = None, gpus_per_node: int | None = None,
          efficiency: float | None = None, device_fields: Mapping | None = None, expert_parallel: int | None = None,
          expert_tensor_parallel: int | None = None, context_parallel: int | None = None) -> Sweep:
    """Score every configuration of ``grid`` on ``gpus`` GPUs at ``global_batch`` samples a step.

    ``source``: a spec with a ``transformer`` section, a Hugging Face ``config.json``
    (then ``capacity`` and ``seq`` are needed), or a callable ``(config) ->
    PipelineModel``.  ``grid`` maps ``stages``, ``tensor_parallel``,
    ``micro_batch_size`` and ``interleave`` to lists (missing: ``[1]``).  ``score``:
    ``slowest`` or ``1f1b`` (the split search); ``top`` splits per configuration.
    ``time_unit``: seconds per profile time unit (analytic and Hugging Face models
    are in ms).  ``scheduler``: a Dask scheduler address or ``distributed.Client``
    to shard the configurations over (``shards`` of them, default two per worker);
    None runs in process without Dask.  Rows are identical either way.  ``device`` (a preset
    name; ``gpus_per_node``, ``efficiency``, ``device_fields`` override it) and the expert and
    context parallel sizes apply to every configuration of a spec or config source.
    """
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES} for a sweep (every row carries its simulated time), "
                         f"got {score!r}")
    top = check_int(top, "top", 1)
    if top > MAX_TOP:
        raise ValueError(f"top={top} is over the limit of {MAX_TOP} splits per configuration")
    get_backend(backend)
    if max_bytes is not None:
        check_max_bytes(max_bytes)
    if not (isinstance(time_unit, (int, float)) and 0 < time_unit < math.inf):
        raise ValueError(f"time_unit must be a positive number of seconds, got {time_unit!r}")
    training = {"device": device, "gpus_per_node": gpus_per_node, "efficiency": efficiency,
                "device_fields": device_fields, "expert_parallel": expert_parallel,
                "expert_tensor_parallel": expert_tensor_parallel, "context_parallel": context_parallel}
    builder, _, bucket, tokens = _source(source, capacity, reserved, seq, bucket, training)
    layers = getattr(builder, "layers", None)
    configs, skipped = expand(grid, gpus, global_batch, layers)
    if not configs:
        raise ValueError("no valid configuration in the grid: "
                         + "; ".join(sorted({s["reason"] for s in skipped}))[:400])
    kwargs = dict(global_batch=int(global_batch), score=score, top=top, bucket=bucket, backend=backend,
                  max_bytes=max_bytes, time_unit=float(time_unit), tokens=tokens)
    if scheduler is None:
        rows, bad = run_configs(configs, builder, **kwargs)
    else:
        rows, bad = run_on_cluster(scheduler, run_configs, configs, builder, kwargs, shards)
    place = {tuple(sorted(c.items())): i for i, c in enumerate(configs)}
    bad.sort(key=lambda s: place.get(tuple(sorted(s["config"].items())), 0))  # shards finish in any order
    return Sweep(order_rows(rows, configs), skipped + bad)
