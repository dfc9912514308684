"""Benchmarks of the sweep.

Issue 23 (``--top``): sweeps of at least 2,000 configurations, a Llama-2-70B-like spec on 1,024 GPUs
(P, TP, CP, micro-batch size, v) and Mixtral-8x7B on 256 GPUs (adding EP and ETP): ``top=10`` (certified
pruning) against the full sweep and against a loop of ``best_splits`` over the same configurations, the
first 10 rows compared, and how many configurations were searched, pruned by bound and proved not to fit.

Usage: python scripts/bench_sweep.py --top [--grids llama,mixtral] [--no-loop]

Issue 13 (the rest): a sweep of the shipped Llama-2-70B example against a loop of best_splits.

Usage: python scripts/bench_sweep.py [--backends numpy[,cupy]] [--dask-workers N] [--cells]
Both sides produce the same rows (best split, score, simulated iteration time per
configuration); the script checks that they are identical and prints the times.
The loop is what a driver would write without the sweep: per configuration,
best_splits, then the split's run estimate (gpuknap.costs.estimate: the simulated
schedule with its sends, plus the data-parallel tail and the optimizer step).

The last two columns are one more run of each side: the seconds spent in the DP
passes (results back on the host) and their share of that run.

--cells counts DP cells (rows x buckets over every pass) instead of timing: those
of the loop, of the sweep, and of the union of every stage problem either one
solves (all configurations and rounds in one batch, each distinct problem once,
chains shared as far as their steps agree): the least DP work any scheme that
shares these problems' passes can do.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

sys.path.insert(0, HERE)
from bench_model import timed  # noqa: E402

from gpuknap import MEGABYTE, best_splits, sweep  # noqa: E402
from gpuknap.schedule import simulated_times  # noqa: E402
from gpuknap.sweep import (
    builder_of,  # noqa: E402
    expand,  # noqa: E402
)

LLAMA = os.path.join(ROOT, "gpuknap", "examples", "llama2_70b.json")
MIXTRAL = os.path.join(ROOT, "gpuknap", "examples", "mixtral_8x7b_config.json")
#: Issue 23's grids: (source, sweep keywords, grid).
TOP_GRIDS = {
    "llama": (LLAMA, dict(gpus=1024, global_batch=1024, device="h100"),
              {"stages": [1, 2, 4, 5, 8, 10, 16, 20, 32, 40, 64, 80], "tensor_parallel": [1, 2, 4, 8],
               "context_parallel": [1, 2, 4, 8], "micro_batch_size": [1, 2, 4, 8], "interleave": [1, 2, 4]}),
    "mixtral": (MIXTRAL, dict(gpus=256, global_batch=1024, seq=4096, device="h100"),
                {"stages": [1, 2, 4, 8], "tensor_parallel": [1, 2, 4, 8], "context_parallel": [1, 2],
                 "expert_parallel": [1, 2, 4, 8], "expert_tensor_parallel": [1, 2, 4], "micro_batch_size": [1, 2, 4],
                 "interleave": [1, 2]}),
}
GRID = {"stages": [1, 2, 4, 8, 16], "tensor_parallel": [1, 2, 4, 8], "micro_batch_size": [1, 2, 4, 8],
        "interleave": [1, 2]}
GPUS, BATCH = 256, 1024


def loop(bucket: float, backend: str) -> dict:
    from gpuknap.costs import estimate  # here, not above: bench_engine imports this script at older revisions

    builder, _, _, _ = builder_of(LLAMA, None, None, None, bucket)
    configs, _ = expand(GRID, GPUS, BATCH, builder.layers)
    out = {}
    for c in configs:
        try:
            model = builder(c)
            found = best_splits(model, c["stages"], 1, "1f1b", bucket, backend=backend, interleave=c["interleave"])
        except ValueError:
            continue
        if model.costs is not None:  # the run as the sweep reports it: sends, data-parallel tail, optimizer
            sims = [estimate(model, f[0], model.option_names(f[0], f[2], None, c["interleave"]),
                             c["interleave"]).iteration_time / model.costs.time_unit for f in found]
        else:
            sims = simulated_times(model, found, None, c["interleave"])
        out[tuple(sorted(c.items()))] = [(list(f[0]), f[1], t) for f, t in zip(found, sims)]
    return out


def rows_of(result) -> dict:
    out = {}
    for r in result.rows:
        entry = out.setdefault(tuple(sorted(r["config"].items())), [])
        if r["feasible"]:
            entry.append((r["counts"], r["score"], r["iteration_time"]))
    return out


def passes_share(run) -> str:
    """One more run of ``run()``: the seconds its DP passes took (the engine's
    ``run_chunk``, results back on the host) and their share of the whole."""
    import gpuknap.engine._solve as engine

    spent = [0.0]
    real = engine.run_chunk

    def timing(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    engine.run_chunk = timing
    try:
        total, _ = timed(run, 1)
    finally:
        engine.run_chunk = real
    return f"{spent[0]:.2f} s ({spent[0] / total:.0%})"


def dp_cells(run) -> tuple[int, list]:
    """DP cells the engine computes while ``run()`` runs, and every (front table,
    knapsack) it was given."""
    import gpuknap.engine._solve as ranking

    from gpuknap.engine._batch import build_chunk, plan_chunks

    seen, cells = [], [0]
    solve = ranking.solve_knapsacks

    def counting(problems, table, backend, max_bytes, n_ids):
        seen.extend((table, p) for p in problems)
        cells[0] += union_cells([(table, p) for p in problems], build_chunk, plan_chunks)
        return solve(problems, table, backend, max_bytes, n_ids)

    ranking.solve_knapsacks = counting
    try:
        run()
    finally:
        ranking.solve_knapsacks = solve
    return cells[0], seen


def union_cells(entries: list, build_chunk, plan_chunks) -> int:
    """Cells of one batch per distinct set of fronts holding each distinct problem once."""
    from gpuknap.engine._batch import Knapsack

    groups: dict = {}
    for table, p in entries:
        key = tuple(sorted(((k, tuple(v)) for k, v in table.fronts.items()), key=repr)), table.bucket, table.relaxed
        groups.setdefault(key, (table, set()))[1].add((p.runs, p.capacity))
    total = 0
    for table, problems in groups.values():
        knapsacks = [Knapsack(runs, cap, i) for i, (runs, cap) in enumerate(sorted(problems, key=repr))]
        total += sum(build_chunk(e, table).cells for e in plan_chunks(knapsacks, 1 << 50, table.bucket))
    return total


def cells_report(bucket: float) -> None:
    from gpuknap.engine._batch import build_chunk, plan_chunks

    sweep_cells, a = dp_cells(lambda: sweep(LLAMA, GRID, gpus=GPUS, global_batch=BATCH, backend="numpy",
                                            bucket=bucket))
    loop_cells, b = dp_cells(lambda: loop(bucket, "numpy"))
    union = union_cells(a + b, build_chunk, plan_chunks)
    print(f"| {bucket / MEGABYTE:g} MiB | {loop_cells:.3g} | {sweep_cells:.3g} | {union:.3g} "
          f"| {loop_cells / sweep_cells:.2f}x | {loop_cells / union:.2f}x |", flush=True)


def top_loop(source: str, kw: dict, grid: dict, bucket: float) -> list:
    """What a driver writes without the sweep: every valid configuration's model, best_splits,
    the split's simulated iteration time; the 10 fastest (by the sweep's own row order)."""
    from gpuknap.sweep import order_rows, run_configs

    device = {"device": kw["device"]}
    builder, _, bucket, tokens = builder_of(source, None, None, kw.get("seq"), bucket, device)
    configs, _ = expand(grid, kw["gpus"], kw["global_batch"], builder.layers)
    rows = []
    for c in configs:  # run_configs on one configuration: best_splits and its simulation, nothing shared
        try:
            got, _ = run_configs([c], builder, global_batch=kw["global_batch"], score="1f1b", top=1, bucket=bucket,
                                 backend="numpy", max_bytes=None, time_unit=1e-3, tokens=tokens)
        except ValueError:
            continue
        rows += got
    return order_rows(rows, configs)[:10]


def top_report(names: list, loop: bool, bucket: float) -> None:
    import json as _json

    print("| grid | configurations (valid) | top=10 (s) | searched | pruned by bound | proved not to fit "
          "| full sweep (s) | full / top | loop (s) | loop / top | first 10 rows identical |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for name in names:
        source, kw, grid = TOP_GRIDS[name]
        total = int(np.prod([len(v) for v in grid.values()]))
        # warm up first: the compiled CPU pass loads (about 1.3 s) and modules import on a first sweep
        sweep(source, {k: v[:2] for k, v in grid.items()}, top=10, backend="numpy", bucket=bucket, **kw)
        tt, top = timed(lambda: sweep(source, grid, top=10, backend="numpy", bucket=bucket, **kw), 1)
        tf, full = timed(lambda: sweep(source, grid, backend="numpy", bucket=bucket, **kw), 1)
        same = _json.dumps(top.rows) == _json.dumps(full.rows[:10])
        valid = full.searched
        if loop:
            tl, ref = timed(lambda: top_loop(source, kw, grid, bucket), 1)
            same = same and _json.dumps(ref) == _json.dumps(full.rows[:10])
            loop_cells = f"{tl:.1f} | {tl / tt:.1f}x"
        else:
            loop_cells = "- | -"
        print(f"| {name} | {total:,} ({valid:,}) | {tt:.1f} | {top.searched} | {top.pruned} | {top.unfit} | {tf:.1f} "
              f"| {tf / tt:.1f}x | {loop_cells} | {'yes' if same else 'NO'} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", action="store_true", help="issue 23: top=10 against the full sweep and a loop")
    ap.add_argument("--grids", default="llama,mixtral")
    ap.add_argument("--no-loop", action="store_true", help="with --top: leave the loop of best_splits out")
    ap.add_argument("--backends", default="numpy")
    ap.add_argument("--dask-workers", type=int, default=2)
    ap.add_argument("--cells", action="store_true", help="count DP cells instead of timing")
    args = ap.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"numpy {np.__version__}, {time.strftime('%Y-%m-%d')}")
    if args.top:
        for name in args.grids.split(","):
            source, kw, grid = TOP_GRIDS[name]
            print(f"# {name}: {os.path.basename(source)} {kw}, grid {grid}")
        print()
        top_report(args.grids.split(","), not args.no_loop, 16 * MEGABYTE)
        return
    print(f"# {LLAMA}: {GPUS} GPUs, global batch {BATCH}, grid {GRID}\n")
    if args.cells:
        print("| bucket | loop DP cells | sweep DP cells | union of all problems | loop / sweep | loop / union |")
        print("|---|---:|---:|---:|---:|---:|")
        for bucket in (16 * MEGABYTE, MEGABYTE):
            cells_report(bucket)
        return
    print("| bucket | backend | configurations | feasible | sweep (s) | loop of best_splits (s) | loop / sweep | identical "
          "| passes: sweep | passes: loop |")
    print("|---|---|---:|---:|---:|---:|---:|:---:|---:|---:|")
    for bucket in (16 * MEGABYTE, MEGABYTE):
        for backend in args.backends.split(","):
            ts, result = timed(lambda: sweep(LLAMA, GRID, gpus=GPUS, global_batch=BATCH, backend=backend,
                                             bucket=bucket))
            tl, ref = timed(lambda: loop(bucket, backend))
            same = rows_of(result) == ref
            feasible = sum(1 for r in result.rows if r["feasible"])
            ps = passes_share(lambda: sweep(LLAMA, GRID, gpus=GPUS, global_batch=BATCH, backend=backend,
                                            bucket=bucket))
            pl = passes_share(lambda: loop(bucket, backend))
            print(f"| {bucket / MEGABYTE:g} MiB | {backend} | {len(ref)} | {feasible} | {ts:.2f} | {tl:.2f} "
                  f"| {tl / ts:.2f}x | {'yes' if same else 'NO'} | {ps} | {pl} |", flush=True)
    if args.dask_workers:
        from distributed import Client, LocalCluster
        with LocalCluster(n_workers=args.dask_workers, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            want = sweep(LLAMA, GRID, gpus=GPUS, global_batch=BATCH, backend="numpy", bucket=16 * MEGABYTE)
            t, got = timed(lambda: sweep(LLAMA, GRID, gpus=GPUS, global_batch=BATCH, backend="numpy",
                                         bucket=16 * MEGABYTE, scheduler=client), 2)
            print(f"\nDask LocalCluster, {args.dask_workers} worker processes, 16 MiB: {t:.2f} s, rows identical to "
                  f"the in-process sweep: {'yes' if got.rows == want.rows else 'NO'}")


if __name__ == "__main__":
    main()
