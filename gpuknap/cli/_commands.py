"""The commands ``best`` and ``rank``, and what every command shares (``curve`` and ``timeline``
are in :mod:`._split`, ``sweep`` in :mod:`._sweep`; the parser and the exit codes in :mod:`._main`)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any
from importlib import resources

import numpy as np

from .. import formats, schedule
from .._version import __version__
from ..costs import pipeline_send
from ..engine import (WorkTooLarge, available_host_bytes, counting, format_bytes, get_backend, max_cells, pp_lite,
                      work_limit)
from ..formats import Spec, load_spec, pipeline_shape
from ..formats.splitfiles import distinct_rows, rank_bytes, read_splits, write_scores
from ..search import one_body_kind
from ..search import best_splits, coverage, even_candidate, even_is_faster
from ..sweep import infeasible_reason
from ._flags import EXIT_OK, plural
from ._frameworks import best_emit, rank_settings, settings_of_best
from ._gantt import communication_shares
from ._progress import note
from ._plots import plot_best, plot_scores
from ._report import JSON_VERSION, format_split, run_times, split_record, whole_bytes

EXIT_INFEASIBLE = 1  # nothing feasible (said in words); the other codes are in flags
#: Rows of a splits file scored per block (bounds memory; one progress step each).
RANK_BLOCK = 250_000
#: Most budgets ``curve --points`` evaluates.
MAX_POINTS = 10_000


class BadInput(ValueError):
    """Raised for command-line input that cannot be used."""


def default_example() -> str:
    """The shipped example run by ``gpuknap best`` without a SPEC."""
    return str(resources.files("gpuknap") / "examples" / "demo.json")


def device_keywords(args: argparse.Namespace) -> dict:
    """The device flags as reader keywords (None where not given)."""
    return {"device": args.device, "gpus_per_node": args.gpus_per_node, "efficiency": args.efficiency,
            "device_fields": dict(args.device_field) if args.device_field else None}


def _spec(args: argparse.Namespace, path: str | None, note_dp: bool = True, **extra: Any) -> Spec:
    spec = load_spec(path or default_example(), capacity=args.capacity, micro_batches=args.micro_batches,
                     stages=getattr(args, "stages", None), bucket=args.bucket, reserved=args.reserved, seq=args.seq,
                     micro_batch=args.micro_batch_size, tensor_parallel=args.tp, expert_parallel=args.ep,
                     expert_tensor_parallel=args.etp, context_parallel=args.cp, data_parallel=args.dp,
                     recompute=args.recompute,
                     **{"tp_comm_overlap": args.tp_comm_overlap, "dispatcher": args.dispatcher, **extra},
                     **device_keywords(args))
    args.bucket_field = spec.bucket_field  # named by refusals that suggest a bucket
    for text in spec.notes:
        note(text)
    costs = spec.model.costs
    if extra.get("dispatcher", args.dispatcher) == "flex" and costs is not None and not costs.moe:
        note("flex dispatcher: the model has no MoE layers, so no tokens are dispatched and it changes nothing")
    if note_dp and spec.kind == "config" and args.dp is None and "data_parallel" not in extra:
        note("--dp not given: data-parallel size 1, so the optimizer state is not sharded and no gradients are "
             "reduced; give --dp for the run you plan")
    return spec


def _max_bytes(args: argparse.Namespace) -> int | None:
    return None if args.max_memory is None else int(args.max_memory)


#: Stands in for a timeline's operations while the rest of the document is indented.
_OPS = "__gpuknap_timeline_ops__"


def _emit(args: argparse.Namespace, payload: dict, text: str) -> None:
    if args.json:
        sys.stdout.write(json_text(payload) + "\n")
    else:
        print(text)


def json_text(payload: dict) -> str:
    """The JSON document, indented, except a timeline's operations: one compact line each (the
    indenting encoder is pure Python, about 20 times slower than the compact one, and a timeline
    may hold hundreds of thousands of operations)."""
    payload = whole_bytes(payload)
    timeline = payload.get("timeline")
    ops = timeline.get("ops") if isinstance(timeline, dict) else None
    if not ops:
        return json.dumps(payload, indent=2, allow_nan=False)
    text = json.dumps({**payload, "timeline": {**timeline, "ops": _OPS}}, indent=2, allow_nan=False)
    encode = json.JSONEncoder(allow_nan=False).encode
    body = "[\n" + ",\n".join("      " + encode(op) for op in ops) + "\n    ]"
    return text.replace(json.dumps(_OPS), body, 1)


def _header(command: str, spec: Spec, backend: str) -> dict:
    return {"gpuknap_json": JSON_VERSION, "version": __version__, "command": command, "source": spec.source,
            "name": spec.name, "layers": spec.model.layers, "micro_batches": spec.model.micro_batches,
            "bucket_bytes": spec.bucket, "backend": backend}


def _stages(args: argparse.Namespace, spec: Spec) -> int:
    if spec.stages is None:
        raise BadInput("--stages: the number of stages is missing (give --stages or pipeline.stages in the spec)")
    return spec.stages  # at most the model's layers: load_spec refuses more


def schedule_size(args: argparse.Namespace, spec: Spec, stages: int, chunks: int,
                  limit: int = schedule.MAX_OPS, order: bool = True) -> None:
    """Refuse, naming the flag or field, a schedule too long to simulate (every command that
    reports a split simulates Megatron's schedule for it), before any search; and, with
    ``order``, an interleaved one whose micro-batches Megatron's order cannot group."""
    m = spec.model.micro_batches
    ops = 2 * stages * chunks * m
    where = "--micro-batches" if args.micro_batches is not None else f"{spec.source}: pipeline.micro_batches"
    if chunks > 1 and order:  # Megatron's interleaved order needs M to fill its groups
        try:
            schedule.check_schedule("interleaved", stages, chunks, m)
        except ValueError as exc:
            raise BadInput(f"{where} with {plural(stages, 'stage')} x {chunks} chunks: {exc}") from None
    if ops > limit:
        raise BadInput(f"{where}: {m:,} micro-batches on {plural(stages, 'stage')}"
                       + (f" x {chunks} chunks" if chunks > 1 else "") + f" make {ops:,} schedule operations, over "
                       f"the {limit:,} gpuknap simulates{' and prints' if limit < schedule.MAX_OPS else ''}; use fewer "
                       "micro-batches (a larger "
                       "--micro-batch-size) or fewer stages")


def cmd_best(args: argparse.Namespace) -> int:
    spec = _spec(args, args.spec)
    stages = _stages(args, spec)
    chunks = args.interleave or spec.chunks
    schedule_size(args, spec, stages, chunks)
    in_flight = spec.in_flight if chunks == spec.chunks else None  # another --interleave: the schedule's table
    backend = get_backend(args.backend)
    model = spec.model
    if args.emit in formats.EMITTERS:  # the plans the framework runs as written, and their settings
        return best_emit(args, spec, stages, chunks, in_flight, backend, _max_bytes(args),
                         lambda payload, text: _emit(args, payload, text), _header("best", spec, backend.name))
    found = best_splits(model, stages, args.top, args.score, spec.bucket, backend, in_flight, _max_bytes(args),
                        bound=args.bound, interleave=chunks)
    exact = getattr(found, "exact", True)
    records = [split_record(spec.model, f[0], f[2], args.score, f[1], in_flight, chunks,
                            lower_bound=f[3] if args.bound else None, bucket=spec.bucket) for f in found]
    for r, simulated in zip(records, schedule.simulated_times(spec.model, found, in_flight, chunks)):
        r["iteration_time_simulated"] = simulated
    payload = {**_header("best", spec, backend.name), "stages": stages, "interleave": chunks, "score": args.score,
               "top": args.top, "exact": exact, "results": records}
    if not exact:
        payload["optimum_lower_bound"] = found.lower_bound
    shape = plural(stages, "stage") + (f" x {plural(chunks, 'chunk')}" if chunks > 1 else "")
    if not found:
        held = coverage(spec.model, stages, spec.bucket, spec.in_flight) if chunks == 1 else None
        payload["coverable_layers"] = held  # interleaved: no such bound (null, as in a sweep's row)
        why = (f": {infeasible_reason(spec.model, stages, chunks, None)}" if held is None else
               "" if held >= spec.model.layers else
               ": not even its first layer fits on a device" if held == 0 else
               f": even with their lightest options the {plural(stages, 'stage')} hold at most {held:,} of its "
               f"{spec.model.layers:,} layers")
        if spec.model.capacity < 2**20:  # a spec's capacity written without its unit reads as bytes
            why += f" (its capacity is {spec.model.capacity:,.0f} bytes: a size without a unit is bytes)"
        _emit(args, payload, f"no feasible split of {spec.name} into {shape} fits the device memory{why}"
              + ("" if exact else " (among the splits a local search tried)"))
        return EXIT_INFEASIBLE
    text = "\n\n".join(format_split(r, f"#{i + 1} of {spec.name}, {shape}") for i, r in enumerate(records))
    if not exact and getattr(found, "why", ""):  # a search stopped at a cap: the best splits it found
        gap = (found[0][1] - found.lower_bound) / found[0][1] if found[0][1] > 0 else 0.0
        text += (f"\n\nnot proven optimal: the exact {args.score} search stopped at its cap ({found.why}); these are "
                 f"the best splits it simulated, and no split is faster than {found.lower_bound:.6g} "
                 f"(#1 is within {100 * gap:.2g} % of that)")
    elif not exact:
        why = ("the layers are not one kind between the first and the last" if not one_body_kind(spec.model)
               else f"the exact {args.score} search of interleaved splits ran out of its work budget, and a "
                    "local search went on from its best")
        text += (f"\n\nlocal search over interleaved splits ({why}): not proven optimal; the optimum is at least "
                 f"{found.lower_bound:.6g}")
    even = _even_split(spec, stages, chunks, in_flight, found, records[0]) if args.score != "simulated" else None
    if even is not None:
        payload["even_split"] = even
        runs = ("" if even["iteration_time_s"] is None else
                f" (as runs, sends and tails included: {even['iteration_time_s']:.4g} s against "
                f"{records[0]['iteration_time_s']:.4g} s)")
        text += (f"\n\nnote: Megatron's even split {even['counts']} simulates to "
                 f"{even['iteration_time_simulated']:.6g} against #1's {records[0]['iteration_time_simulated']:.6g}"
                 f"{runs}, faster: the {args.score} score sees only stage totals, not unequal chunks; --score "
                 "simulated searches the simulated time")
    if args.emit == "json":  # each framework's settings for the best split
        payload["settings"] = settings_of_best(spec, found, in_flight, chunks)
    if args.plot:
        counts = list(found[0][0])
        names = spec.model.option_names(counts, found[0][2], in_flight, chunks)  # #1's plan, as reported
        try:
            solved = schedule.of_plan(spec.model, counts, names, chunks, pipeline_send(spec.model, stages))
        except ValueError:  # too many operations to draw: the stage chart alone
            solved = None
        comm = communication_shares(spec.model, counts, names, chunks)
        run = "" if records[0]["mfu"] is None else (f"; the run {records[0]['iteration_time_s']:.4g} s, "
                                                     f"MFU {100 * records[0]['mfu']:.1f}%, "
                                                     f"{records[0]['tflops_per_gpu']:.0f} TFLOP/s per GPU")
        plot_best(records, solved, args.plot, f"{spec.name}, {shape}: best split {counts}{run}", comm)
    _emit(args, payload, text)
    return EXIT_OK


def _even_split(spec: Spec, stages: int, chunks: int, in_flight: Any, found: Any, first: dict) -> dict | None:
    """Megatron's even interleaved split when it fits and simulates faster than the first found."""
    model = spec.model
    counts = even_candidate(model, stages, chunks, [found[0][0]])
    if counts is None:
        return None
    choice = pp_lite(model.stages(counts, in_flight, chunks), model.fronts, spec.bucket)
    if choice is None:
        return None
    first_counts, _, first_choice = found[0][:3]
    plans = [(c, model.option_names(c, ch, in_flight, chunks))
             for c, ch in ((counts, choice), (list(first_counts), first_choice))]
    (simulated,) = schedule.simulated_plans(model, plans[:1], chunks)
    runs = run_times(model, plans, chunks)
    if simulated is None or not (even_is_faster(runs[0], runs[1]) if runs
                                 else even_is_faster(simulated, first["iteration_time_simulated"])):
        return None  # as a sweep decides: by the run's time (sends and tails) where there is a run
    return {"counts": counts, "iteration_time_simulated": simulated, "iteration_time_s": runs and runs[0]}


def cmd_rank(args: argparse.Namespace) -> int:
    if (args.splits is None) == (args.settings is None):
        _spec(args, args.spec)  # a bad spec or flag is named first
        raise BadInput("--splits or --from: give one (a file of splits, or a framework's settings to score)")
    if args.settings is not None:
        if args.out or args.plot:
            raise BadInput(f"{'--out' if args.out else '--plot'}: applies to --splits, not --from")
        return _rank_settings(args)
    sf = read_splits(args.splits)
    splits = sf.counts
    width = splits.shape[1]
    need, free = rank_bytes(len(splits), width), available_host_bytes()
    if need > free:  # before the 64-bit copy and the hashing, which would run out of memory part way
        raise BadInput(f"{sf.path}: ranking {len(splits):,} splits of {width} counts needs about "
                       f"{format_bytes(need)} of memory, over the {format_bytes(free)} available here; rank the "
                       "file in parts (or its distinct rows)")
    spec = _spec_for_counts(args, width, None, sf.where(0))  # the splits' stage count, as timeline's --counts
    if spec.stages is not None and width != spec.stages * spec.chunks:
        need = f"{spec.stages} stages" + (f" x {spec.chunks} chunks" if spec.chunks > 1 else "")
        raise BadInput(f"{sf.where(0)} has {width} counts; the spec's pipeline needs {spec.stages * spec.chunks} "
                       f"({need})")
    if width % spec.chunks:
        raise BadInput(f"{sf.where(0)} has {width} counts, not a multiple of pipeline.interleave={spec.chunks}")
    schedule_size(args, spec, width // spec.chunks, spec.chunks, order=False)  # slowest stage: no order needed
    try:
        splits = spec.model.check_splits(splits, spec.chunks, sf.where)  # int64 (whole-number floats too)
    except ValueError as exc:  # row errors name the file already; shape and dtype errors do not
        raise BadInput(str(exc) if str(exc).startswith(sf.path) else f"{sf.path}: {exc}") from None
    backend = get_backend(args.backend)
    # each distinct split is scored once (blocks do not share solved problems: a file repeating a
    # split would otherwise solve it again in every block)
    distinct, inverse = distinct_rows(splits)
    scores = np.empty(len(distinct))
    rankings = []
    limit, blocks = max_cells(), -(-len(distinct) // RANK_BLOCK)
    with counting() as spent:  # the work limit is on the whole file, not on each block
        for lo in range(0, len(distinct), RANK_BLOCK):
            try:
                with work_limit(max(limit - spent[0], 1)):  # a block over what is left is refused before it runs
                    r = spec.model.rank(distinct[lo:lo + RANK_BLOCK], spec.bucket, backend, spec.in_flight,
                                        spec.chunks, _max_bytes(args))
            except WorkTooLarge as exc:
                if lo == 0:
                    raise
                raise BadInput(f"{sf.path}: the splits need more than the work limit of {limit:.3g} DP cells: "
                               f"{spent[0]:.3g} for the first {lo:,} distinct splits, and the next block needs "
                               f"{exc.cells:.3g}; use a larger --bucket, fewer splits, or raise --max-work") from None
            scores[lo:lo + RANK_BLOCK] = r.slowest
            rankings.append(r)
            estimate = spent[0] * len(distinct) / RANK_BLOCK
            if lo == 0 and blocks > 1 and estimate > limit:  # said before the other blocks run
                raise BadInput(f"{sf.path}: {len(distinct):,} distinct splits need about {estimate:.3g} DP cells "
                               f"(the first {RANK_BLOCK:,} took {spent[0]:.3g}), over the work limit of {limit:.3g}; "
                               "use a larger --bucket, fewer splits, or raise --max-work")
    slowest = scores[inverse]
    best_i, best_choice = -1, None
    if np.isfinite(slowest).any():  # the first row of the least score, as one batch would order them
        best_i = int(np.argmin(slowest))
        block, j = divmod(int(inverse[best_i]), RANK_BLOCK)
        best_choice = rankings[block].choice(j)
    if args.out:
        write_scores(args.out, splits, slowest)
    feasible = int(np.isfinite(slowest).sum())
    payload = {**_header("rank", spec, backend.name), "rows": len(splits), "feasible": feasible,
               "out": args.out, "best": None}
    if args.plot:
        plot_scores(slowest, args.plot, f"slowest-stage time of candidate splits of {spec.name}",
                    None if best_i < 0 else float(slowest[best_i]), spec.model.costs is not None)
    if best_i < 0:
        _emit(args, payload, f"none of the {len(splits)} splits is feasible")
        return EXIT_INFEASIBLE
    record = split_record(spec.model, splits[best_i].tolist(), best_choice, "slowest", slowest[best_i],
                          spec.in_flight, spec.chunks)
    payload["best"] = {"row": best_i, **record}
    text = (f"{len(splits)} splits scored, {feasible} feasible" + (f"; scores written to {args.out}" if args.out else "")
            + "\n\n" + format_split(record, f"best: row {best_i}" + (f" ({sf.label(best_i)})" if sf.lines else "")))
    _emit(args, payload, text)
    return EXIT_OK


def _rank_settings(args: argparse.Namespace) -> int:
    """Score a framework's settings on the model: its split with the recompute it sets."""
    return rank_settings(args, lambda a, **extra: _spec(a, a.spec, **extra), lambda p, t: _emit(args, p, t),
                         lambda spec: _header("rank", spec, "numpy"))


def _spec_for_counts(args: argparse.Namespace, width: int, interleave: int | None, where: str) -> Spec:
    """The spec for splits of ``width`` counts (``where`` names them): without ``--stages``, built
    for the stage count they give, so the file's ``pipeline.stages`` gives way (a cost model depends
    on it: a tied embedding's second copy, the MTP embedding, the sends) and ``--micro-batches`` is
    checked against the counts' stages; ``--stages`` must agree with the counts."""
    stages, chunks = pipeline_shape(args.spec or default_example())
    chunks = interleave or chunks
    given = getattr(args, "stages", None)
    if given is not None and width != given * chunks:
        raise BadInput(f"--stages {given} contradicts {where}, which gives {width} counts"
                       + (f" ({chunks} chunks per stage)" if chunks > 1 else "") + "; give one of them")
    if given is not None or width % chunks or stages == width // chunks:
        return _spec(args, args.spec)
    args.stages = width // chunks
    try:
        return _spec(args, args.spec)
    except ValueError as exc:  # the model for the counts' stage count is not one this spec builds
        if stages is None:
            raise
        need = f"{stages} stages" + (f" x {chunks} chunks" if chunks > 1 else "")
        raise BadInput(f"{where} has {width} counts; the spec's pipeline needs {stages * chunks} ({need}), and "
                       f"rebuilt for {plural(width // chunks, 'stage')} it fails: {exc}") from None
