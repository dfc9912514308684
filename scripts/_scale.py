"""Scale models for the search benchmarks (issue 10): a Llama-2-70B-like body kind with N options.

HEAD (embedding), L BODY layers, TAIL (output head), tensor-parallel 8, sequence 4096,
micro-batch 1: a BODY layer keeps 765 MiB of static memory; its options run from full
recompute (8 MiB per micro-batch in flight, 65.6 ms) to no recompute (136 MiB, 49.2 ms),
N of them with memory evenly spaced and time falling as the square root (every option
useful).  M = 2P micro-batches, 80 GiB devices with 4 GiB reserved, unless given.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpuknap import LayerOption, PipelineModel  # noqa: E402

MIB, GIB = 2**20, 2**30


def body_options(n: int) -> list[LayerOption]:
    light, heavy = 8.0, 136.0          # MiB per micro-batch in flight
    slow, fast = 65.59, 49.19          # ms, forward + backward
    out = []
    for i in range(n):
        x = i / max(n - 1, 1)
        time = slow - (slow - fast) * x ** 0.5
        out.append(LayerOption(f"R{i}", (light + (heavy - light) * x) * MIB, 16.4, time - 16.4))
    return out


def scale_model(layers: int, options: int, stages: int, capacity: float = 80 * GIB,
                micro_batches: int | None = None) -> PipelineModel:
    kinds = ["HEAD"] + ["BODY"] * layers + ["TAIL"]
    fronts = {"HEAD": [LayerOption("HEAD", 0.0, 0.0, 0.0)], "BODY": body_options(options),
              "TAIL": [LayerOption("TAIL", 0.0, 4.34, 8.69)]}
    static = {"HEAD": 234.375 * MIB, "BODY": 765.0 * MIB, "TAIL": 234.375 * MIB}
    return PipelineModel(kinds, fronts, static, capacity, micro_batches or 2 * stages, 4 * GIB)


#: (layers, options, stages, capacity) of the benchmark table.
CASES = [
    (96, 4, 16, 80 * GIB),
    (200, 16, 32, 80 * GIB),
    (400, 16, 32, 80 * GIB),
    (400, 64, 64, 80 * GIB),
    (1000, 16, 64, 80 * GIB),
    (1000, 16, 16, 40 * GIB),  # infeasible: even the lightest options do not fit
]
