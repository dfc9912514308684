"""Benchmark (issue 24): the fused CPU pass against the NumPy pass, on the engine's own levels,
and end to end against a baseline revision.

Usage: python scripts/bench_engine.py [--part levels,e2e,memory] [--baseline REV] [--repeat N]
                                      [--threads 1,2] [--quick] [--heavy]

levels: the chunks the engine builds for real workloads (``model.rank`` on the
  Llama-2-70B example; ``best_splits`` and ``model.rank`` on the ``_scale``
  models with 4 and 64 options; the sweep of ``bench_sweep.py`` at 1 MiB; the
  ``bench_gpu`` batch) are captured once, then replayed through the NumPy pass
  and the fused pass (best of N each, per thread count); the readouts must be
  bit-identical.  Prints cell-options per second (a cell-option is one cell
  of one row with one of its options: one addition and one minimum) and the ratio.
e2e: the same workloads end to end with ``backend="auto"``, this checkout
  against ``--baseline`` (default: where this branch left main) in a temporary
  git worktree, in separate processes, alternated ``--repeat`` times; each
  time is the best over every process and repeat, and the spread (worst best
  over best best, per side) says how noisy the machine was.  ``--heavy``: instead, the
  sweeps of ``HEAVY`` (tens of seconds each; ``--repeat 1`` is enough).
memory: peak and kept memory of ``model.rank`` per split (fresh processes).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LLAMA = os.path.join("gpuknap", "examples", "llama2_70b.json")


def near_even(layers: int, stages: int, count: int, moves: int = 40, seed: int = 0):
    """``count`` splits of ``layers`` into ``stages``: the most even split, then ``moves``
    random shifts of one layer across a boundary (each stage keeps at least one layer)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    base, extra = divmod(layers, stages)
    out = np.tile(np.array([base + (s >= stages - extra) for s in range(stages)], dtype=np.int64), (count, 1))
    rows = np.arange(count)
    for _ in range(moves):
        i = rng.integers(0, stages - 1, count)
        d = rng.choice(np.array([-1, 1]), count)
        ok = (out[rows, i] - d >= 1) & (out[rows, i + 1] + d >= 1)
        out[rows[ok], i[ok]] -= d[ok]
        out[rows[ok], i[ok] + 1] += d[ok]
    return out


def workloads(quick: bool) -> dict:
    """name -> a function of the backend running it (with whichever gpuknap is first on sys.path)."""
    from _scale import GIB, scale_model

    from gpuknap import MEGABYTE, best_splits, sweep
    try:
        from gpuknap.formats import load_spec
    except ImportError:  # a revision from before the package layout
        from gpuknap.formats import load_spec
    sys.path.insert(0, HERE)
    from bench_sweep import BATCH, GPUS, GRID

    llama = load_spec(os.path.join(ROOT, LLAMA))
    # devices small enough that stages need the DP (at 80 GiB every stage fits its fastest options)
    m4, m64 = scale_model(96, 4, 16, 12 * GIB), scale_model(400, 64, 64, 32 * GIB)
    r64 = scale_model(400, 64, 32, 40 * GIB)
    n = 200 if quick else 2000
    splits_llama = near_even(llama.model.layers, 8, 20 * n, 30, seed=3)
    splits_64 = near_even(r64.layers, 32, n, 60, seed=4)
    grid = {k: v[:2] for k, v in GRID.items()} if quick else GRID
    return {
        "model.rank, Llama-2-70B example, 8 stages": lambda b: llama.model.rank(splits_llama, llama.bucket, b),
        "best_splits L=96, 4 options, P=16, 12 GiB, 1f1b": lambda b: best_splits(m4, 16, 1, "1f1b", MEGABYTE, backend=b),
        "best_splits L=400, 64 options, P=64, 32 GiB, 1f1b": lambda b: best_splits(m64, 64, 1, "1f1b", MEGABYTE, backend=b),
        "model.rank L=400, 64 options, P=32, 40 GiB": lambda b: r64.rank(splits_64, MEGABYTE, b),
        "sweep at 1 MiB": lambda b: sweep(os.path.join(ROOT, LLAMA), grid, gpus=GPUS, global_batch=BATCH,
                                          backend=b, bucket=MEGABYTE),
        "sweep at 16 MiB": lambda b: sweep(os.path.join(ROOT, LLAMA), grid, gpus=GPUS, global_batch=BATCH,
                                           backend=b, bucket=16 * MEGABYTE),
        HEAVY[0]: lambda b: SimpleNamespace(rows=[row for more in SLOWEST_SIZES for row in sweep(
            os.path.join(ROOT, LLAMA), {**SLOWEST, **more}, gpus=5120, global_batch=40960, backend=b,
            max_seconds=None).rows]),
        HEAVY[1]: lambda b: sweep(os.path.join(ROOT, LLAMA), GRID_192, gpus=1024, global_batch=4096, backend=b,
                                  max_seconds=None),
    }


#: Workloads of tens of seconds, timed with ``--heavy`` only (on their own): the sweep
#: configurations that take longest (hundreds of thousands of stage problems each), and a
#: realistic sweep of every row.
HEAVY = ("sweep, 2 of the slowest configurations (5,120 GPUs, P 2, v 4, mbs 8)",
         "sweep, every row of 192 configurations (1,024 GPUs, P 2-16, v 1 and 4)")
SLOWEST = {"stages": [2], "interleave": [4], "micro_batch_size": [8], "device": ["h100"]}
SLOWEST_SIZES = ({"tensor_parallel": [8], "context_parallel": [1]}, {"tensor_parallel": [4], "context_parallel": [2]})
GRID_192 = {"stages": [2, 4, 5, 8, 10, 16], "tensor_parallel": [1, 2, 4, 8], "context_parallel": [1, 2],
            "micro_batch_size": [1, 2, 4], "interleave": [1, 4]}


# ---------------------------------------------------------------- levels: capture and replay

def capture(run, backend="numpy") -> list:
    """Every chunk the engine runs while ``run(backend)`` runs."""
    import gpuknap.engine._solve as solve

    chunks, real = [], solve.run_chunk

    def keep(backend, chunk, *args, **kwargs):
        chunks.append(chunk)
        return real(backend, chunk, *args, **kwargs)

    solve.run_chunk = keep
    try:
        run(backend)
    finally:
        solve.run_chunk = real
    return chunks


def gpu_batch(rows: int, buckets: int, steps: int, options: int) -> list:
    from bench_gpu import make_batch

    from gpuknap.engine._batch import build_chunk, plan_chunks

    table, problems = make_batch(rows, buckets, steps, options)
    return [build_chunk(entries, table) for entries in plan_chunks(problems, 2**62, 1.0)]


def cell_options(chunks: list) -> int:
    total = 0
    for chunk in chunks:
        for lv in chunk.levels:
            for seg in lv.segments:
                total += (seg.stop - seg.start) * lv.width * int((seg.weights < lv.width).sum())
    return total


def shape(chunks: list) -> str:
    import numpy as np

    levels = [lv for c in chunks for lv in c.levels]
    rows = np.array([lv.rows for lv in levels])
    width = np.array([lv.width for lv in levels])
    opts = cell_options(chunks) / max(1, int((rows * width).sum()))
    return (f"{len(levels):,} levels, median {int(np.median(rows))} rows x {int(np.median(width)):,} buckets, "
            f"{opts:.1f} options per cell")


def replay(chunks: list, repeat: int, threads: list) -> dict:
    """Best-of-``repeat`` seconds of the NumPy pass and of the fused pass at each thread count."""
    import numba
    import numpy as np

    from gpuknap.engine import _cpu
    from gpuknap.engine._backend import NUMPY
    from gpuknap.engine._solve import run_chunk

    def numpy_run():
        return [run_chunk(NUMPY, c) for c in chunks]

    def fused_run():
        space = _cpu.Workspace()
        return [_cpu.run_chunk(c, None, space) for c in chunks]

    want = numpy_run()
    got = fused_run()
    same = all(np.array_equal(a, b) for a, b in zip(want, got)) and len(want) == len(got)
    out = {"numpy": best(numpy_run, repeat), "same": same}
    for n in threads:
        numba.set_num_threads(n)
        out[n] = best(fused_run, repeat)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    return out


def best(fn, repeat: int) -> float:
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def levels_part(args) -> None:
    sys.path[:0] = [ROOT, HERE]
    threads = [int(t) for t in args.threads.split(",")]
    loads = workloads(args.quick)
    cases = [(name, lambda name=name: capture(loads[name])) for name in loads
             if name != "sweep at 16 MiB" and name not in HEAVY]
    rows = 32 if args.quick else 256
    cases += [(f"bench_gpu batch, {rows} rows x 65,536 buckets x 8 steps, {o} options",
               lambda o=o: gpu_batch(rows, 65536, 8, o)) for o in (4, 64)]
    print("\n| levels of | shape | cell-options | NumPy | " + " | ".join(f"fused, {n} thr." for n in threads)
          + f" | fused {threads[-1]} thr. / NumPy | bit-identical |")
    print("|---|---|---:|---:|" + "---:|" * len(threads) + "---:|:---:|")
    for name, make in cases:
        chunks = make()
        work = cell_options(chunks)
        r = replay(chunks, args.repeat, threads)
        rates = " | ".join(f"{work / r[n]:.3g}/s" for n in threads)
        print(f"| {name} | {shape(chunks)} | {work:.3g} | {work / r['numpy']:.3g}/s | {rates} "
              f"| {r['numpy'] / r[threads[-1]]:.1f}x | {'yes' if r['same'] else 'NO'} |", flush=True)


# ---------------------------------------------------------------- end to end, against a baseline

def digest(result) -> str:
    """A short fingerprint of a workload's answer (rankings: every slowest time; searches:
    splits and scores; sweeps: every row's counts, score and simulated time)."""
    import hashlib

    import numpy as np

    if hasattr(result, "slowest"):
        text = np.asarray(result.slowest).tobytes().hex()
    elif hasattr(result, "rows"):
        text = repr([(r["config"], r["counts"], r["score"], r["iteration_time"]) for r in result.rows])
    else:
        text = repr([(list(f[0]), f[1]) for f in result])
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def e2e_worker(names: list, repeat: int, quick: bool) -> dict:
    """Best-of-``repeat`` seconds of each workload with ``backend="auto"`` (after one warm-up
    run that also loads compiled code) and its answer's digest, in this process."""
    loads = workloads(quick)
    out = {}
    for name in names:
        answer = digest(loads[name]("auto"))
        out[name] = [best(lambda: loads[name]("auto"), repeat), answer]
    return out


def in_process(root: str, call: str) -> dict:
    """``call`` (an expression of this module) evaluated in a fresh process with ``root``'s gpuknap."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, HERE])}
    env.pop("GPUKNAP_BACKEND", None)
    # gpuknap is imported first, from root: the helper modules put this checkout on sys.path
    code = (f"import sys, json; sys.path[:0] = [{root!r}, {HERE!r}]; import gpuknap; import bench_engine as b; "
            f"out = {call}; assert gpuknap.__file__.startswith({root!r}), gpuknap.__file__; print(json.dumps(out))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=HERE)
    if p.returncode:
        raise SystemExit(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


class Baseline:
    """A temporary git worktree of ``rev`` (removed on exit)."""

    def __init__(self, rev: str):
        self.rev = rev

    def __enter__(self) -> str:
        self.tmp = tempfile.TemporaryDirectory()
        self.tree = os.path.join(self.tmp.name, "base")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", self.tree, self.rev], check=True)
        return self.tree

    def __exit__(self, *exc) -> None:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", self.tree], check=True)
        self.tmp.cleanup()


def e2e_part(args, base: str) -> None:
    names = [name for name in workloads(True) if (name in HEAVY) == args.heavy]
    rounds = {"before": [], "now": []}
    for r in range(args.rounds):  # alternate the two sides, each in fresh processes
        for side, root in (("before", base), ("now", ROOT)):
            rounds[side].append(in_process(root, f"b.e2e_worker({names!r}, {args.repeat}, {args.quick})"))
            print(f"  round {r + 1}/{args.rounds}, {side}: "
                  + ", ".join(f"{v[0]:.3f}" for v in rounds[side][-1].values()), file=sys.stderr, flush=True)
    print("\n| workload | before (s) | now (s) | speed-up | spread before | spread now | same answers |")
    print("|---|---:|---:|---:|---:|---:|:---:|")
    for name in names:
        b = [run[name][0] for run in rounds["before"]]
        n = [run[name][0] for run in rounds["now"]]
        same = len({run[name][1] for side in rounds.values() for run in side}) == 1
        print(f"| {name} | {min(b):.3f} | {min(n):.3f} | {min(b) / min(n):.2f}x | {max(b) / min(b):.2f} "
              f"| {max(n) / min(n):.2f} | {'yes' if same else 'NO'} |", flush=True)


# ---------------------------------------------------------------- memory of bulk ranking

def _rss(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def memory_worker(count: int, stages: int) -> dict:
    """Peak and kept bytes of ``model.rank`` of ``count`` splits of the Llama-2-70B example
    (bytes above what the process held with the splits made), in this process."""
    import gc

    from gpuknap.formats import load_spec

    spec = load_spec(os.path.join(ROOT, LLAMA))
    model = spec.model
    small = near_even(model.layers, stages, 1000, 30, seed=5)
    model.rank(small, spec.bucket, "numpy")  # imports, caches, fronts
    splits = near_even(model.layers, stages, count, 30, seed=5)
    gc.collect()
    base = _rss("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as fh:  # reset the peak (VmHWM) to the current RSS
            fh.write("5")
        resettable = True
    except OSError:
        resettable = False
    t0 = time.perf_counter()
    ranking = model.rank(splits, spec.bucket, "numpy")
    seconds = time.perf_counter() - t0
    _ = ranking.order
    gc.collect()
    return {"input": splits.nbytes, "peak": _rss("VmHWM") - base if resettable else None,
            "kept": _rss("VmRSS") - base, "seconds": seconds, "feasible": int((ranking.slowest < float("inf")).sum())}


def memory_part(args, base: str | None) -> None:
    sizes = [(1_000_000, 8), (1_000_000, 16), (4_000_000, 8), (4_000_000, 16)]
    if args.quick:
        sizes = [(200_000, 8), (200_000, 16)]
    sides = [("before", base), ("now", ROOT)] if base else [("now", ROOT)]
    print("\n| splits | stages | input (B/split) | side | peak (B/split) | peak / input | kept (B/split) "
          "| kept / input | rank (s) |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for count, stages in sizes:
        for side, root in sides:
            m = in_process(root, f"b.memory_worker({count}, {stages})")
            per = m["input"] / count
            peak = "-" if m["peak"] is None else f"{m['peak'] / count:.0f}"
            ratio = "-" if m["peak"] is None else f"{m['peak'] / m['input']:.2f}x"
            print(f"| {count:,} | {stages} | {per:.0f} | {side} | {peak} | {ratio} | {m['kept'] / count:.0f} "
                  f"| {m['kept'] / m['input']:.2f}x | {m['seconds']:.2f} |", flush=True)


def machine() -> str:
    import numpy as np

    model = cores = ""
    caches = []
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                model = value.strip()
            elif key.strip() in ("L1d cache", "L2 cache", "L3 cache"):
                caches.append(f"{key.strip().split()[0]} {value.strip()}")
    except OSError:
        pass
    cores = os.cpu_count()
    try:
        load = ", load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        load = ""
    return (f"# {model or platform.processor()}, {cores} cores ({'; '.join(caches)}){load}; python "
            f"{platform.python_version()}, numpy {np.__version__}; {time.strftime('%Y-%m-%d %H:%M')}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="levels,e2e,memory")
    ap.add_argument("--baseline", default=None, help="revision to compare against (default: merge-base with main)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N within a process")
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes per side, alternated (e2e)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--heavy", action="store_true", help="e2e: time the heavy sweeps (HEAVY) instead of the others")
    args = ap.parse_args()
    parts = args.part.split(",")
    print(machine())
    try:
        import numba
        print(f"# numba {numba.__version__}, threading layer {numba.config.THREADING_LAYER}, "
              f"{numba.config.NUMBA_NUM_THREADS} threads")
    except ImportError:
        print("# numba not installed: the fused pass cannot run here")
    if "levels" in parts:
        levels_part(args)
    if "e2e" in parts or "memory" in parts:
        rev = args.baseline or subprocess.run(["git", "-C", ROOT, "merge-base", "HEAD", "main"], capture_output=True,
                                              text=True, check=True).stdout.strip()
        print(f"\n# baseline {rev[:10]} (in a temporary git worktree), now: this checkout")
        with Baseline(rev) as base:
            if "e2e" in parts:
                e2e_part(args, base)
            if "memory" in parts:
                memory_part(args, base)


if __name__ == "__main__":
    main()
