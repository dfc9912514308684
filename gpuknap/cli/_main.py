"""The ``gpuknap`` command line: its parser, and every failure mapped to one line and an exit code.

Exit codes: 0 success, 1 nothing feasible (said in words), 2 bad input or a
refused job (one line on stderr naming the file or flag and the field, no
traceback), 3 an internal error (a bug: one line, please report it).
Every flag is checked, and every output path tried, before any work starts.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from typing import Sequence

from .. import formats
from ..costs import DEFAULT_DEVICE, DEFAULT_EFFICIENCY, DEVICES, DISPATCHERS, LEAST_EFFICIENCY
from ..formats._fields import RECOMPUTE
from .._version import __version__
from ..engine import BACKENDS, MAX_TOP, command_budget, reporting, single_stage_memory, work_limit
from ..formats.splitfiles import PLOT_SUFFIXES, check_output
from ..search import MAX_IN_FLIGHT, MAX_LAYERS, SCORES
from ._commands import MAX_POINTS, cmd_best, cmd_rank
from ._split import cmd_curve, cmd_timeline
from ._flags import Parser, cells, device_field, fraction, guarded, integer, number, size
from ._plots import require_matplotlib
from ._progress import Bar, hold_notes, release_notes
from ._sweep import add_sweep


def build_parser() -> argparse.ArgumentParser:
    base = Parser(add_help=False)  # every command's flags; `common` adds one configuration's
    base.add_argument("--backend", default="auto", choices=list(BACKENDS),
                      help="array backend (default auto: CuPy when a GPU is present, else the fused CPU pass "
                           "when Numba imports, else NumPy; env GPUKNAP_BACKEND)")
    base.add_argument("--bucket", type=size("--bucket"),
                      help="memory bucket, e.g. '1 MiB' (default: the spec's, else 1 MiB)")
    base.add_argument("--capacity", type=size("--capacity"),
                      help="device memory, e.g. '80 GiB' (default: the spec's, else the device's; SAPP-PPB profiles "
                           "need this or --device)")
    base.add_argument("--reserved", type=size("--reserved", zero=True),
                      help="memory kept for the framework on every device (default for analytic models: "
                           "2 GiB + 5%% of the capacity; docs/costs.md)")
    base.add_argument("--device", metavar="NAME",
                      help=f"device preset ({', '.join(DEVICES)}; default {DEFAULT_DEVICE}): peak FLOP/s, memory, links")
    base.add_argument("--gpus-per-node", type=integer("--gpus-per-node", 1, 4096), metavar="N",
                      help="devices per node (default: the preset's, 8)")
    base.add_argument("--efficiency", type=fraction("--efficiency", LEAST_EFFICIENCY), metavar="E",
                      help=f"share of peak FLOP/s the matrix math reaches, {LEAST_EFFICIENCY:g} to 1 "
                           f"(default {DEFAULT_EFFICIENCY:g})")
    base.add_argument("--device-field", type=device_field, action="append", metavar="FIELD=VALUE",
                      help="override one number of the device, e.g. inter_bandwidth=25e9 (repeatable)")
    base.add_argument("--max-memory", type=size("--max-memory"), metavar="SIZE",
                      help="working memory the DP may use, e.g. '8 GiB' (default: a quarter of free RAM, "
                           "at most 2 GiB; half the free GPU memory)")
    base.add_argument("--max-work", type=cells, metavar="CELLS",
                      help="refuse DP work estimated above this many cells, each call and a command's calls "
                           "together (default 1e10, about a minute of NumPy)")
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
                                      "--etp": ("expert_tensor_parallel", 4096,
                                                "expert-tensor-parallel size (default: the TP size, as Megatron)"),
                                      "--cp": ("context_parallel", 4096, "context-parallel size"),
                                      "--dp": ("data_parallel", 10**6, "data-parallel size (shards the optimizer)"),
                                      }.items():
        common.add_argument(flag, type=integer(flag, 1, high), metavar="N",
                            help=f"{what}, for an analytic model (config.json or a transformer section)")
    common.add_argument("--tp-comm-overlap", action="store_true", default=None,
                        help="overlap TP communication with the GEMMs, as Megatron's --tp-comm-overlap (needs "
                             "sequence parallelism)")
    common.add_argument("--dispatcher", choices=DISPATCHERS,
                        help="how MoE layers send tokens to their experts: alltoall (default; Megatron's "
                             "--moe-token-dispatcher-type alltoall) or flex (DeepEP, HybridEP: once per rank, and "
                             "once per node across nodes; needs --etp 1)")
    common.add_argument("--recompute", choices=RECOMPUTE,
                        help="run every decoder layer with this option (predict a run as it was run); moe_act "
                             "and selective+moe_act are Megatron's --recompute-modules moe_act (and core_attn): "
                             "MoE layers recompute the experts' activation function")
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
                   help="score a framework's settings instead (a MindFormers YAML/JSON or a Megatron arguments file)")
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
    t.add_argument("--p2p", type=number(0, "a time", high=1e12), default=None,
                   help="time to pass a micro-batch between stages (default: the cost model's, else 0)")
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
    hold_notes()  # written after the command, unless it ends in an error (one line)
    done = False
    with ExitStack() as stack:
        stack.enter_context(reporting(bar))
        if args.max_work is not None:
            stack.enter_context(work_limit(args.max_work))
        # one limit for the command's DP calls together (a sweep has --max-time; rank --splits its own total)
        if args.command != "sweep" and not (args.command == "rank" and getattr(args, "splits", None)):
            stack.enter_context(command_budget())
        if getattr(args, "max_memory", None) is not None:  # single-stage solves too (curve, timeline, plans)
            stack.enter_context(single_stage_memory(int(args.max_memory)))
        try:
            code = args.func(args)
            done = True
            return code
        except ValueError as exc:  # a suggested bucket: say where the one in use was set
            field = getattr(args, "bucket_field", "")
            if field and "(--bucket)" in str(exc):
                raise ValueError(str(exc).replace("(--bucket)", f"(--bucket, or {field})", 1)) from None
            raise
        finally:
            bar.close()
            release_notes(done)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    parser.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a one-line usage error
        return int(exc.code or 0)
    return guarded(lambda: _run(args))


if __name__ == "__main__":
    sys.exit(main())
