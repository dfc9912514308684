"""Benchmark (issue 2): rank N random splits of the demo profile vs pp_lite per candidate.

Usage: python scripts/bench_rank.py [N ...]   (default 100 1000 10000)
Stage lists are built before timing (both paths take the same lists); rank is
best of 3 runs, the pp_lite loop runs once.
"""
from __future__ import annotations

import platform
import sys
import time

import numpy as np
from _demo import MICRO_BATCHES, STAGES, demo_model, random_splits

from gpuknap import pp_lite, rank


def main(sizes):
    model = demo_model()
    print(f"# machine: {platform.machine()} {platform.processor() or ''} python {platform.python_version()} "
          f"numpy {np.__version__}; {STAGES} stages, {MICRO_BATCHES} micro-batches, 56000 MB, 1 MiB buckets")
    print("| N | rank (s) | pp_lite loop (s) | speed-up | feasible | agree |")
    print("|---:|---:|---:|---:|---:|:---:|")
    for n in sizes:
        splits = random_splits(model, STAGES, n, seed=n)
        cands = [model.stages(s) for s in splits]
        t_rank = float("inf")
        for _ in range(3):  # best of 3 (the first call also pays imports and caches)
            t0 = time.perf_counter()
            r = rank(cands, model.fronts, backend="numpy")
            t_rank = min(t_rank, time.perf_counter() - t0)
        t0 = time.perf_counter()
        ref = [pp_lite(c, model.fronts) for c in cands]
        t_loop = time.perf_counter() - t0
        want = np.array([np.inf if p is None else p.slowest for p in ref])
        agree = bool(np.array_equal(want, r.slowest)) and all(
            r.times(i) == (None if p is None else list(p.times)) for i, p in enumerate(ref))
        print(f"| {n:,} | {t_rank:.3f} | {t_loop:.2f} | {t_loop / t_rank:.0f}x | {int(np.isfinite(want).sum()):,} | {'yes' if agree else 'NO'} |",
              flush=True)
        if not agree:
            sys.exit(1)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100, 1000, 10000])
