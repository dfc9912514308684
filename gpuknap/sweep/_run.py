"""Running a sweep's configurations: every configuration's certified search in lockstep.

Each configuration is a whole-model search (:func:`gpuknap.best_splits`); run
one by one, their stage problems overlap heavily (the same layers, in-flight
count and budget recur across P, M and v).  Here every configuration's
certified rounds (:func:`gpuknap.search.certified_rounds`, on the same table
sources ``best_splits`` uses) advance together: each round, the stage problems
of all configurations still searching are deduplicated across configurations
and solved in ONE engine call per distinct set of options, then each
configuration's split search runs on its own table.  Results are exactly
those of ``best_splits`` run alone.

Interleaved configurations of models that are not one kind between their
first and last layer use the local search one configuration at a time.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..engine import PipelineChoice, Planner, paused_collection, report
from ..costs import pipeline_send, run_of
from ..schedule import chunk_times, unbounded_iteration_times
from ..search import (
    SegmentSource,
    Solver,
    TupleSource,
    best_interleaved,
    coverage,
    even_candidate,
    even_is_faster,
    fastest_prefix,
    front_table,
    interleaved_counts,
    interleaved_rounds,
    interleaved_score,
    kind_index,
    one_body_kind,
)
from ._explain import headroom, idle_share, infeasible_reason
from ._framework import framework_rows

#: The progress phase of a batch's searches: configurations whose search is done, of the batch's.
SEARCHES = "searches"
#: Scores a sweep can search by (every row carries its simulated iteration time anyway).
SCORES = ("slowest", "1f1b")


class _Job:
    """One configuration's certified search, advanced a round at a time."""

    def __init__(self, config: dict, model: Any, bucket: float, score: str, top: int, cache: dict):
        self.config, self.model, self.score = config, model, score
        self.p, self.v = config["stages"], config["interleave"]
        self.found: list | None = None
        if self.v == 1:
            self.source: Any = SegmentSource(model, self.p, bucket, cache=cache)
            self.fronts = self.source.tables[0]
            self.rounds = self.source.rounds(score, top)
        else:
            self.fronts = front_table(model.fronts, bucket, cache=cache)
            fastest = fastest_prefix(model, self.fronts, kind_index(model), 1)
            self.source = TupleSource(model, self.p, self.v, model.in_flight_table(self.p, self.v), self.fronts,
                                      fastest)
            self.rounds = interleaved_rounds(self.source, self.p, self.v, top, score, model.micro_batches)
        self.limit = next(self.rounds)

    def plan(self) -> list:
        return self.source.plan(self.limit)

    def step(self, values: list) -> bool:
        """Give the round's solved times; True when the search is done."""
        try:
            self.limit = self.rounds.send(self.source.fill(values))
            return False
        except StopIteration as done:
            self.found = done.value if self.v == 1 else interleaved_counts(done.value, self.source, self.p, self.v,
                                                                           self.score)
            return True


def _joint(jobs: list, backend: Any, max_bytes: int | None) -> None:
    """Run every job's rounds; each round, the problems of all jobs still searching are
    solved together: one engine call per distinct set of options (jobs whose options are
    equal, whatever their P, M or budgets, share one front table and so DP chains; keeping
    different options apart keeps each batch's rows of similar width).  Jobs' problems are
    concatenated, not matched one by one: two configurations almost never pose the same
    problem (a budget depends on the data-parallel size, an in-flight count on P and M),
    and a problem listed twice costs one more readout of the same DP row.  Problems solved
    in an earlier round are not solved twice."""
    solve = Solver(backend, max_bytes)
    active = list(jobs)
    while active:
        batches: dict[int, tuple] = {}  # id(front table) -> (front table, problems, verdicts)
        where = []
        for job in active:
            spots = []
            for fronts, problems, verdicts in job.plan():
                _, merged, judged = batches.setdefault(id(fronts), (fronts, [], []))
                spots.append((id(fronts), len(merged), len(problems)))
                merged.extend(problems)
                judged.extend(verdicts)
            where.append(spots)
        keys = list(batches)
        solved = dict(zip(keys, solve([batches[k] for k in keys])))
        active = [job for job, spots in zip(active, where)
                  if not job.step([solved[k][at:at + n] for k, at, n in spots])]
        report(SEARCHES, len(jobs) - len(active), len(jobs))


@paused_collection()
def run_configs(configs: list, builder: Callable, *, global_batch: int, score: str, top: int, bucket: float,
                backend: Any, max_bytes: int | None, time_unit: float, tokens: Any,
                framework: str | None = None) -> tuple[list, list]:
    """Rows of ``configs`` in process (what each Dask worker runs on its shard):
    ``(rows, skipped)``, skipped holding configurations whose model cannot be built.
    ``framework``: rows as that framework runs them (:mod:`._framework`)."""
    jobs, alone, skipped, models, cache = [], [], [], {}, {}
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
            try:
                job = _Job(config, model, bucket, score, top, cache)
                job.plan()  # size checks (an interleaved search too large to weigh) refuse here, not mid-sweep
            except ValueError as exc:
                skipped.append({"config": config, "reason": str(exc)})
                continue
            jobs.append(job)
    _joint(jobs, backend, max_bytes)
    rows, even = [], []
    planners: dict[int, Planner] = {}  # one per front table: equal stages of several configurations solved once
    searched = [(job.config, job.found, job.model, True, job.fronts) for job in jobs]
    for config in alone:  # interleaved, not one kind between the first and last layer: local search
        model = models[id(config)]
        searched.append((config, best_interleaved(model, config["stages"], config["interleave"], top, score, bucket,
                                                  backend, None, max_bytes), model, False, None))
    for config, found, model, exact, fronts in searched:
        if framework is not None and found:
            try:
                named, best_even = framework_rows(config, found, model, framework, score, top, bucket, backend,
                                                  max_bytes)
            except ValueError as exc:  # settings the framework cannot state, or a constrained search refused
                skipped.append({"config": config, "reason": str(exc)})
                continue
            rows += named or _unstated(config, model, framework, exact)
            even += best_even
            continue
        plan = (planners.setdefault(id(fronts), Planner(model.fronts, bucket, table=fronts)) if fronts is not None
                else Planner(model.fronts, bucket))
        rows += _rows(config, found, model, plan, config["interleave"], exact, bucket)
        even += _even_row(config, found, model, plan, score, bucket)
    _simulate_rows(rows + even, global_batch, time_unit, tokens)
    return _with_even(rows, even, top), skipped


def _even_row(config: dict, found: list, model: Any, plan: Planner, score: str, bucket: float) -> list:
    """An interleaved configuration's even split (Megatron's default) as a candidate row: the
    closed form sees only stage totals and can pick a split whose unequal chunks simulate far
    slower than the even one (docs/sweep.md).  Empty when it does not fit or was found anyway."""
    v = config["interleave"]
    counts = even_candidate(model, config["stages"], v, [c for c, _ in found]) if found else None
    if counts is None:
        return []
    stages = model.stages(counts, None, v)
    choices = [plan.stage(st) for st in stages]
    if any(c is None for c in choices):
        return []
    times = np.array([[c.time + st.fixed_time for c, st in zip(choices, stages)]])
    value = float(interleaved_score(times, score, model.micro_batches, v)[0])
    row = _rows(config, [(counts, value)], model, plan, v, False, bucket)[0]
    row["even_split"] = True
    return [row]


def _with_even(rows: list, even: list, top: int) -> list:
    """Each configuration's rows, its even split first where that simulates faster than the
    closed form's best split (the others a rank lower, ``top`` rows kept)."""
    first = {id(x["config"]): x for x in rows if x["rank"] == 1}
    faster = {id(r["config"]): r for r in even
              if even_is_faster(r["iteration_time"], first[id(r["config"])]["iteration_time"])}
    if not faster:
        return rows
    out = []
    for r in rows:
        if id(r["config"]) in faster and r["feasible"]:
            if r["rank"] == 1:
                out.append(faster[id(r["config"])])
            if r["rank"] < top:
                out.append({**r, "rank": r["rank"] + 1})
        else:
            out.append(r)
    return out


#: A feasible row's fields that an infeasible row carries as None (null in the JSON), so that every
#: row has the same keys.
_RUN_FIELDS = ("headroom_bytes", "idle_share", "iteration_time_s", "mfu", "tflops_per_gpu", "breakdown",
               "stage_breakdown")


def _infeasible(config: dict, model: Any, exact: bool, held: int | None, reason: str) -> list:
    """The one row of a configuration with no feasible split (``held``: its coverable layers)."""
    return [{"config": config, "rank": 1, "counts": None, "score": None, "iteration_time": None,
             "throughput": None, "peak_memory_bytes": None, "feasible": False, "exact": exact,
             **dict.fromkeys(_RUN_FIELDS), "coverable_layers": held, "layers": model.layers, "reason": reason}]


def _unstated(config: dict, model: Any, framework: str, exact: bool) -> list:
    """The row of a configuration ``framework`` cannot run within memory, though a plan with every
    layer on its own option fits."""
    return _infeasible(config, model, exact, None, f"no split fits the device memory with settings {framework} "
                                                   "runs as written (a plan with every layer on its own recompute "
                                                   "option fits)")


def _rows(config: dict, found: list, model: Any, plan: Planner, v: int, exact: bool, bucket: float) -> list:
    """Rows of one configuration, their simulated times still to fill (:func:`_simulate_rows`)."""
    if not found:
        held = coverage(model, config["stages"], bucket) if v == 1 else None
        return _infeasible(config, model, exact, held, infeasible_reason(model, config["stages"], v, held))
    out = []
    for i, (counts, value) in enumerate(found):
        stages = model.stages(list(counts), None, v)
        choices = [plan.stage(st) for st in stages]
        choice = PipelineChoice(tuple(choices), tuple(c.time + st.fixed_time for c, st in zip(choices, stages)))
        peak = [model.capacity - model.reserved - st.budget + sc.memory for st, sc in zip(stages, choices)]
        names = model.option_names(counts, choice, None, v)
        out.append({"config": config, "rank": i + 1, "counts": [int(c) for c in counts], "score": float(value),
                    "iteration_time": None, "throughput": None, "peak_memory_bytes": peak,
                    "headroom_bytes": headroom(model, peak), "feasible": True,
                    "exact": exact, "_times": chunk_times(model, counts, names, v), "_run": (model, names)})
    return out


def _simulate_rows(rows: list, global_batch: int, time_unit: float, tokens: Any) -> None:
    """Fill every feasible row's simulated iteration time and throughput: one batched
    simulation per (stages, chunks, micro-batches, pipeline send).  A cost-modelled row's
    iteration adds its stages' tails (exposed data-parallel communication, optimizer step)
    and carries MFU, TFLOP/s per GPU and the busiest stage's time breakdown (seconds)."""
    groups: dict[tuple, list] = {}
    for r in rows:
        if r["feasible"]:
            c = r["config"]
            send = pipeline_send(r["_run"][0], c["stages"])
            groups.setdefault((c["stages"], c["interleave"], c["micro_batches"], send), []).append(r)
    for (p, v, m, send), members in groups.items():
        fwd = np.array([r["_times"].forward for r in members], dtype=np.float64)
        bwd = np.array([r["_times"].backward for r in members], dtype=np.float64)
        times = unbounded_iteration_times(fwd, bwd, m, "interleaved" if v > 1 else "1f1b", send)  # a sweep is paced itself
        for r, t in zip(members, times.tolist()):
            r["idle_share"] = idle_share(r["_times"].forward, r["_times"].backward, m, t)
            del r["_times"]
            model, names = r.pop("_run")
            run = run_of(model, r["counts"], names, v, t) if model.costs is not None else None
            seconds = run.iteration_time if run is not None else t * time_unit
            samples = global_batch / seconds if seconds > 0 else math.inf
            r["iteration_time"] = t if run is None else run.iteration_time / time_unit
            r["iteration_time_s"] = seconds
            r["throughput"] = {"samples_per_second": samples,
                               "tokens_per_second": None if tokens is None else samples * tokens}
            r["mfu"] = None if run is None else run.mfu
            r["tflops_per_gpu"] = None if run is None else run.tflops_per_gpu
            r["breakdown"] = None if run is None else run.breakdown
            r["stage_breakdown"] = None if run is None else list(run.stages)
