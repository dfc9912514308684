"""Benchmarks (issue 4): exhaustive best_splits, model.rank of 1M splits, and a MILP side by side.

Usage: python scripts/bench_model.py [--splits N] [--milp-seconds S]
The demo profile: HEAD, 96 BODY, TAIL; 16 stages, 32 micro-batches, 56000 MB, 1 MiB buckets.
"""
from __future__ import annotations

import argparse
import platform
import time

import numpy as np
from _demo import MICRO_BATCHES, STAGES, demo_model, random_splits

from gpuknap import MEGABYTE, best_splits


def timed(fn, repeat=3):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def milp_slowest(model, stages, seconds):
    """The best split as a MILP (HiGHS): integer BODY layers per stage and option,
    exact bytes, minimise the slowest stage.  HEAD on stage 0, TAIL on the last."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    kinds = model.kinds
    head, tail = kinds[0], kinds[-1]
    body = kinds[1]
    assert set(kinds[1:-1]) == {body} and head != body and tail != body, "HEAD, BODY..., TAIL profiles only"
    n_body = len(kinds) - 2
    opts = model.fronts[body]
    n_opt = len(opts)
    nv = stages * n_opt + 1  # n[s, o] then z
    z = nv - 1
    rows, lo, hi = [], [], []

    def row():
        return np.zeros(nv)

    r = row()
    r[:z] = 1
    rows.append(r); lo.append(n_body); hi.append(n_body)
    limit = model.capacity - model.reserved
    for s in range(stages):
        k = min(stages - s, model.micro_batches)
        fixed_mem = (model.static[head] if s == 0 else 0) + (model.static[tail] if s == stages - 1 else 0)
        fixed_time = (opts_time(model.fronts[head]) if s == 0 else 0) + (opts_time(model.fronts[tail]) if s == stages - 1 else 0)
        fixed_mem += (model.fronts[head][0].memory(k) if s == 0 else 0) + (model.fronts[tail][0].memory(k) if s == stages - 1 else 0)
        mem, tim = row(), row()
        for o, opt in enumerate(opts):
            mem[s * n_opt + o] = model.static[body] + opt.memory(k)
            tim[s * n_opt + o] = opt.forward_time + opt.backward_time
        rows.append(mem); lo.append(-np.inf); hi.append(limit - fixed_mem)
        tim[z] = -1
        rows.append(tim); lo.append(-np.inf); hi.append(-fixed_time)
        if 0 < s < stages - 1:
            cnt = row()
            cnt[s * n_opt:(s + 1) * n_opt] = 1
            rows.append(cnt); lo.append(1); hi.append(np.inf)
    c = np.zeros(nv)
    c[z] = 1
    integrality = np.ones(nv)
    integrality[z] = 0
    t0 = time.perf_counter()
    res = milp(c, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=integrality,
               bounds=Bounds(0, np.inf), options={"time_limit": seconds})
    return time.perf_counter() - t0, res


def opts_time(options):
    return min(o.forward_time + o.backward_time for o in options)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", type=int, default=1_000_000)
    ap.add_argument("--milp-seconds", type=float, default=120.0)
    args = ap.parse_args()
    model = demo_model()
    print(f"# machine: {platform.machine()}, {__import__('os').cpu_count()} cores, python {platform.python_version()}, "
          f"numpy {np.__version__}; demo profile, {STAGES} stages, {MICRO_BATCHES} micro-batches, 56000 MB, 1 MiB buckets")
    print("\n| best_splits (NumPy) | time (s), best of 3 | best score | best counts |")
    print("|---|---:|---:|---|")
    results = {}
    for score in ("slowest", "1f1b"):
        for top in (1, 10):
            t, out = timed(lambda: best_splits(model, STAGES, top, score, MEGABYTE, backend="numpy"))
            results[(score, top)] = out
            print(f"| {score}, top {top} | {t:.3f} | {out[0][1]:.1f} | {list(out[0][0])} |", flush=True)

    splits = random_splits(model, STAGES, args.splits, seed=1)
    t, r = timed(lambda: model.rank(splits, backend="numpy"))
    print(f"\nmodel.rank of {args.splits:,} random splits (uniform among memory-plausible ones): "
          f"{t:.2f} s best of 3; {int(np.isfinite(r.slowest).sum()):,} feasible; best {r.slowest[r.order[0]]:.1f}")
    check = r.order[:5].tolist()
    for i in check:
        ch = r.choice(i)
        assert ch is not None and ch.slowest == r.slowest[i]

    t_milp, res = milp_slowest(model, STAGES, args.milp_seconds)
    ours = results[("slowest", 1)][0][1]
    t_ours = timed(lambda: best_splits(model, STAGES, 1, "slowest", MEGABYTE, backend="numpy"))[0]
    print("\n| solver | time (s) | slowest stage | status |")
    print("|---|---:|---:|---|")
    print(f"| gpuknap best_splits (1 MiB buckets) | {t_ours:.3f} | {ours:.1f} | exact (bucketed) |")
    if res.x is not None:
        print(f"| HiGHS MILP via scipy.optimize.milp (exact bytes) | {t_milp:.2f} | {res.fun:.1f} | {res.message} |")
        print(f"\nbucketed objective's gap to the MILP: {100 * (ours - res.fun) / res.fun:+.4f}% "
              f"(MILP dual bound {getattr(res, 'mip_dual_bound', float('nan')):.1f})")
    else:
        print(f"| HiGHS MILP (exact bytes) | {t_milp:.2f} | - | {res.message} |")


if __name__ == "__main__":
    main()
