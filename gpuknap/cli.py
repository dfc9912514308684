"""The ``gpuknap`` command line: ``best``, ``rank`` and ``curve``.

Exit codes: 0 success, 1 nothing feasible (said in words), 2 bad input or a
refused job (one line on stderr naming the file or flag and the field, no
traceback), 3 an internal error (a bug: one line, please report it).
Every flag is checked, and every output path tried, before any work starts.
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from importlib import resources
from typing import Sequence

import numpy as np

from . import __version__, formats, timeline
from .flags import EXIT_OK, Parser, cells, counts_list, guarded, integer, number, size
from .formats import framework
from .backend import get_backend
from .limits import MAX_TOP, work_limit
from .model import MAX_IN_FLIGHT, MAX_LAYERS
from .options import FrontTable
from .progress import Bar, reporting
from .report import (JSON_VERSION, format_split, plot_best, plot_curve, plot_scores, plot_timeline,
                     require_matplotlib, split_record)
from .search import SCORES, best_splits, coverage
from .spec import Spec, load_spec
from .cli_sweep import add_sweep
from .splitfiles import PLOT_SUFFIXES, check_output, read_splits, write_scores
from .stage import least_times

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


def _spec(args: argparse.Namespace, path: str | None) -> Spec:
    return load_spec(path or default_example(), capacity=args.capacity, micro_batches=args.micro_batches,
                     stages=getattr(args, "stages", None), bucket=args.bucket, seq=args.seq,
                     micro_batch=args.micro_batch_size, tensor_parallel=args.tp, expert_parallel=args.ep,
                     data_parallel=args.dp)


def _max_bytes(args: argparse.Namespace) -> int | None:
    return None if args.max_memory is None else int(args.max_memory)


def _emit(args: argparse.Namespace, payload: dict, text: str) -> None:
    if args.json:
        json.dump(payload, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(text)


def _header(command: str, spec: Spec, backend: str) -> dict:
    return {"gpuknap_json": JSON_VERSION, "version": __version__, "command": command, "source": spec.source,
            "name": spec.name, "layers": spec.model.layers, "micro_batches": spec.model.micro_batches,
            "bucket_bytes": spec.bucket, "backend": backend}


def _stages(args: argparse.Namespace, spec: Spec) -> int:
    if spec.stages is None:
        raise BadInput("--stages: the number of stages is missing (give --stages or pipeline.stages in the spec)")
    if spec.stages > spec.model.layers:
        where = "--stages" if args.stages is not None else f"{spec.source}: pipeline.stages"
        raise BadInput(f"{where}: {spec.stages} stages for a model of {spec.model.layers} layers; "
                       "every stage needs at least one layer")
    return spec.stages


def cmd_best(args: argparse.Namespace) -> int:
    spec = _spec(args, args.spec)
    stages = _stages(args, spec)
    chunks = args.interleave or spec.chunks
    in_flight = spec.in_flight if chunks == spec.chunks else None  # another --interleave: the schedule's table
    if chunks > 1 and args.emit in formats.EMITTERS:
        raise BadInput(f"--emit {args.emit}: framework settings are written for plain pipelines; "
                       "drop --interleave (or use --emit json)")
    backend = get_backend(args.backend)
    model = spec.model
    if args.emit in formats.EMITTERS:  # search among the plans the framework can run
        try:
            model = formats.restrict(model, args.emit)
        except ValueError as exc:
            raise BadInput(f"--emit {args.emit}: {spec.source}: {exc}") from None
    found = best_splits(model, stages, args.top, args.score, spec.bucket, backend, in_flight, _max_bytes(args),
                        bound=args.bound, exclusive=formats.EXCLUSIVE.get(args.emit, ()), interleave=chunks)
    exact = getattr(found, "exact", True)
    records = [split_record(spec.model, f[0], f[2], args.score, f[1], in_flight, chunks,
                            lower_bound=f[3] if args.bound else None, bucket=spec.bucket) for f in found]
    for r, simulated in zip(records, timeline.simulated_times(spec.model, found, in_flight, chunks)):
        r["iteration_time_simulated"] = simulated
    payload = {**_header("best", spec, backend.name), "stages": stages, "interleave": chunks, "score": args.score,
               "top": args.top, "exact": exact, "results": records}
    if not exact:
        payload["optimum_lower_bound"] = found.lower_bound
    shape = f"{stages} stages" + (f" x {chunks} chunks" if chunks > 1 else "")
    if not found:
        held = coverage(spec.model, stages, spec.bucket, spec.in_flight) if chunks == 1 else spec.model.layers
        payload["coverable_layers"] = held
        why = ("" if held >= spec.model.layers else
               ": not even its first layer fits on a device" if held == 0 else
               f": even with their lightest options the {stages} stages hold at most {held:,} of its "
               f"{spec.model.layers:,} layers")
        _emit(args, payload, f"no feasible split of {spec.name} into {shape} fits the device memory{why}"
              + ("" if exact else " (among the splits a local search tried)"))
        return EXIT_INFEASIBLE
    text = "\n\n".join(format_split(r, f"#{i + 1} of {spec.name}, {shape}") for i, r in enumerate(records))
    if not exact:
        text += (f"\n\nlocal search over interleaved splits (the layers are not one kind between the first and "
                 f"the last): not proven optimal; the optimum is at least {found.lower_bound:.6g}")
    if args.emit in formats.EMITTERS:  # the best split's settings, in place of the tables
        try:
            text = formats.emit(args.emit, model, found[0][0], found[0][2], spec.name, found[0][1], spec.in_flight)
        except ValueError as exc:
            raise BadInput(f"--emit {args.emit}: {spec.source}: {exc}") from None
    if args.plot:
        try:
            solved = timeline.of_split(spec.model, found[0][0], spec.bucket, in_flight, chunks)
        except ValueError:  # too many operations to draw: the stage chart alone
            solved = None
        plot_best(records, solved, args.plot, f"{spec.name}, {shape}: best split {list(found[0][0])}")
    _emit(args, payload, text)
    return EXIT_OK


def cmd_rank(args: argparse.Namespace) -> int:
    spec = _spec(args, args.spec)
    if (args.splits is None) == (args.settings is None):
        raise BadInput("--splits or --from: give one (a file of splits, or a framework's settings to score)")
    if args.settings is not None:
        if args.out or args.plot:
            raise BadInput(f"{'--out' if args.out else '--plot'}: applies to --splits, not --from")
        return _rank_settings(args, spec)
    sf = read_splits(args.splits)
    splits = sf.counts
    width = splits.shape[1]
    if spec.stages is not None and width != spec.stages * spec.chunks:
        need = f"{spec.stages} stages" + (f" x {spec.chunks} chunks" if spec.chunks > 1 else "")
        raise BadInput(f"{sf.where(0)} has {width} counts; the spec's pipeline needs {spec.stages * spec.chunks} "
                       f"({need})")
    if width % spec.chunks:
        raise BadInput(f"{sf.where(0)} has {width} counts, not a multiple of pipeline.interleave={spec.chunks}")
    try:
        spec.model.check_splits(splits, spec.chunks, sf.where)
    except ValueError as exc:  # row errors name the file already; shape and dtype errors do not
        raise BadInput(str(exc) if str(exc).startswith(sf.path) else f"{sf.path}: {exc}") from None
    backend = get_backend(args.backend)
    slowest = np.empty(len(splits))
    best_i, best_choice = -1, None
    for lo in range(0, len(splits), RANK_BLOCK):
        r = spec.model.rank(splits[lo:lo + RANK_BLOCK], spec.bucket, backend, spec.in_flight, spec.chunks,
                            _max_bytes(args))
        slowest[lo:lo + RANK_BLOCK] = r.slowest
        j = int(r.order[0])
        if np.isfinite(r.slowest[j]) and (best_i < 0 or r.slowest[j] < slowest[best_i]):
            best_i, best_choice = lo + j, r.choice(j)
    if args.out:
        write_scores(args.out, splits, slowest)
    feasible = int(np.isfinite(slowest).sum())
    payload = {**_header("rank", spec, backend.name), "rows": len(splits), "feasible": feasible,
               "out": args.out, "best": None}
    if args.plot:
        plot_scores(slowest, args.plot, f"slowest-stage time of candidate splits of {spec.name}",
                    None if best_i < 0 else float(slowest[best_i]))
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


def _rank_settings(args: argparse.Namespace, spec: Spec) -> int:
    """Score a framework's settings on the model: its split with the recompute it sets."""
    settings = formats.read_settings(args.settings)
    try:
        counts, names = settings.split(spec.model)
        ev = framework.evaluate(spec.model, counts, names, spec.in_flight, settings.chunks)
    except ValueError as exc:
        raise BadInput(f"{args.settings}: {exc}") from None
    record = split_record(spec.model, counts, ev.choice, "slowest", ev.slowest, spec.in_flight, settings.chunks)
    over = [s for s, (m, b) in enumerate(zip(ev.memory, ev.budgets)) if m > b]
    payload = {**_header("rank", spec, "numpy"), "from": args.settings, "feasible": not over,
               "over_budget_stages": over, "best": record}
    verdict = ("fit every stage's budget" if not over else
               f"EXCEED the memory budget of stage(s) {', '.join(map(str, over))}")
    _emit(args, payload, format_split(record, f"settings of {args.settings}") + f"\nthese settings {verdict}")
    return EXIT_OK if not over else EXIT_INFEASIBLE


def cmd_curve(args: argparse.Namespace) -> int:
    spec = _spec(args, args.spec)
    backend = get_backend(args.backend)
    if args.counts:
        counts = counts_list(args.counts)
        try:
            spec.model.check_counts(counts, spec.chunks)
        except ValueError as exc:
            raise BadInput(f"--counts: {exc}") from None
    else:
        stages = _stages(args, spec)
        found = best_splits(spec.model, stages, 1, "slowest", spec.bucket, backend, spec.in_flight, _max_bytes(args))
        if not found:
            print(f"no feasible split of {spec.name} into {stages} stages", file=sys.stderr)
            return EXIT_INFEASIBLE
        counts = list(found[0][0])
    p = len(counts) // spec.chunks
    if spec.stages is not None and args.counts and p != spec.stages and spec.in_flight is not None:
        raise BadInput(f"--counts: {p} stages, but the spec's in-flight table is for {spec.stages}")
    if not args.stage < p:
        raise BadInput(f"--stage: must be in 0..{p - 1} for a split of {p} stages, got {args.stage}")
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
        plot_curve(points, args.plot, f"stage {args.stage}", stage.budget)
    _emit(args, payload, "\n".join(lines))
    return EXIT_OK if any(p["time"] is not None for p in points) else EXIT_INFEASIBLE


def cmd_timeline(args: argparse.Namespace) -> int:
    spec = _spec(args, args.spec)
    chunks = args.interleave or spec.chunks
    if args.counts:
        counts = counts_list(args.counts)
    else:
        found = best_splits(spec.model, _stages(args, spec), 1, "1f1b", spec.bucket, get_backend(args.backend),
                            spec.in_flight if chunks == spec.chunks else None, _max_bytes(args), interleave=chunks)
        if not found:
            print(f"no feasible split of {spec.name}", file=sys.stderr)
            return EXIT_INFEASIBLE
        counts = list(found[0][0])
    try:
        spec.model.check_counts(counts, chunks)
    except ValueError as exc:
        raise BadInput(f"--counts: {exc}") from None
    solved = timeline.of_split(spec.model, counts, spec.bucket, spec.in_flight, chunks, args.p2p)
    if solved is None:
        _emit(args, {**_header("timeline", spec, "numpy"), "counts": counts, "timeline": None},
              f"split {counts} of {spec.name} does not fit the device memory")
        return EXIT_INFEASIBLE
    t, times, closed = solved
    if args.plot:
        plot_timeline(t, times, args.plot, f"{spec.name}: split {counts}")
    payload = {**_header("timeline", spec, "numpy"), "timeline": timeline.record(t, times, counts),
               "closed_form_1f1b": closed}
    _emit(args, payload, timeline.summary(t, f"{spec.name}, split {counts}", closed))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    base = Parser(add_help=False)  # every command's flags; `common` adds one configuration's
    base.add_argument("--backend", default="auto", choices=["auto", "numpy", "cupy"],
                      help="array backend (default auto: CuPy when a GPU is present; env GPUKNAP_BACKEND)")
    base.add_argument("--bucket", type=size("--bucket"),
                      help="memory bucket, e.g. '1 MiB' (default: the spec's, else 1 MiB)")
    base.add_argument("--capacity", type=size("--capacity"),
                      help="device memory, e.g. '80 GiB' (overrides the spec; needed for SAPP-PPB)")
    base.add_argument("--max-memory", type=size("--max-memory"), metavar="SIZE",
                      help="working memory the DP may use, e.g. '8 GiB' (default: a quarter of free RAM, "
                           "at most 2 GiB; half the free GPU memory)")
    base.add_argument("--max-work", type=cells, metavar="CELLS",
                      help="refuse jobs estimated above this many DP cells (default 1e10, about a minute of NumPy)")
    base.add_argument("--json", action="store_true", help="print the stable JSON (docs/json.md) instead of tables")
    base.add_argument("--plot", metavar="FILE", help="save a plot (.png, .pdf or .svg; needs matplotlib)")
    base.add_argument("--quiet", action="store_true", help="no progress bar")
    common = Parser(add_help=False, parents=[base])
    common.add_argument("--micro-batches", type=integer("--micro-batches", 1, MAX_IN_FLIGHT),
                        help="micro-batches per iteration (overrides the spec)")
    for flag, (name, high, what) in {"--seq": ("seq", 10**7, "sequence length"),
                                      "--micro-batch-size": ("micro_batch", 10**6, "samples per micro-batch"),
                                      "--tp": ("tensor_parallel", 4096, "tensor-parallel size"),
                                      "--ep": ("expert_parallel", 4096, "expert-parallel size"),
                                      "--dp": ("data_parallel", 10**6, "data-parallel size (shards the optimizer)"),
                                      }.items():
        common.add_argument(flag, type=integer(flag, 1, high), metavar="N",
                            help=f"{what}, for a Hugging Face config.json")
    p = Parser(prog="gpuknap", description="Exact recompute-option knapsacks for pipeline splits.")
    p.add_argument("--version", action="version", version=f"gpuknap {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    b = sub.add_parser("best", parents=[common], help="the best splits of a model")
    b.add_argument("spec", nargs="?",
                   help="spec (YAML/JSON), SAPP-PPB profile or Hugging Face config.json; default: a shipped example")
    b.add_argument("--stages", type=integer("--stages", 1, MAX_LAYERS), help="pipeline stages (overrides the spec)")
    b.add_argument("--top", type=integer("--top", 1, MAX_TOP), default=1, help=f"how many splits (default 1, at most {MAX_TOP})")
    b.add_argument("--score", choices=SCORES, default="slowest",
                   help="slowest stage, 1F1B closed form, or Megatron's 1F1B schedule simulated")
    b.add_argument("--interleave", type=integer("--interleave", 1, 64), metavar="V",
                   help="search interleaved splits of V chunks per stage (default: the spec's)")
    b.add_argument("--emit", choices=("json", *formats.EMITTERS),
                   help="print the best split as settings for a training framework (or the JSON)")
    b.add_argument("--bound", action="store_true",
                   help="also certify the bucketing: a lower bound on the score with exact bytes (one more search)")
    b.set_defaults(func=cmd_best)
    r = sub.add_parser("rank", parents=[common], help="score every split in a file")
    r.add_argument("spec")
    r.add_argument("--splits", help="CSV or .npy of layer counts, one split per row")
    r.add_argument("--from", dest="settings", metavar="FILE",
                   help="score a framework's settings instead (a MindFormers YAML)")
    r.add_argument("--out", help="write every score (.npy, else CSV)")
    r.set_defaults(func=cmd_rank)
    c = sub.add_parser("curve", parents=[common], help="a stage's least time against its memory budget")
    c.add_argument("spec")
    c.add_argument("--stage", type=integer("--stage", 0, MAX_LAYERS), required=True, help="stage index")
    c.add_argument("--counts", help="the split, e.g. '4,5,6,...' (default: the best split)")
    c.add_argument("--stages", type=integer("--stages", 1, MAX_LAYERS), help="stages of the best split (with no --counts)")
    c.add_argument("--points", type=integer("--points", 2, MAX_POINTS), default=21,
                   help=f"budgets to evaluate (default 21, 2 to {MAX_POINTS:,})")
    c.set_defaults(func=cmd_curve)
    t = sub.add_parser("timeline", parents=[common], help="the pipeline schedule of a split, simulated")
    t.add_argument("spec")
    t.add_argument("--counts", help="the split, chunk by chunk when interleaved (default: the best 1F1B split)")
    t.add_argument("--stages", type=integer("--stages", 1, MAX_LAYERS), help="stages of the best split (no --counts)")
    t.add_argument("--interleave", type=integer("--interleave", 1, 64), help="chunks per stage (default: the spec's)")
    t.add_argument("--p2p", type=number(0, "a time"), default=0.0, help="time to pass a micro-batch between stages (default 0)")
    t.set_defaults(func=cmd_timeline)
    add_sweep(sub, base)
    return p


def _check_outputs(args: argparse.Namespace) -> None:
    """Try every output path (and matplotlib) before any work, so no result is lost at the end."""
    if args.plot is not None:
        check_output(args.plot, "--plot", PLOT_SUFFIXES)
        require_matplotlib()
    if getattr(args, "out", None) is not None:
        check_output(args.out, "--out")


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "emit", None) == "json":
        args.json = True
    _check_outputs(args)
    bar = Bar(args.quiet)
    with ExitStack() as stack:
        stack.enter_context(reporting(bar))
        if args.max_work is not None:
            stack.enter_context(work_limit(args.max_work))
        try:
            return args.func(args)
        finally:
            bar.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a one-line usage error
        return int(exc.code or 0)
    return guarded(lambda: _run(args))


if __name__ == "__main__":
    sys.exit(main())
