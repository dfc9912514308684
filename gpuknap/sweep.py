"""``sweep``: score a whole space of parallel configurations in one batch.

A configuration is ``stages`` (P), ``tensor_parallel`` (TP), ``micro_batch_size``,
``interleave`` (v), and what follows from the cluster: ``data_parallel`` =
gpus / (P * TP) and ``micro_batches`` = global_batch / (DP * micro_batch_size).
Each one is a whole-model search (:func:`gpuknap.best_splits`); run one by
one, their stage problems overlap heavily (the same layers, in-flight count
and budget recur across P, M and v).  Here every configuration's certified
search (:func:`gpuknap.search.certified_rounds`) advances in lockstep: each
round, the stage problems of all configurations still searching are
deduplicated across configurations and solved in ONE engine call, then each
configuration's split search runs on its own table.  Results are exactly
those of ``best_splits`` run alone.

Exceptions, said in the docs: interleaved configurations of models that are not
one kind between their first and last layer use the local search one
configuration at a time, and the ``simulated`` score is not swept (every row
carries its simulated iteration time anyway).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from .classify import kind_index
from .limits import MAX_TOP
from .options import MEGABYTE, FrontTable, check_int
from .progress import report
from .ranking import Solved, solve_problems
from .results import PipelineChoice
from .search import certified_rounds
from .search_interleaved import best_interleaved, counts_of, one_body_kind, tuple_planner
from .segments import coverage, fastest_prefix, plan_segments
from .stage import Planner
from .schedule import iteration_times
from .timeline import chunk_times

#: Grid keys and the configuration keys they set.
GRID_KEYS = ("stages", "tensor_parallel", "micro_batch_size", "interleave")
SCORES = ("slowest", "1f1b")
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


class _Job:
    """One configuration's certified search, advanced a round at a time."""

    def __init__(self, config: dict, model: Any, bucket: float, score: str, top: int, fronts: FrontTable):
        self.config, self.model, self.fronts = config, model, fronts
        self.p, self.v = config["stages"], config["interleave"]
        self.found: list | None = None
        self.choice: dict = {}
        self.fastest = fastest_prefix(model, fronts, kind_index(model), 1)
        m = model.micro_batches * self.v if self.v > 1 else None
        self.rounds = certified_rounds(model, self.p, top, score, fronts, m)
        self.limit = next(self.rounds)
        if self.v > 1:
            self.tuples = tuple_planner(model, self.p, self.v, model.in_flight_table(self.p, self.v), fronts,
                                        self.fastest)

    def plan(self) -> Any:
        if self.v == 1:
            self.current = plan_segments(self.model, self.p, self.fronts, None, self.limit)
        else:
            self.current = self.tuples(self.limit)
        return self.current

    def step(self, values: np.ndarray) -> bool:
        """Give the round's solved times; True when the search is done."""
        if self.v == 1:
            T = self.current.fill(values)
        else:
            T, self.choice = self.current.fill(values)
        try:
            self.limit = self.rounds.send(T)
            return False
        except StopIteration as done:
            self.found = done.value
            return True


def _fingerprint(fronts: Mapping) -> Any:
    """A key equal for equal fronts (LayerOptions compare by value), else the object itself."""
    try:
        key = tuple(sorted(((k, tuple(v)) for k, v in fronts.items()), key=repr))
        hash(key)
        return key
    except TypeError:
        return id(fronts)


def _joint(jobs: list, bucket: float, backend: Any, max_bytes: int | None) -> None:
    """Run every job's rounds; each round, the problems of all jobs still searching are
    deduplicated across jobs and solved together: one engine call per distinct set of
    fronts (jobs whose options are equal, whatever their P, M or budgets, share DP
    chains; keeping different fronts apart keeps each batch's rows of similar width).
    Problems solved in an earlier round (a later round's table holds the earlier
    one's segments again) are not solved twice."""
    ids: dict[Any, int] = {}
    tables: dict[int, FrontTable] = {}
    for job in jobs:
        job.fid = ids.setdefault(_fingerprint(job.model.fronts), len(ids))
        tables.setdefault(job.fid, job.fronts)
    known = {fid: Solved() for fid in tables}  # per fid, the problems of earlier rounds
    active = list(jobs)
    while active:
        batches: dict[int, tuple] = {}  # fid -> (problem index, problems, verdicts)
        where = []
        for job in active:
            plan = job.plan()
            index, problems, verdicts = batches.setdefault(job.fid, ({}, [], []))
            local = np.empty(len(plan.problems), dtype=np.int64)
            for i, (problem, how) in enumerate(zip(plan.problems, plan.verdicts)):
                at = index.get(problem)
                if at is None:
                    at = index[problem] = len(problems)
                    problems.append(problem)
                    verdicts.append(how)
                local[i] = at
            where.append(local)
        values = {fid: solve_problems(problems, tables[fid], backend, max_bytes, verdicts, known[fid])
                  for fid, (_, problems, verdicts) in batches.items()}
        active = [job for job, local in zip(active, where) if not job.step(values[job.fid][local])]
        report("configurations", len(jobs) - len(active), len(jobs))


def _source(source: Any, capacity: Any, reserved: Any, seq: Any, bucket: Any) -> tuple:
    """``(builder(config) -> PipelineModel, name, bucket, tokens per sample or None)``."""
    if callable(source):
        return source, getattr(source, "__name__", "model"), MEGABYTE if bucket is None else bucket, seq
    from .sweep_source import builder_of
    return builder_of(source, capacity, reserved, seq, bucket)


def run_configs(configs: list, builder: Callable, *, global_batch: int, score: str, top: int, bucket: float,
                backend: Any, max_bytes: int | None, time_unit: float, tokens: Any) -> tuple[list, list]:
    """Rows of ``configs`` in process (what each Dask worker runs on its shard):
    ``(rows, skipped)``, skipped holding configurations whose model cannot be built."""
    jobs, alone, skipped, models, tables = [], [], [], {}, {}
    for config in configs:
        try:
            model = builder(dict(config))
            if config["stages"] * config["interleave"] > model.layers:
                raise ValueError(f"{config['stages']} stages x {config['interleave']} chunks is more than the "
                                 f"model's {model.layers} layers")
            model.in_flight_table(config["stages"], config["interleave"])
        except ValueError as exc:
            skipped.append({"config": config, "reason": str(exc)})
            continue
        models[id(config)] = model
        if config["interleave"] > 1 and not one_body_kind(model):
            alone.append(config)
        else:
            key = _fingerprint(model.fronts)  # one front table per distinct set of options
            fronts = tables.get(key) or tables.setdefault(key, FrontTable(model.fronts, bucket))
            jobs.append(_Job(config, model, bucket, score, top, fronts))
    _joint(jobs, bucket, backend, max_bytes)
    rows = []
    planners: dict = {}
    for job in jobs:
        model, v = job.model, job.v
        plan = planners.setdefault(job.fid, Planner(model.fronts, bucket, table=job.fronts))
        found = job.found
        if v > 1:
            found = [(counts_of(t, job.choice, job.p, v), s / v if score == "1f1b" else s) for t, s in found]
        rows += _rows(job.config, found, model, plan, v, True, bucket)
    for config in alone:  # interleaved, not one kind between the first and last layer: local search
        model = models[id(config)]
        found = best_interleaved(model, config["stages"], config["interleave"], top, score, bucket, backend,
                                 None, max_bytes)
        plan = Planner(model.fronts, bucket)
        rows += _rows(config, found, model, plan, config["interleave"], False, bucket)
    _simulate_rows(rows, global_batch, time_unit, tokens)
    return rows, skipped


def _rows(config: dict, found: list, model: Any, plan: Planner, v: int, exact: bool, bucket: float) -> list:
    """Rows of one configuration, their simulated times still to fill (:func:`_simulate_rows`)."""
    if not found:
        held = coverage(model, config["stages"], bucket) if v == 1 else None
        return [{"config": config, "rank": 1, "counts": None, "score": None, "iteration_time": None,
                 "throughput": None, "peak_memory_bytes": None, "feasible": False, "exact": exact,
                 "coverable_layers": held, "layers": model.layers}]
    out = []
    for i, (counts, value) in enumerate(found):
        stages = model.stages(list(counts), None, v)
        choices = [plan.stage(st) for st in stages]
        choice = PipelineChoice(tuple(choices), tuple(c.time + st.fixed_time for c, st in zip(choices, stages)))
        peak = [model.capacity - model.reserved - st.budget + sc.memory for st, sc in zip(stages, choices)]
        names = model.option_names(counts, choice, None, v)
        out.append({"config": config, "rank": i + 1, "counts": [int(c) for c in counts], "score": float(value),
                    "iteration_time": None, "throughput": None, "peak_memory_bytes": peak, "feasible": True,
                    "exact": exact, "_times": chunk_times(model, counts, names, v)})
    return out


def _simulate_rows(rows: list, global_batch: int, time_unit: float, tokens: Any) -> None:
    """Fill every feasible row's simulated iteration time and throughput: one batched
    simulation per (stages, chunks, micro-batches)."""
    groups: dict[tuple, list] = {}
    for r in rows:
        if r["feasible"]:
            c = r["config"]
            groups.setdefault((c["stages"], c["interleave"], c["micro_batches"]), []).append(r)
    for (p, v, m), members in groups.items():
        fwd = np.array([r["_times"].forward for r in members], dtype=np.float64)
        bwd = np.array([r["_times"].backward for r in members], dtype=np.float64)
        times = iteration_times(fwd, bwd, m, "interleaved" if v > 1 else "1f1b")
        for r, t in zip(members, times.tolist()):
            del r["_times"]
            samples = global_batch / (t * time_unit) if t > 0 else math.inf
            r["iteration_time"] = t
            r["throughput"] = {"samples_per_second": samples,
                               "tokens_per_second": None if tokens is None else samples * tokens}


def order_rows(rows: list, configs: list) -> list:
    """Feasible rows by throughput (highest first), then the infeasible; ties by the
    configuration's place in the grid, then the split's rank."""
    place = {tuple(sorted(c.items())): i for i, c in enumerate(configs)}

    def key(r: dict) -> tuple:
        speed = r["throughput"]["samples_per_second"] if r["feasible"] else -math.inf
        return (-speed, place.get(tuple(sorted(r["config"].items())), 0), r["rank"])

    return sorted(rows, key=key)


def sweep(source: Any, grid: Mapping, *, gpus: int, global_batch: int, score: str = "1f1b", top: int = 1,
          backend: Any = "auto", scheduler: Any = None, capacity: Any = None, reserved: Any = None,
          seq: Any = None, bucket: Any = None, max_bytes: int | None = None, time_unit: float = 1e-3,
          shards: int | None = None) -> Sweep:
    """Score every configuration of ``grid`` on ``gpus`` GPUs at ``global_batch`` samples a step.

    ``source``: a spec with a ``transformer`` section, a Hugging Face ``config.json``
    (then ``capacity`` and ``seq`` are needed), or a callable ``(config) ->
    PipelineModel``.  ``grid`` maps ``stages``, ``tensor_parallel``,
    ``micro_batch_size`` and ``interleave`` to lists (missing: ``[1]``).  ``score``:
    ``slowest`` or ``1f1b`` (the split search); ``top`` splits per configuration.
    ``time_unit``: seconds per profile time unit (analytic and Hugging Face models
    are in ms).  ``scheduler``: a Dask scheduler address or ``distributed.Client``
    to shard the configurations over (``shards`` of them, default two per worker);
    None runs in process without Dask.  Rows are identical either way.
    """
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES} for a sweep (every row carries its simulated time), "
                         f"got {score!r}")
    top = check_int(top, "top", 1)
    if top > MAX_TOP:
        raise ValueError(f"top={top} is over the limit of {MAX_TOP} splits per configuration")
    from .backend import get_backend
    from .engine import check_max_bytes

    get_backend(backend)
    if max_bytes is not None:
        check_max_bytes(max_bytes)
    if not (isinstance(time_unit, (int, float)) and 0 < time_unit < math.inf):
        raise ValueError(f"time_unit must be a positive number of seconds, got {time_unit!r}")
    builder, _, bucket, tokens = _source(source, capacity, reserved, seq, bucket)
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
        from .cluster import run_on_cluster
        rows, bad = run_on_cluster(scheduler, configs, builder, kwargs, shards)
    place = {tuple(sorted(c.items())): i for i, c in enumerate(configs)}
    bad.sort(key=lambda s: place.get(tuple(sorted(s["config"].items())), 0))  # shards finish in any order
    return Sweep(order_rows(rows, configs), skipped + bad)
