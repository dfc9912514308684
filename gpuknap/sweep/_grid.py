"""The grid of a sweep: every configuration of the given sizes on a cluster, valid or skipped
with its reason, and the :class:`Sweep` result."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..costs import device as costs_device
from ..engine import check_int
from ..formats import suggest
from ..schedule import MAX_OPS

#: Grid keys: the sizes a sweep varies (and the device); each missing key keeps its default.
GRID_KEYS = ("stages", "tensor_parallel", "context_parallel", "expert_parallel", "expert_tensor_parallel",
             "micro_batch_size", "interleave", "device")
#: What a key is when the grid does not give it (``expert_tensor_parallel`` None: the TP size, as Megatron;
#: ``device`` None: the source's).
DEFAULTS = {"stages": 1, "tensor_parallel": 1, "context_parallel": 1, "expert_parallel": 1,
            "expert_tensor_parallel": None, "micro_batch_size": 1, "interleave": 1, "device": None}
#: The keys of every configuration, in the order rows show them.
CONFIG_KEYS = ("stages", "tensor_parallel", "context_parallel", "expert_parallel", "expert_tensor_parallel",
               "micro_batch_size", "micro_batches", "data_parallel", "interleave", "device")
#: Most configurations one sweep may hold when every one is searched (each is a whole-model search) ...
MAX_CONFIGS = 5_000
#: ... and when only the best ones are (``top``: most are pruned by their bound before any search).
MAX_CONFIGS_TOP = 200_000


@dataclass(frozen=True)
class Sweep:
    """A sweep's result.

    ``rows``: one dict per (configuration, split), best throughput first, with
    ``config``, ``rank`` (1..top within its configuration), ``counts`` (None when
    infeasible), ``score``, ``iteration_time`` (Megatron's schedule simulated for
    the split's plan, in the profile's time unit), ``throughput``
    (``samples_per_second`` and ``tokens_per_second`` for the whole cluster),
    ``peak_memory_bytes`` per stage (static plus activations and logits), ``feasible`` and,
    for interleaved local searches, ``exact``.  ``skipped``: the invalid
    configurations, each ``{"config", "reason"}`` (with ``top``, only those found invalid
    before pruning or while searching).  ``top``: the rows asked for (None: every row);
    ``searched``: configurations searched; ``pruned``: configurations never searched because
    their lower bound was slower than the ``top``-th row; ``unfit``: configurations not searched
    because no split of theirs can fit the memory (proved from the lightest options alone).
    """

    rows: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    top: int | None = None
    searched: int = 0
    pruned: int = 0
    unfit: int = 0

    @property
    def best(self) -> dict | None:
        """The feasible row of the highest throughput, or None."""
        return next((r for r in self.rows if r["feasible"]), None)


def grid_values(grid: Any) -> dict:
    """The validated lists of a grid, per key (defaults where it says nothing)."""
    if not isinstance(grid, Mapping):
        raise ValueError(f"grid must be a mapping of {', '.join(GRID_KEYS)} to lists, got {type(grid).__name__}")
    for key in grid:
        if key not in GRID_KEYS:
            raise ValueError(f"grid: unknown key {key!r}{suggest(str(key), GRID_KEYS)}; known: {', '.join(GRID_KEYS)}")
    values = {}
    for key in GRID_KEYS:
        raw = grid.get(key, [DEFAULTS[key]])
        if isinstance(raw, (Mapping, set, frozenset)) or key != "device" and isinstance(raw, (str, bytes)):
            raise ValueError(f"grid[{key!r}] must be a list of values, got {type(raw).__name__}")
        if isinstance(raw, (str, bytes)) or not hasattr(raw, "__iter__"):
            raw = [raw]
        raw = list(raw)
        if not raw:
            raise ValueError(f"grid[{key!r}] is empty")
        if key == "device":
            for v in raw:
                if v is not None:
                    try:
                        costs_device(v)
                    except ValueError as exc:
                        raise ValueError(f"grid['device']: {str(exc).split(': ', 1)[-1]}") from None
            values[key] = list(dict.fromkeys(raw))
        elif key == "expert_tensor_parallel":
            values[key] = sorted({None if v is None else check_int(v, f"grid[{key!r}] entries", 1) for v in raw},
                                 key=lambda v: (v is not None, v or 0))
        else:
            values[key] = sorted({check_int(v, f"grid[{key!r}] entries", 1) for v in raw})
    return values


def expand(grid: Any, gpus: Any, global_batch: Any, layers: int | None = None,
           limit: int = MAX_CONFIGS) -> tuple[list[dict], list[dict]]:
    """Every configuration of ``grid`` for the cluster: ``(valid, skipped)``, each skipped one with
    the rule it breaks (Megatron's: the world is TP x CP x DP x PP; EP x ETP divides the TP x CP x DP
    ranks of a stage; the global batch is whole micro-batches on every data-parallel replica;
    interleaving needs 2 stages and whole groups of micro-batches).  Model-dependent rules (heads,
    experts, sequence divisible) are checked when each configuration's model is built."""
    gpus = check_int(gpus, "gpus", 1)
    global_batch = check_int(global_batch, "global_batch", 1)
    values = grid_values(grid)
    total = math.prod(len(v) for v in values.values())
    if total > limit:
        raise ValueError(f"the grid has {total:,} configurations, over {limit:,}"
                         + ("; give top= (--top) to search only the best ones" if limit == MAX_CONFIGS else ""))
    valid, skipped = [], []
    for combo in itertools.product(*(values[k] for k in GRID_KEYS)):
        config = dict(zip(GRID_KEYS, combo))
        p, tp, cp, ep = config["stages"], config["tensor_parallel"], config["context_parallel"], config["expert_parallel"]
        etp = tp if config["expert_tensor_parallel"] is None else config["expert_tensor_parallel"]
        mbs, v = config["micro_batch_size"], config["interleave"]
        reason = None
        if gpus % (p * tp * cp):
            reason = f"{gpus} GPUs are not a multiple of stages x tensor_parallel x context_parallel = {p * tp * cp}"
        else:
            dp = config["data_parallel"] = gpus // (p * tp * cp)
            if (tp * cp * dp) % (ep * etp):
                reason = (f"expert_parallel x expert_tensor_parallel = {ep * etp} does not divide the {tp * cp * dp} "
                          "ranks of a stage (TP x CP x DP)")
            elif global_batch % (dp * mbs):
                reason = (f"global batch {global_batch} is not a multiple of data_parallel x micro_batch_size "
                          f"= {dp * mbs}")
            else:
                m = config["micro_batches"] = global_batch // (dp * mbs)
                if v > 1 and p == 1:
                    reason = "interleaving needs at least 2 stages"
                elif v > 1 and m % p:
                    reason = f"the interleaved schedule needs micro_batches ({m}) to be a multiple of stages ({p})"
                elif layers is not None and p * v > layers:
                    reason = f"{p} stages x {v} chunks is more than the model's {layers} layers"
                elif 2 * p * v * m > MAX_OPS:  # every row's schedule is simulated
                    reason = (f"{m:,} micro-batches on {p} stages x {v} chunks make {2 * p * v * m:,} schedule "
                              f"operations, over the {MAX_OPS:,} gpuknap simulates")
        config = {k: config.get(k) for k in CONFIG_KEYS}
        (skipped if reason else valid).append({"config": config, "reason": reason} if reason else config)
    return valid, skipped
