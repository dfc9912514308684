"""Benchmark (issue 12): the best interleaved split and the simulated score on the SAPP-PPB demo.

Usage: python scripts/bench_interleaved.py
The SAPP-PPB demo profile (HEAD, 96 BODY, TAIL), 32 micro-batches; each row is the
best of 3 runs of the API call named, NumPy backend, 1 MiB buckets.
"""
from __future__ import annotations

import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

sys.path.insert(0, HERE)
from bench_model import timed  # noqa: E402

from gpuknap import best_splits  # noqa: E402
from gpuknap.formats import load_spec  # noqa: E402
from gpuknap.schedule import simulated_times  # noqa: E402

SAPP = os.path.join(os.path.dirname(HERE), "gpuknap", "examples", "sapp_ppb_demo.json")


def main() -> None:
    print(f"# {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"numpy {np.__version__}, {time.strftime('%Y-%m-%d')}\n")
    print("| capacity | stages | interleave | score | top | time (s) | best score | simulated | counts |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---|")
    for capacity, stages, chunks, score in (("80 GiB", 8, 2, "slowest"), ("80 GiB", 8, 2, "1f1b"),
                                            ("160 GiB", 8, 2, "1f1b"), ("160 GiB", 8, 3, "1f1b"),
                                            ("56000 MB", 16, 1, "simulated"), ("80 GiB", 8, 1, "simulated"),
                                            ("80 GiB", 8, 2, "simulated")):
        spec = load_spec(SAPP, capacity=capacity, micro_batches=32)
        t, found = timed(lambda: best_splits(spec.model, stages, 1, score, spec.bucket, backend="numpy",
                                             interleave=chunks))
        if not found:
            print(f"| {capacity} | {stages} | {chunks} | {score} | 1 | {t:.3f} | infeasible | | |")
            continue
        sim = simulated_times(spec.model, found, None, chunks)[0]
        print(f"| {capacity} | {stages} | {chunks} | {score} | 1 | {t:.3f} | {found[0][1]:.6g} | {sim:.6g} "
              f"| {list(found[0][0])} |", flush=True)


if __name__ == "__main__":
    main()
