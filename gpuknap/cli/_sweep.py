"""``gpuknap sweep``: the command line of :func:`gpuknap.sweep` (the rest of the CLI is in ``cli``)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._version import __version__
from ..engine import MAX_TOP
from ..sweep import GRID_KEYS, SCORES, sweep
from ._flags import EXIT_OK, integer
from ._plots import plot_sweep
from ._report import JSON_VERSION

EXIT_INFEASIBLE = 1
#: Grid flags: flag -> grid key.
GRID_FLAGS = {"--stages": "stages", "--tp": "tensor_parallel", "--micro-batch-size": "micro_batch_size",
              "--interleave": "interleave"}


def integers(flag: str) -> Any:
    """An argparse type: a comma-separated list of integers >= 1 (e.g. ``4,8,16``)."""
    one = integer(flag, 1, 10**6)

    def parse(text: str) -> list[int]:
        parts = [p.strip() for p in text.split(",")]
        if not parts or any(not p for p in parts):
            raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 4,8,16, got {text!r}")
        return [one(p) for p in parts]

    return parse


def add_sweep(sub: Any, base: Any) -> None:
    """Register ``gpuknap sweep`` under the sub-command parsers."""
    w = sub.add_parser("sweep", parents=[base], help="score a grid of parallel configurations in one batch")
    w.add_argument("spec", help="spec with a 'transformer' section, or a Hugging Face config.json")
    w.add_argument("--gpus", type=integer("--gpus", 1, 10**7), required=True, help="GPUs in the cluster")
    w.add_argument("--global-batch", type=integer("--global-batch", 1, 10**9), required=True,
                   help="samples per training step, over all data-parallel replicas")
    for flag, key in GRID_FLAGS.items():
        w.add_argument(flag, type=integers(flag), dest=key, metavar="N,N,...", default=[1],
                       help=f"{key.replace('_', ' ')} values to try (default 1)")
    w.add_argument("--score", choices=SCORES, default="1f1b", help="how each configuration's split is chosen")
    w.add_argument("--top", type=integer("--top", 1, MAX_TOP), default=1, help="splits kept per configuration")
    w.add_argument("--seq", type=integer("--seq", 1, 10**7), metavar="N", help="sequence length, for a config.json")
    for flag, what in (("--ep", "expert-parallel size"), ("--etp", "expert-tensor-parallel size (default: TP)"),
                       ("--cp", "context-parallel size")):
        w.add_argument(flag, type=integer(flag, 1, 4096), metavar="N", help=f"{what}, the same for every configuration")
    w.add_argument("--scheduler", metavar="ADDRESS",
                   help="shard the configurations over a Dask cluster, e.g. tcp://host:8786 (needs gpuknap[cluster])")
    w.set_defaults(func=cmd_sweep)


def _label(config: dict) -> str:
    return (f"P={config['stages']} TP={config['tensor_parallel']} mbs={config['micro_batch_size']} "
            f"M={config['micro_batches']} DP={config['data_parallel']}"
            + (f" v={config['interleave']}" if config["interleave"] > 1 else ""))


def _closest(rows: list) -> str:
    """The infeasible configuration that comes nearest, and what it lacks."""
    known = [r for r in rows if r.get("coverable_layers") is not None]
    if not known:
        return ""
    r = max(known, key=lambda r: r["coverable_layers"])
    return (f"; the closest, {_label(r['config'])}, holds at most {r['coverable_layers']:,} of its "
            f"{r['layers']:,} layers even with the lightest options")


def table(result: Any, limit: int = 30) -> str:
    """The human table: configurations by throughput, then what was skipped."""
    lines = [f"{'#':>3} {'configuration':<40} {'iteration':>11} {'samples/s':>10} {'tokens/s':>11} {'MFU':>6} "
             f"{'TFLOP/s':>8}  counts"]
    for i, r in enumerate(result.rows[:limit], 1):
        if r["feasible"]:
            tokens = r["throughput"]["tokens_per_second"]
            mark = "" if r["exact"] else " (local search)"
            mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
            tflops = "-" if r.get("tflops_per_gpu") is None else f"{r['tflops_per_gpu']:.0f}"
            when = (f"{r['iteration_time_s']:.4g} s" if r.get("mfu") is not None else f"{r['iteration_time']:.6g}")
            lines.append(f"{i:>3} {_label(r['config']):<40} {when:>11} "
                         f"{r['throughput']['samples_per_second']:>10.4g} "
                         f"{'-' if tokens is None else format(tokens, '11.4g'):>11} {mfu:>6} {tflops:>8}  "
                         f"{r['counts']}{mark}")
        else:
            lines.append(f"{i:>3} {_label(r['config']):<40} {'infeasible':>11}")
    if len(result.rows) > limit:
        lines.append(f"... {len(result.rows) - limit} more rows (--json for all)")
    if result.skipped:
        lines.append(f"{len(result.skipped)} configurations skipped:")
        reasons: dict[str, int] = {}
        for s in result.skipped:
            reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
        lines += [f"  {n} x {why}" for why, n in sorted(reasons.items(), key=lambda e: -e[1])[:8]]
    return "\n".join(lines)


def cmd_sweep(args: argparse.Namespace) -> int:
    grid = {key: getattr(args, key) for key in GRID_KEYS}
    result = sweep(args.spec, grid, gpus=args.gpus, global_batch=args.global_batch, score=args.score, top=args.top,
                   backend=args.backend, scheduler=args.scheduler, capacity=args.capacity, reserved=args.reserved,
                   seq=args.seq, bucket=args.bucket, max_bytes=args.max_memory, device=args.device,
                   gpus_per_node=args.gpus_per_node, efficiency=args.efficiency,
                   device_fields=dict(args.device_field) if args.device_field else None, expert_parallel=args.ep,
                   expert_tensor_parallel=args.etp, context_parallel=args.cp)
    feasible = result.best is not None
    if args.plot:
        plot_sweep(result.rows, args.plot, f"{args.spec}: {args.gpus} GPUs, global batch {args.global_batch}",
                   result.skipped)
    if args.json:
        payload = {"gpuknap_json": JSON_VERSION, "version": __version__, "command": "sweep", "source": args.spec,
                   "gpus": args.gpus, "global_batch": args.global_batch, "score": args.score, "top": args.top,
                   "grid": grid, "best": result.best, "rows": result.rows, "skipped": result.skipped}
        json.dump(payload, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(table(result))
    if not result.rows:  # every configuration of the grid was refused: bad input, not an infeasible model
        reasons = "; ".join(sorted({s["reason"] for s in result.skipped}))
        raise ValueError(f"no configuration of the grid is valid: {reasons}"[:600])
    if not feasible:
        print(f"no configuration fits the device memory{_closest(result.rows)}", file=sys.stderr)
        return EXIT_INFEASIBLE
    return EXIT_OK
