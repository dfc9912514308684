"""Benchmark (issue 22): the exact search by the simulated 1F1B score against the 1f1b search.

Usage: python scripts/bench_simulated.py [--repeat N] [--max-bytes BYTES] [--stages 8,16,...]
                                         [--micro-batches 32,64,128] [--top K] [--markdown]

Model: the Llama-2-70B-like scale model of scripts/_scale.py (80 equal BODY layers,
embedding HEAD, output TAIL, 4 options from full recompute to none) at a capacity
where recompute is chosen: 4 GiB reserved + the static bytes of an even share of the
layers + half of what 80 layers without recompute keep per micro-batch in flight
(``capacity(P)`` below; the first stages recompute).  The same model again with
every BODY layer's times jittered by up to +-5% (each layer its own kind, seeded by P).

For each (P, M): the ``1f1b`` search and the ``simulated`` search, best of N runs
each, measured one after the other in the same process (NumPy backend, 1 MiB
buckets, top 1 or ``--top``).  Also: whether the simulated answer is the best of the 1f1b
search's 200 best splits simulated (a check, not a proof: the search itself is
exact), how many layers recompute, and the peak memory the Python allocator saw
during one simulated search (tracemalloc) against ``--max-bytes``.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
from _scale import GIB, MIB, scale_model  # noqa: E402

from gpuknap import LayerOption, PipelineModel, best_splits  # noqa: E402
from gpuknap.schedule import simulated_times  # noqa: E402


def capacity(stages: int) -> float:
    return 4 * GIB + (80 / stages) * 765 * MIB + 0.5 * 80 * 136 * MIB


def jittered(model: PipelineModel, seed: int, amount: float = 0.05) -> PipelineModel:
    """Every BODY layer its own kind, its options' times scaled by one factor in [1 - a, 1 + a]."""
    rng = np.random.default_rng(seed)
    kinds, fronts, static = [], dict(model.fronts), dict(model.static)
    for i, kind in enumerate(model.kinds):
        if kind != "BODY":
            kinds.append(kind)
            continue
        x = 1 + rng.uniform(-amount, amount)
        name = f"L{i}"
        fronts[name] = [LayerOption(o.name, o.per_micro_batch, o.forward_time * x, o.backward_time * x,
                                    o.held_once, o.excess) for o in model.fronts[kind]]
        static[name] = static[kind]
        kinds.append(name)
    return PipelineModel(kinds, fronts, static, model.capacity, model.micro_batches, model.reserved)


def best_of(fn, repeat: int) -> tuple[float, object]:
    out, best = None, float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def run(stages: list, micro: list, repeat: int, max_bytes: int, k: int = 1) -> list[dict]:
    rows = []
    for jitter in (False, True):
        for p in stages:
            for m in micro:
                model = scale_model(80, 4, p, capacity(p), m)
                if jitter:
                    model = jittered(model, p)
                t_closed, closed = best_of(lambda: best_splits(model, p, k, "1f1b", MIB, backend="numpy"), repeat)
                t_sim, sim = best_of(lambda: best_splits(model, p, k, "simulated", MIB, backend="numpy",
                                                         max_bytes=max_bytes), repeat)
                tracemalloc.start()
                best_splits(model, p, k, "simulated", MIB, backend="numpy", max_bytes=max_bytes)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                top = best_splits(model, p, 200, "1f1b", MIB, backend="numpy")
                resimulated = min(simulated_times(model, top))
                names = model.plan(list(sim[0][0]), MIB)
                rows.append({"jitter": jitter, "P": p, "M": m, "t_1f1b": t_closed, "t_sim": t_sim,
                             "ratio": t_sim / t_closed, "score": sim[0][1], "closed_best": closed[0][1],
                             "top200": resimulated, "recompute": sum(n not in ("R3", "HEAD", "TAIL") for n in names),
                             "peak": peak})
                r = rows[-1]
                print(f"{'jitter' if jitter else 'equal '} P={p:>2} M={m:>3}  1f1b {t_closed:7.3f} s  simulated "
                      f"{t_sim:7.3f} s  ({r['ratio']:4.1f}x)  score {r['score']:10.2f}  best of 1f1b top 200 "
                      f"{resimulated:10.2f}  recompute {r['recompute']:>2}  peak {peak / MIB:6.1f} MiB", flush=True)
    return rows


def markdown(rows: list, max_bytes: int) -> str:
    lines = ["| layers | P | M | 1f1b search (s) | simulated search (s) | ratio | simulated best | best of 1f1b top 200, "
             "simulated | recomputed layers | peak memory (MiB) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {'jittered' if r['jitter'] else 'equal'} | {r['P']} | {r['M']} | {r['t_1f1b']:.3f} | "
                     f"{r['t_sim']:.3f} | {r['ratio']:.1f} | {r['score']:.2f} | {r['top200']:.2f} | {r['recompute']} | "
                     f"{r['peak'] / MIB:.1f} |")
    worst = max(rows, key=lambda r: r["ratio"])
    slowest = max(rows, key=lambda r: r["t_sim"])
    lines.append("")
    lines.append(f"Worst ratio {worst['ratio']:.1f}x ({'jittered' if worst['jitter'] else 'equal'} P={worst['P']} "
                 f"M={worst['M']}); slowest simulated search {slowest['t_sim']:.3f} s; largest peak "
                 f"{max(r['peak'] for r in rows) / MIB:.1f} MiB (max_bytes {max_bytes / MIB:.0f} MiB).")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-bytes", type=int, default=64 * MIB)
    ap.add_argument("--stages", default="8,16,24,32,40")
    ap.add_argument("--micro-batches", default="32,64,128")
    ap.add_argument("--top", type=int, default=1, help="splits each search returns (default 1)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    print(f"# {platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, NumPy {np.__version__}, {time.strftime('%Y-%m-%d')}")
    rows = run([int(x) for x in args.stages.split(",")], [int(x) for x in args.micro_batches.split(",")],
               args.repeat, args.max_bytes, args.top)
    if args.markdown:
        print(markdown(rows, args.max_bytes))


if __name__ == "__main__":
    main()
