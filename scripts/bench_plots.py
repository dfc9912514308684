"""Benchmark (issue 25): seconds of drawing (building the figure and writing the PNG) of the README's
plot commands, the search left out.  Usage: python scripts/bench_plots.py [--repeat N]"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from bench_model import timed  # noqa: E402

from gpuknap import best_splits, sweep  # noqa: E402
from gpuknap.cli._gantt import communication_shares  # noqa: E402
from gpuknap.cli._plots import plot_best, plot_curve, plot_scores, plot_sweep, plot_timeline  # noqa: E402
from gpuknap.cli._report import split_record  # noqa: E402
from gpuknap.costs import pipeline_send  # noqa: E402
from gpuknap.formats import load_spec  # noqa: E402
from gpuknap.schedule import of_split  # noqa: E402

EXAMPLES = os.path.join(ROOT, "gpuknap", "examples")


def best_inputs(path: str, **kw) -> tuple:
    spec = load_spec(os.path.join(EXAMPLES, path), **kw)
    model, p = spec.model, spec.stages
    found = best_splits(model, p, 1, "simulated", spec.bucket, backend="numpy")
    counts = list(found[0][0])
    record = split_record(model, counts, found[0][2], "simulated", found[0][1], bucket=spec.bucket)
    solved = of_split(model, counts, spec.bucket, None, 1, pipeline_send(model, p))
    comm = communication_shares(model, counts, model.option_names(counts, found[0][2]), 1)
    return [record], solved, comm, model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    out = tempfile.mkdtemp()
    png = os.path.join(out, "p.png")
    rows = []
    records, solved, comm, _ = best_inputs("demo.json")
    rows.append(("best --plot (demo, 16 stages, 32 micro-batches)",
                 timed(lambda: plot_best(records, solved, png, "demo", comm), args.repeat)[0]))
    records, solved, comm, _ = best_inputs("llama2_70b.json")
    rows.append(("best --plot (Llama-2-70B spec, 8 stages, 64 micro-batches)",
                 timed(lambda: plot_best(records, solved, png, "llama", comm), args.repeat)[0]))
    records, solved, comm, _ = best_inputs("qwen2_7b_config.json", micro_batches=256, stages=4, seq=4096,
                                           data_parallel=8)
    rows.append(("best --plot (Qwen2-7B, 4 stages, 256 micro-batches)",
                 timed(lambda: plot_best(records, solved, png, "qwen", comm), args.repeat)[0]))
    rows.append(("timeline --plot (the same, 256 micro-batches)",
                 timed(lambda: plot_timeline(solved[0], solved[1], png, "qwen", True, comm), args.repeat)[0]))
    result = sweep(os.path.join(EXAMPLES, "llama2_70b.json"), {"stages": [2, 4, 8], "tensor_parallel": [4, 8],
                                                              "micro_batch_size": [1, 2]},
                   gpus=64, global_batch=256, backend="numpy")
    rows.append(("sweep --plot (README grid)", timed(lambda: plot_sweep(result.rows, png, "sweep", result.skipped),
                                                     args.repeat)[0]))
    points = [{"budget_bytes": b * 2**30, "time": 100.0 - b} for b in range(40, 60)]
    rows.append(("curve --plot", timed(lambda: plot_curve(points, png, "curve", 45 * 2**30), args.repeat)[0]))
    rng = np.random.default_rng(0)
    rows.append(("rank --plot (10,000 scores)",
                 timed(lambda: plot_scores(rng.random(10_000) * 100, png, "scores", 1.0), args.repeat)[0]))
    print(f"# {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}; best of {args.repeat}, drawing and writing the PNG only\n")
    print("| plot | seconds |\n|---|---:|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
