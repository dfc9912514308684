"""The grid of a sweep: every configuration of the given sizes on a cluster, valid or skipped
with its reason, and the :class:`Sweep` result."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..engine import check_int

#: Grid keys and the configuration keys they set.
GRID_KEYS = ("stages", "tensor_parallel", "micro_batch_size", "interleave")
#: Most configurations one sweep may hold (each is a whole-model search: about 10-50 ms here).
MAX_CONFIGS = 5_000


@dataclass(frozen=True)
class Sweep:
    """A sweep's result.

    ``rows``: one dict per (configuration, split), best throughput first, with
    ``config``, ``rank`` (1..top within its configuration), ``counts`` (None when
    infeasible), ``score``, ``iteration_time`` (Megatron's schedule simulated for
    the split's plan, in the profile's time unit), ``throughput``
    (``samples_per_second`` and ``tokens_per_second`` for the whole cluster),
    ``peak_memory_bytes`` per stage (static plus activations), ``feasible`` and,
    for interleaved local searches, ``exact``.  ``skipped``: the invalid
    configurations, each ``{"config", "reason"}``.
    """

    rows: list = field(default_factory=list)
    skipped: list = field(default_factory=list)

    @property
    def best(self) -> dict | None:
        """The feasible row of the highest throughput, or None."""
        return next((r for r in self.rows if r["feasible"]), None)


def expand(grid: Any, gpus: Any, global_batch: Any, layers: int | None = None) -> tuple[list[dict], list[dict]]:
    """Every configuration of ``grid`` for the cluster: ``(valid, skipped)``."""
    gpus = check_int(gpus, "gpus", 1)
    global_batch = check_int(global_batch, "global_batch", 1)
    if not isinstance(grid, Mapping):
        raise ValueError(f"grid must be a mapping of {', '.join(GRID_KEYS)} to lists, got {type(grid).__name__}")
    values = {}
    for key in grid:
        if key not in GRID_KEYS:
            raise ValueError(f"grid: unknown key {key!r}; known: {', '.join(GRID_KEYS)}")
    for key in GRID_KEYS:
        raw = grid.get(key, [1])
        if isinstance(raw, (str, bytes)) or not hasattr(raw, "__iter__"):
            raw = [raw]
        raw = list(raw)
        if not raw:
            raise ValueError(f"grid[{key!r}] is empty")
        values[key] = sorted({check_int(v, f"grid[{key!r}] entries", 1) for v in raw})
    total = math.prod(len(v) for v in values.values())
    if total > MAX_CONFIGS:
        raise ValueError(f"the grid has {total:,} configurations, over {MAX_CONFIGS:,}")
    valid, skipped = [], []
    for p, tp, mbs, v in itertools.product(*(values[k] for k in GRID_KEYS)):
        config = {"stages": p, "tensor_parallel": tp, "micro_batch_size": mbs, "interleave": v}
        reason = None
        if gpus % (p * tp):
            reason = f"{gpus} GPUs are not a multiple of stages x tensor_parallel = {p * tp}"
        else:
            dp = gpus // (p * tp)
            config["data_parallel"] = dp
            if global_batch % (dp * mbs):
                reason = (f"global batch {global_batch} is not a multiple of data_parallel x micro_batch_size "
                          f"= {dp * mbs}")
            else:
                m = global_batch // (dp * mbs)
                config["micro_batches"] = m
                if v > 1 and p == 1:
                    reason = "interleaving needs at least 2 stages"
                elif v > 1 and m % p:
                    reason = f"the interleaved schedule needs micro_batches ({m}) to be a multiple of stages ({p})"
                elif layers is not None and p * v > layers:
                    reason = f"{p} stages x {v} chunks is more than the model's {layers} layers"
        config = {k: config.get(k) for k in ("stages", "tensor_parallel", "micro_batch_size", "micro_batches",
                                              "data_parallel", "interleave")}
        (skipped if reason else valid).append({"config": config, "reason": reason} if reason else config)
    return valid, skipped
