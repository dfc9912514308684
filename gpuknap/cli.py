"""The ``gpuknap`` command line: ``best``, ``rank`` and ``curve``.

Exit codes: 0 success, 1 nothing feasible (said in words), 2 bad input (one
line on stderr, no traceback).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from importlib import resources
from typing import Sequence

import numpy as np

from . import __version__
from .backend import BackendUnavailable, get_backend
from .options import FrontTable
from .report import JSON_VERSION, format_split, plot_curve, plot_splits, split_record
from .search import SCORES, best_splits
from .spec import Spec, load_spec
from .stage import least_times

EXIT_OK, EXIT_INFEASIBLE, EXIT_BAD_INPUT = 0, 1, 2
#: Rows of a splits file scored per block (bounds memory; one progress step each).
RANK_BLOCK = 250_000


class BadInput(ValueError):
    """Raised for command-line input that cannot be used."""


def default_example() -> str:
    """The shipped example run by ``gpuknap best`` without a SPEC."""
    return str(resources.files("gpuknap") / "examples" / "demo.json")


class Progress:
    """A one-line progress bar on stderr, shown only on a terminal and without --quiet."""

    def __init__(self, total: int, label: str, quiet: bool):
        self.total, self.label, self.done = total, label, 0
        self.on = not quiet and sys.stderr.isatty()
        self.start = time.perf_counter()

    def step(self, n: int = 1) -> None:
        self.done += n
        if self.on:
            filled = int(30 * self.done / max(self.total, 1))
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} "
                             f"{time.perf_counter() - self.start:.1f}s")
            sys.stderr.flush()

    def close(self) -> None:
        if self.on:
            sys.stderr.write("\n")


def _spec(args: argparse.Namespace, path: str | None) -> Spec:
    return load_spec(path or default_example(), capacity=args.capacity, micro_batches=args.micro_batches,
                     stages=getattr(args, "stages", None), bucket=args.bucket)


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


def cmd_best(args: argparse.Namespace) -> int:
    spec = _spec(args, args.spec)
    if spec.stages is None:
        raise BadInput("the number of stages is missing: give --stages or pipeline.stages in the spec")
    if spec.chunks > 1:
        raise BadInput("best searches plain 1F1B pipelines; use 'rank' for interleaved (interleave > 1) splits")
    backend = get_backend(args.backend)
    bar = Progress(1, "searching", args.quiet)
    found = best_splits(spec.model, spec.stages, args.top, args.score, spec.bucket, backend, spec.in_flight)
    bar.step()
    bar.close()
    records = [split_record(spec.model, c, ch, args.score, v, spec.in_flight) for c, v, ch in found]
    payload = {**_header("best", spec, backend.name), "stages": spec.stages, "score": args.score,
               "top": args.top, "results": records}
    if not found:
        _emit(args, payload, f"no feasible split of {spec.name} into {spec.stages} stages fits the device memory")
        return EXIT_INFEASIBLE
    text = "\n\n".join(format_split(r, f"#{i + 1} of {spec.name}, {spec.stages} stages") for i, r in enumerate(records))
    if args.plot:
        plot_splits(records, args.plot)
    _emit(args, payload, text)
    return EXIT_OK


def read_splits(path: str) -> np.ndarray:
    """Layer counts per row from a CSV (commas or whitespace; '#' comments) or a .npy file."""
    try:
        if path.endswith(".npy"):
            arr = np.load(path, allow_pickle=False)
        else:
            rows = []
            with open(path, newline="") as fh:
                for n, line in enumerate(fh, 1):
                    line = line.split("#", 1)[0].strip()
                    if not line:
                        continue
                    try:
                        rows.append([int(x) for x in line.replace(",", " ").split()])
                    except ValueError:
                        raise BadInput(f"{path}: line {n}: expected integer layer counts, got {line!r}") from None
            if not rows:
                raise BadInput(f"{path}: no splits in the file")
            if len({len(r) for r in rows}) > 1:
                raise BadInput(f"{path}: every row must have the same number of stages")
            arr = np.array(rows, dtype=np.int64)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    if arr.ndim == 1:
        arr = arr[None, :]
    return arr


def cmd_rank(args: argparse.Namespace) -> int:
    spec = _spec(args, args.spec)
    splits = read_splits(args.splits)
    spec.model.check_splits(splits, spec.chunks)
    backend = get_backend(args.backend)
    blocks = range(0, len(splits), RANK_BLOCK)
    bar = Progress(len(blocks), "ranking", args.quiet)
    slowest = np.empty(len(splits))
    best_i, best_choice = -1, None
    for lo in blocks:
        r = spec.model.rank(splits[lo:lo + RANK_BLOCK], spec.bucket, backend, spec.in_flight, spec.chunks)
        slowest[lo:lo + RANK_BLOCK] = r.slowest
        j = int(r.order[0])
        if np.isfinite(r.slowest[j]) and (best_i < 0 or r.slowest[j] < slowest[best_i]):
            best_i, best_choice = lo + j, r.choice(j)
        bar.step()
    bar.close()
    if args.out:
        write_scores(args.out, splits, slowest)
    feasible = int(np.isfinite(slowest).sum())
    payload = {**_header("rank", spec, backend.name), "rows": len(splits), "feasible": feasible,
               "out": args.out, "best": None}
    if best_i < 0:
        _emit(args, payload, f"none of the {len(splits)} splits is feasible")
        return EXIT_INFEASIBLE
    record = split_record(spec.model, splits[best_i].tolist(), best_choice, "slowest", slowest[best_i],
                          spec.in_flight, spec.chunks)
    payload["best"] = {"row": best_i, **record}
    text = (f"{len(splits)} splits scored, {feasible} feasible" + (f"; scores written to {args.out}" if args.out else "")
            + "\n\n" + format_split(record, f"best: row {best_i}"))
    _emit(args, payload, text)
    return EXIT_OK


def write_scores(path: str, splits: np.ndarray, slowest: np.ndarray) -> None:
    """All scores: ``.npy`` (float64, inf where infeasible) or CSV (row, slowest, counts)."""
    try:
        if path.endswith(".npy"):
            np.save(path, slowest)
            return
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["row", "slowest", "counts"])
            for i, (s, row) in enumerate(zip(slowest.tolist(), splits.tolist())):
                w.writerow([i, "inf" if s == float("inf") else repr(s), " ".join(map(str, row))])
    except OSError as exc:
        raise BadInput(f"{path}: cannot write ({exc.strerror or exc})") from None


def cmd_curve(args: argparse.Namespace) -> int:
    spec = _spec(args, args.spec)
    backend = get_backend(args.backend)
    if args.counts:
        try:
            counts = [int(x) for x in args.counts.replace(",", " ").split()]
        except ValueError:
            raise BadInput(f"--counts: expected comma-separated integers, got {args.counts!r}") from None
    else:
        if spec.stages is None:
            raise BadInput("give --counts, or --stages to take the best split's stage")
        found = best_splits(spec.model, spec.stages, 1, "slowest", spec.bucket, backend, spec.in_flight)
        if not found:
            print(f"no feasible split of {spec.name} into {spec.stages} stages", file=sys.stderr)
            return EXIT_INFEASIBLE
        counts = list(found[0][0])
    stages = spec.model.stages(counts, spec.in_flight, spec.chunks)
    if not 0 <= args.stage < len(stages):
        raise BadInput(f"--stage must be in 0..{len(stages) - 1}, got {args.stage}")
    stage = stages[args.stage]
    table = FrontTable(spec.model.fronts, spec.bucket)
    useful = [(g.count, table.get(g.kind, g.in_flight)) for g in stage.groups]
    lightest = sum(n * float(f.memories[0]) for n, f in useful)
    fastest = sum(n * float(f.memories[-1]) for n, f in useful)
    within = least_times(stage.groups, spec.model.fronts, max(stage.budget, fastest), spec.bucket)
    budgets = sorted(set(np.linspace(lightest, fastest, max(args.points, 2)).tolist()) | {max(stage.budget, 0.0)})
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


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", default="auto", choices=["auto", "numpy", "cupy"],
                        help="array backend (default auto: CuPy when a GPU is present; env GPUKNAP_BACKEND)")
    common.add_argument("--bucket", help="memory bucket, e.g. '1 MiB' (default: the spec's, else 1 MiB)")
    common.add_argument("--capacity", help="device memory, e.g. '80 GiB' (overrides the spec; needed for SAPP-PPB)")
    common.add_argument("--micro-batches", type=int, help="micro-batches per iteration (overrides the spec)")
    common.add_argument("--json", action="store_true", help="print the stable JSON (docs/json.md) instead of tables")
    common.add_argument("--plot", metavar="FILE", help="save a plot (needs matplotlib)")
    common.add_argument("--quiet", action="store_true", help="no progress bar")
    p = argparse.ArgumentParser(prog="gpuknap", description="Exact recompute-option knapsacks for pipeline splits.")
    p.add_argument("--version", action="version", version=f"gpuknap {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("best", parents=[common], help="the best splits of a model")
    b.add_argument("spec", nargs="?", help="spec (YAML/JSON) or SAPP-PPB profile; default: a shipped example")
    b.add_argument("--stages", type=int, help="pipeline stages (overrides the spec)")
    b.add_argument("--top", type=int, default=1, help="how many splits (default 1)")
    b.add_argument("--score", choices=SCORES, default="slowest", help="slowest stage or 1F1B iteration time")
    b.set_defaults(func=cmd_best)
    r = sub.add_parser("rank", parents=[common], help="score every split in a file")
    r.add_argument("spec")
    r.add_argument("--splits", required=True, help="CSV or .npy of layer counts, one split per row")
    r.add_argument("--out", help="write every score (.npy or CSV)")
    r.set_defaults(func=cmd_rank)
    c = sub.add_parser("curve", parents=[common], help="a stage's least time against its memory budget")
    c.add_argument("spec")
    c.add_argument("--stage", type=int, required=True, help="stage index")
    c.add_argument("--counts", help="the split, e.g. '4,5,6,...' (default: the best split)")
    c.add_argument("--stages", type=int, help="stages of the best split (with no --counts)")
    c.add_argument("--points", type=int, default=21, help="budgets to evaluate (default 21)")
    c.set_defaults(func=cmd_curve)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "top", 1) < 1:
        parser.exit(EXIT_BAD_INPUT, "gpuknap: error: --top must be >= 1\n")
    try:
        return args.func(args)
    except (ValueError, BackendUnavailable) as exc:
        print(f"gpuknap: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:  # e.g. a --plot or --out path that cannot be written
        print(f"gpuknap: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
