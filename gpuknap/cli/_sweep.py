"""``gpuknap sweep``: the command line of :func:`gpuknap.sweep` (the rest of the CLI is in ``cli``)."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

from .._version import __version__
from ..costs import DISPATCHERS
from ..engine import MAX_TOP
from ..formats import hf, read_document
from ..sweep import DEFAULT_MAX_SECONDS, FRAMEWORKS, GRID_KEYS, MAX_TOP_ROWS, SCORES, sweep
from ._flags import EXIT_OK, integer, number, plural
from ._plots import plot_sweep
from ._progress import note
from ._report import JSON_VERSION, whole_bytes

EXIT_INFEASIBLE = 1
GIB = 2**30
#: Grid flags: flag -> grid key.
GRID_FLAGS = {"--stages": "stages", "--tp": "tensor_parallel", "--cp": "context_parallel", "--ep": "expert_parallel",
              "--etp": "expert_tensor_parallel", "--micro-batch-size": "micro_batch_size", "--interleave": "interleave"}
#: Rows shown by default (``--top``).
DEFAULT_TOP = 10


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
        default = "the TP size, as Megatron" if key == "expert_tensor_parallel" else "1"
        w.add_argument(flag, type=integers(flag), dest=key, metavar="N,N,...",
                       help=f"{key.replace('_', ' ')} values to try (default {default})")
    w.add_argument("--score", choices=SCORES, default="1f1b", help="how each configuration's split is chosen")
    w.add_argument("--top", type=integer("--top", 1, MAX_TOP_ROWS), default=None,
                   help=f"show the N best configurations, exactly as a full sweep ranks them, pruning the rest by a "
                        f"lower bound (default {DEFAULT_TOP})")
    w.add_argument("--all", action="store_true", help="search every configuration and show every row")
    w.add_argument("--top-splits", type=integer("--top-splits", 1, MAX_TOP), default=1,
                   help="splits kept per configuration (default 1)")
    w.add_argument("--seq", type=integer("--seq", 1, 10**7), metavar="N", help="sequence length, for a config.json")
    w.add_argument("--tp-comm-overlap", action="store_true",
                   help="overlap TP communication with the GEMMs, as Megatron's --tp-comm-overlap")
    w.add_argument("--framework", choices=FRAMEWORKS,
                   help="rank the plans this framework states (Megatron: one recompute setting for every layer; "
                        "MindFormers: one per stage), as their emitted settings run; each row's command then ends "
                        "with --emit (default: every layer on its own option)")
    w.add_argument("--dispatcher", choices=DISPATCHERS, default="alltoall",
                   help="how MoE layers send tokens to their experts: alltoall (default) or flex (DeepEP, HybridEP: "
                        "once per rank, and once per node across nodes; configurations with ETP > 1 are refused)")
    w.add_argument("--max-time", type=number(1, "a number of seconds"), default=DEFAULT_MAX_SECONDS,
                   metavar="SECONDS", help="refuse a sweep estimated to take longer: with --all on a pilot of 48 "
                                           "configurations drawn from groups of like ones, with --top after each "
                                           "round on those still within reach of its rows "
                                           f"(default {DEFAULT_MAX_SECONDS:g})")
    w.add_argument("--scheduler", metavar="ADDRESS",
                   help="shard the configurations over a Dask cluster, e.g. tcp://host:8786 (needs gpuknap[cluster])")
    w.set_defaults(func=cmd_sweep)


def _label(config: dict) -> str:
    extra = [f"{name}={config[key]}" for name, key in (("CP", "context_parallel"), ("EP", "expert_parallel"),
                                                       ("ETP", "expert_tensor_parallel"), ("v", "interleave"))
             if config.get(key) not in (None, 1)]
    if config.get("device"):
        extra.append(str(config["device"]))
    return " ".join([f"P={config['stages']} TP={config['tensor_parallel']}", *extra,
                     f"mbs={config['micro_batch_size']} M={config['micro_batches']} DP={config['data_parallel']}"])


def _closest(rows: list) -> str:
    """The infeasible configuration that comes nearest, and what it lacks."""
    known = [r for r in rows if r.get("coverable_layers") is not None]
    if not known:
        return ""
    r = max(known, key=lambda r: r["coverable_layers"])
    return (f"; the closest, {_label(r['config'])}, holds at most {r['coverable_layers']:,} of its "
            f"{r['layers']:,} layers even with the lightest options")


#: Configuration keys -> the flag of ``gpuknap best`` that sets them.
_BEST_FLAGS = {"stages": "--stages", "tensor_parallel": "--tp", "context_parallel": "--cp", "expert_parallel": "--ep",
               "expert_tensor_parallel": "--etp", "micro_batch_size": "--micro-batch-size",
               "micro_batches": "--micro-batches", "data_parallel": "--dp", "interleave": "--interleave",
               "device": "--device"}


def _bytes(value: float) -> str:
    return f"{int(value)}B" if float(value).is_integer() else f"{value!r}B"


def best_command(args: argparse.Namespace, config: dict) -> list[str]:
    """The ``gpuknap best`` arguments that plan one configuration of the sweep as its row does
    (same model, device, batch and score: the row's split, and with ``--emit`` its settings)."""
    out = ["gpuknap", "best", args.spec]
    if args.seq is not None:
        out += ["--seq", str(args.seq)]
    for key, flag in _BEST_FLAGS.items():
        value = config.get(key)
        if value is not None and not (key == "interleave" and value == 1):
            out += [flag, str(value)]
    if config.get("device") is None and args.device is not None:
        out += ["--device", args.device]
    for flag, value in (("--capacity", args.capacity), ("--reserved", args.reserved), ("--bucket", args.bucket)):
        if value is not None:
            out += [flag, _bytes(value)]
    if args.gpus_per_node is not None:
        out += ["--gpus-per-node", str(args.gpus_per_node)]
    if args.efficiency is not None:
        out += ["--efficiency", repr(args.efficiency)]
    for key, value in args.device_field or ():
        out += ["--device-field", f"{key}={_bytes(value) if key == 'memory' else repr(value)}"]
    if args.tp_comm_overlap:
        out.append("--tp-comm-overlap")
    if args.dispatcher != "alltoall":
        out += ["--dispatcher", args.dispatcher]
    out += ["--score", args.score]
    return out + (["--emit", args.framework] if args.framework else [])


def table(result: Any, limit: int = 30) -> str:
    """The human table: configurations by throughput (ties by the documented rule), what each
    row is made of, then how many were searched, pruned and skipped."""
    lines = [f"{'#':>3} {'configuration':<44} {'iteration':>10} {'tokens/s':>10} {'MFU':>6} {'TFLOP/s':>7} "
             f"{'idle':>5} {'headroom':>8}  counts"]
    for i, r in enumerate(result.rows[:limit], 1):
        if not r["feasible"]:
            lines.append(f"{i:>3} {_label(r['config']):<44} {'does not fit':>10}  {r.get('reason', '')}")
            continue
        tokens = r["throughput"]["tokens_per_second"]
        speed = f"{tokens:10.4g}" if tokens is not None else f"{r['throughput']['samples_per_second']:9.4g}s"
        mark = " (Megatron's even split)" if r.get("even_split") else "" if r["exact"] else " (local search)"
        mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
        tflops = "-" if r.get("tflops_per_gpu") is None else f"{r['tflops_per_gpu']:.0f}"
        when = f"{r['iteration_time_s']:.4g} s" if r.get("mfu") is not None else f"{r['iteration_time']:.6g}"
        room = min(r["headroom_bytes"]) / GIB
        lines.append(f"{i:>3} {_label(r['config']):<44} {when:>10} {speed:>10} {mfu:>6} {tflops:>7} "
                     f"{100 * r['idle_share']:4.0f}% {room:6.1f}Gi  {r['counts']}{mark}")
        b = r.get("breakdown")
        if b and i <= 3:
            total = sum(b.values()) or 1.0
            parts = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in b.items() if v / total >= 0.005)
            lines.append(f"{'':>3} {'busiest stage: ' + parts}")
    if len(result.rows) > limit:
        lines.append(f"... {len(result.rows) - limit} more rows (--json for all)")
    searched = f"{plural(result.searched, 'configuration')} searched"
    if result.top is not None and result.pruned:
        searched += (f", {result.pruned:,} pruned by bound (their fastest possible iteration is slower than "
                     f"row {result.top})")
    elif result.top is not None:
        searched += ", none pruned by bound"
    if result.top is not None and result.unfit:
        searched += f", {result.unfit:,} proved not to fit without a search"
    lines.append(searched)
    if result.skipped:
        lines.append(f"{plural(len(result.skipped), 'configuration')} skipped:")
        reasons: dict[str, int] = {}
        for s in result.skipped:
            reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
        lines += [f"  {n} x {why}" for why, n in sorted(reasons.items(), key=lambda e: -e[1])[:8]]
    return "\n".join(lines)


def _grid(args: argparse.Namespace) -> tuple[dict, dict]:
    """The grid of the flags given, and the source's device keywords (a ``--device`` list is a grid key)."""
    grid = {key: getattr(args, key) for key in GRID_KEYS if key != "device" and getattr(args, key) is not None}
    device = args.device
    if device is not None and "," in device:
        names = [d.strip() for d in device.split(",")]
        if any(not d for d in names):
            raise ValueError(f"--device: expected comma-separated device presets such as h100,h200, got {device!r}")
        grid["device"], device = names, None
    return grid, {"device": device, "gpus_per_node": args.gpus_per_node, "efficiency": args.efficiency,
                  "device_fields": dict(args.device_field) if args.device_field else None}


def cmd_sweep(args: argparse.Namespace) -> int:
    grid, device = _grid(args)
    if args.all and args.top is not None:
        raise ValueError("--all shows every row and --top N the first N: give one of them")
    top = None if args.all else (DEFAULT_TOP if args.top is None else args.top)
    result = sweep(args.spec, grid, gpus=args.gpus, global_batch=args.global_batch, score=args.score, top=top,
                   top_splits=args.top_splits, backend=args.backend, scheduler=args.scheduler,
                   capacity=args.capacity, reserved=args.reserved, seq=args.seq, bucket=args.bucket,
                   max_bytes=None if args.max_memory is None else int(args.max_memory),
                   tp_comm_overlap=args.tp_comm_overlap, dispatcher=args.dispatcher,
                   framework=args.framework,
                   max_seconds=args.max_time, **device)
    if args.seq is not None:  # a config (the sweep refuses --seq for others): what the plans do not follow
        for text in hf.config_notes(read_document(args.spec), args.seq):
            note(text)
    feasible = result.best is not None
    if args.plot:
        title = (f"{os.path.basename(args.spec)}: {args.gpus} GPUs, global batch {args.global_batch}"
                 + (f", plans as {args.framework} runs them" if args.framework else ""))
        plot_sweep(result.rows, args.plot, title, result.skipped, top)
    for row in result.rows:
        row["command"] = best_command(args, row["config"])
    if args.json:
        payload = {"gpuknap_json": JSON_VERSION, "version": __version__, "command": "sweep", "source": args.spec,
                   "gpus": args.gpus, "global_batch": args.global_batch, "score": args.score, "top": top,
                   "top_splits": args.top_splits, "grid": grid, "device": device["device"],
                   "dispatcher": args.dispatcher, "framework": args.framework, "searched": result.searched,
                   "pruned": result.pruned, "unfit": result.unfit, "best": result.best, "rows": result.rows, "skipped": result.skipped}
        json.dump(whole_bytes(payload), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(table(result))
        if feasible:
            even = " (Megatron's even split, in its note)" if result.rows[0].get("even_split") else ""
            what = (f"row 1's {args.framework} settings{even}: " if args.framework else
                    f"row 1's plan{even}, and with --emit megatron or --emit mindformers its settings: ")
            print(what + " ".join(shlex.quote(w) for w in result.rows[0]["command"]))
    if not result.rows:  # every configuration of the grid was refused: bad input, not an infeasible model
        reasons = "; ".join(sorted({s["reason"] for s in result.skipped}))
        raise ValueError(f"no configuration of the grid is valid: {reasons}"[:600])
    if not feasible:
        print(f"no configuration fits the device memory{_closest(result.rows)}", file=sys.stderr)
        return EXIT_INFEASIBLE
    return EXIT_OK
