"""The commands about one split: ``curve`` (a stage's time against its memory) and ``timeline``
(the split's simulated schedule)."""
from __future__ import annotations

import argparse

import numpy as np

from .. import schedule
from ..engine import FrontTable, get_backend, least_times
from ..search import best_splits, even_counts
from ._commands import (EXIT_INFEASIBLE, BadInput, _emit, _header, _max_bytes, _spec, _spec_for_counts, _stages,
                        schedule_size)
from ._flags import EXIT_OK, counts_list, plural
from ._gantt import communication_shares
from ._plots import plot_curve, plot_timeline
from ._report import run_record, run_summary


def cmd_curve(args: argparse.Namespace) -> int:
    counts = counts_list(args.counts) if args.counts is not None else None
    spec = _spec(args, args.spec) if counts is None else _spec_for_counts(args, len(counts), None, "--counts")
    backend = get_backend(args.backend)
    if counts is not None:
        try:
            spec.model.check_counts(counts, spec.chunks)
        except ValueError as exc:
            raise BadInput(f"--counts: {exc}") from None
    else:
        stages = _stages(args, spec)
        if spec.chunks > 1:
            schedule_size(args, spec, stages, spec.chunks)
        found = best_splits(spec.model, stages, 1, "slowest", spec.bucket, backend, spec.in_flight, _max_bytes(args),
                            interleave=spec.chunks)
        if not found:
            chunked = f" x {spec.chunks} chunks" if spec.chunks > 1 else ""
            _emit(args, {**_header("curve", spec, "numpy"), "counts": None, "stage": args.stage, "points": None},
                  f"no feasible split of {spec.name} into {plural(stages, 'stage')}{chunked} fits the device memory")
            return EXIT_INFEASIBLE
        counts = list(found[0][0])
    p = len(counts) // spec.chunks
    if spec.chunks > 1:  # the interleaved in-flight table is read from the schedule's order
        schedule_size(args, spec, p, spec.chunks)
    if spec.stages is not None and args.counts and p != spec.stages and spec.in_flight is not None:
        raise BadInput(f"--counts: {p} stages, but the spec's in-flight table is for {spec.stages}")
    if not args.stage < p:
        raise BadInput(f"--stage: must be in 0..{p - 1} for a split of {plural(p, 'stage')}, got {args.stage}")
    stage = spec.model.stages(counts, spec.in_flight, spec.chunks)[args.stage]
    table = FrontTable(spec.model.fronts, spec.bucket)
    useful = [(g.count, table.get(g.kind, g.in_flight)) for g in stage.groups]
    lightest = sum(n * float(f.memories[0]) for n, f in useful)
    fastest = sum(n * float(f.memories[-1]) for n, f in useful)
    within = least_times(stage.groups, spec.model.fronts, max(stage.budget, fastest), spec.bucket)
    budgets = sorted(set(np.linspace(lightest, fastest, args.points).tolist()) | {max(stage.budget, 0.0)})
    points = []
    for b in budgets:
        t = within(float(b))
        points.append({"budget_bytes": float(b), "time": t if np.isfinite(t) else None})
    payload = {**_header("curve", spec, "numpy"), "counts": counts, "stage": args.stage,
               "stage_budget_bytes": stage.budget, "points": points}
    lines = [f"stage {args.stage} of split {counts} (its budget {stage.budget / 2**20:,.1f} MiB): "
             f"least time within each budget, from its lightest to its fastest choice",
             f"{'budget (MiB)':>14} {'time':>12}"]
    for pt in points:
        shown = "infeasible" if pt["time"] is None else f"{pt['time']:.6g}"
        mark = "  <- the stage's budget" if pt["budget_bytes"] == max(stage.budget, 0.0) else ""
        lines.append(f"{pt['budget_bytes'] / 2**20:>14,.1f} {shown:>12}{mark}")
    if args.plot:
        plot_curve(points, args.plot, f"{spec.name}: stage {args.stage} of split {counts}\nits least time within each "
                   f"memory budget", stage.budget, spec.model.costs is not None)
    _emit(args, payload, "\n".join(lines))
    return EXIT_OK if any(p["time"] is not None for p in points) else EXIT_INFEASIBLE


def cmd_timeline(args: argparse.Namespace) -> int:
    counts = counts_list(args.counts) if args.counts is not None else None
    spec = _spec(args, args.spec) if counts is None else _spec_for_counts(args, len(counts), args.interleave,
                                                                          "--counts")
    chunks = args.interleave or spec.chunks
    if counts is None and args.recompute:  # a run as it was run: Megatron's even split
        try:
            counts = even_counts(spec.model, _stages(args, spec) * chunks)
        except ValueError as exc:
            raise BadInput(f"--{exc}") from None
    elif counts is None:
        schedule_size(args, spec, _stages(args, spec), chunks, schedule.MAX_TIMELINE_OPS)
        found = best_splits(spec.model, _stages(args, spec), 1, "1f1b", spec.bucket, get_backend(args.backend),
                            spec.in_flight if chunks == spec.chunks else None, _max_bytes(args), interleave=chunks)
        if not found:
            shape = plural(_stages(args, spec), "stage") + (f" x {chunks} chunks" if chunks > 1 else "")
            _emit(args, {**_header("timeline", spec, "numpy"), "counts": None, "timeline": None},
                  f"no feasible split of {spec.name} into {shape} fits the device memory")
            return EXIT_INFEASIBLE
        counts = list(found[0][0])
    try:
        spec.model.check_counts(counts, chunks)
    except ValueError as exc:
        raise BadInput(f"--counts: {exc}") from None
    schedule_size(args, spec, len(counts) // chunks, chunks, schedule.MAX_TIMELINE_OPS)
    costs = spec.model.costs
    p2p = args.p2p if args.p2p is not None else (costs.p2p if costs is not None else 0.0)
    names = spec.model.plan(counts, spec.bucket, spec.in_flight if chunks == spec.chunks else None, chunks)
    if names is None:
        return _unfit(args, spec, counts, chunks)
    t, times, closed = schedule.of_plan(spec.model, counts, names, chunks, p2p)
    if args.plot:
        plot_timeline(t, times, args.plot, f"{spec.name}: split {counts}", spec.model.costs is not None,
                      communication_shares(spec.model, counts, names, chunks))
    run = run_record(spec.model, counts, names, chunks)
    payload = {**_header("timeline", spec, "numpy"), "timeline": schedule.record(t, times, counts),
               "closed_form_1f1b": closed, **run}
    text = schedule.summary(t, f"{spec.name}, split {counts}", closed)
    if run["iteration_time_s"] is not None:
        text += "\n" + run_summary(run)
    _emit(args, payload, text)
    return EXIT_OK


def _unfit(args: argparse.Namespace, spec, counts: list, chunks: int) -> int:
    """A split that does not fit: the stage furthest over its memory with its lightest options, and,
    when every layer's option is fixed (``--recompute``, a run as it was run) on a cost-modelled
    model, the run's time as if it fitted (the memory model can be stricter than a real run)."""
    model = spec.model
    worst, over = model.furthest_over(counts, spec.in_flight if chunks == spec.chunks else None, chunks)
    unfit = {"stage": worst, "needed_bytes": model.capacity + over, "capacity_bytes": model.capacity,
             "reserved_bytes": model.reserved, "fits_in_exact_bytes": bool(over <= 0)}
    text = (f"split {counts} of {spec.name} does not fit the device memory: stage {worst} needs "
            f"{(model.capacity + over) / 2**30:,.2f} GiB with its lightest options ({model.reserved / 2**30:,.2f} GiB "
            f"reserved) on the {model.capacity / 2**30:,.2f} GiB device")
    if over <= 0:  # fits in exact bytes, not once its memory is rounded up to whole buckets
        text += f", over it once memory is counted in buckets of {spec.bucket / 2**20:,.6g} MiB (--bucket)"
    else:
        text += f", {over / 2**20:,.1f} MiB over"
    if args.plot:
        text += f"\nno plot written to {args.plot}: nothing was simulated"
    payload = {**_header("timeline", spec, "numpy"), "counts": counts, "timeline": None, "unfit": unfit,
               "run_if_it_fitted": None}
    if model.costs is not None and all(len(model.fronts[k]) == 1 for k in model.kind_order):
        run = run_record(model, counts, [model.fronts[k][0].name for k in model.kinds], chunks)
        payload["run_if_it_fitted"] = run
        text += f"\nif it fitted (memory aside): {run_summary(run)}"
    _emit(args, payload, text)
    return EXIT_INFEASIBLE
