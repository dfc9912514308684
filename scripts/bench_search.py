"""Benchmark (issue 10): whole-model search at scale, this checkout against a baseline revision.

Usage: python scripts/bench_search.py [--baseline REV] [--skip-baseline]

Runs the same measurements on this checkout and (in a temporary git worktree)
on the baseline revision, one after the other in one run, and prints markdown
tables.  Models: scripts/_scale.py (a Llama-2-70B-like body kind with N
options, HEAD and TAIL, M = 2P, 80 GiB devices, 4 GiB reserved), the demo
profile, and the shipped Llama-2-70B spec.  NumPy backend, 1 MiB buckets.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def timed(fn, repeat):
    from bench_model import timed as best_of
    return best_of(fn, repeat)


def worker() -> dict:
    """All measurements with whichever gpuknap is first on sys.path."""
    import numpy as np
    from _demo import demo_model, random_splits
    from _scale import CASES, scale_model

    from gpuknap import best_splits, rank
    try:
        from gpuknap import load_spec
    except ImportError:  # a baseline revision from before the package layout
        from gpuknap.formats import load_spec

    out: dict = {"rows": [], "top": {}, "rank": None}
    for layers, options, stages, capacity in CASES:
        model = scale_model(layers, options, stages, capacity)
        row = {"case": [layers, options, stages, capacity / 2**30]}
        for score in ("slowest", "1f1b"):
            try:
                t, found = timed(lambda: best_splits(model, stages, 1, score, 2**20, backend="numpy"),
                                 5 if layers <= 200 else 1)
                row[score] = [t, found[0][1] if found else None]
            except ValueError as exc:  # a search the revision refuses
                row[score] = [None, str(exc)[:60]]
        out["rows"].append(row)
    demo = demo_model()
    for score in ("slowest", "1f1b"):
        t, found = timed(lambda: best_splits(demo, 16, 1000, score, 2**20, backend="numpy"), 1)
        out["top"][score] = [t, len(found)]
    spec = load_spec(os.path.join(ROOT, "gpuknap", "examples", "llama2_70b.json"))
    splits = random_splits(spec.model, 8, 100_000, seed=3)
    cands = [spec.model.stages(r) for r in splits.tolist()]
    t, r = timed(lambda: rank(cands, spec.model.fronts, spec.bucket, backend="numpy"), 3)
    out["rank"] = [t, int(np.isfinite(r.slowest).sum())]
    return out


def highs(cases) -> list:
    from _scale import scale_model
    from bench_model import milp_slowest

    out = []
    for layers, options, stages, capacity in cases:
        model = scale_model(layers, options, stages, capacity)
        t = min(milp_slowest(model, stages, 60)[0] for _ in range(3))
        res = milp_slowest(model, stages, 60)[1]
        out.append([t, res.fun if res.x is not None else None])
    return out


def infeasible_ms() -> list:
    from _scale import CASES, scale_model

    from gpuknap import best_splits

    out = []
    for layers, options, stages, capacity in CASES:
        model = scale_model(layers, options, stages, capacity)
        t, found = timed(lambda: best_splits(model, stages, 1, "slowest", 2**20, backend="numpy"), 1)
        if not found:
            out.append([layers, options, stages, t])
    return out


def run_worker(root: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, HERE])}
    # gpuknap first, from root: _demo and _scale put this checkout on sys.path when imported
    code = ("import sys, json; sys.path[:0] = [%r, %r]; import gpuknap; import bench_search; "
            "out = bench_search.worker(); assert gpuknap.__file__.startswith(%r), gpuknap.__file__; "
            "print(json.dumps(out))" % (root, HERE, root))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=HERE)
    if p.returncode:
        raise SystemExit(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def fmt(cell) -> str:
    t, value = cell
    return "refused" if t is None else t if isinstance(t, str) else f"{t:.2g}" if t < 0.1 else f"{t:.2f}"


#: Models of the backend table: the scale models of the table above on devices small enough
#: that their stages need the DP (at 80 GiB every stage fits its fastest options, so a
#: comparison of backends there would compare no DP at all).
DP_CASES = [(96, 4, 16, 12), (200, 16, 32, 24), (400, 16, 32, 40), (400, 64, 64, 32), (1000, 16, 64, 40)]


def backend_rows(backends: list[str], rows: int) -> None:
    """The first ``rows`` models of :data:`DP_CASES` on each backend: time, the same optimum,
    and the DP each search did (knapsacks and cells: never zero)."""
    sys.path[:0] = [ROOT, HERE]
    from _scale import GIB, scale_model

    import gpuknap.engine._solve as engine
    from gpuknap import best_splits

    print("\n| L | options | P | capacity (GiB) | knapsacks | DP cells | "
          + " | ".join(f"{b}: slowest (s) | {b}: 1f1b (s)" for b in backends) + " | same answers |")
    print("|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * len(backends) + ":---:|")
    for layers, options, stages, capacity in DP_CASES[:rows]:
        model = scale_model(layers, options, stages, capacity * GIB)
        seen = [0, 0]
        real = engine.build_chunk

        def counting(entries, table):
            chunk = real(entries, table)
            seen[0] += sum(len(reads) for _, reads in entries)
            seen[1] += chunk.cells
            return chunk

        engine.build_chunk = counting
        try:
            best_splits(model, stages, 1, "1f1b", 2**20, backend="numpy")
        finally:
            engine.build_chunk = real
        if not seen[0]:
            raise SystemExit(f"L={layers}, {options} options: no DP at {capacity} GiB, nothing to compare")
        cells, answers = [], []
        for b in backends:
            for score in ("slowest", "1f1b"):
                best_splits(model, stages, 1, score, 2**20, backend=b)  # warm-up (kernel compile)
                t, found = timed(lambda: best_splits(model, stages, 1, score, 2**20, backend=b), 2)
                cells.append(f"{t:.3f}")
                answers.append((score, [(c, v) for c, v, _ in found]))
        same = all(a == answers[i % 2] for i, a in enumerate(answers))
        print(f"| {layers} | {options} | {stages} | {capacity} | {seen[0]:,} | {seen[1]:.3g} | " + " | ".join(cells)
              + f" | {'yes' if same else 'NO'} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="3c80c4f", help="revision to compare against (default: before issue 10)")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--backends", help="comma-separated backends: the first --rows models of DP_CASES on each")
    ap.add_argument("--rows", type=int, default=4)
    args = ap.parse_args()
    import numpy as np
    print(f"# {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, numpy {np.__version__}, "
          f"{time.strftime('%Y-%m-%d')}")
    if args.backends:
        backend_rows(args.backends.split(","), args.rows)
        return
    now = run_worker(ROOT)
    base = None
    if not args.skip_baseline:
        with tempfile.TemporaryDirectory() as tmp:
            tree = os.path.join(tmp, "base")
            subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", tree, args.baseline], check=True)
            try:
                base = run_worker(tree)
            finally:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], check=True)
    print("\n| L | options | P | capacity (GiB) | slowest: before | slowest: now | 1f1b: before | 1f1b: now "
          "| 1f1b / slowest now | same optimum |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for i, row in enumerate(now["rows"]):
        b = base["rows"][i] if base else {"slowest": ["-", None], "1f1b": ["-", None]}
        L, n, p, cap = row["case"]
        ratio = row["1f1b"][0] / row["slowest"][0] if row["slowest"][0] else float("nan")
        same = all(b[s][0] is None or b[s][0] == "-" or b[s][1] == row[s][1] for s in ("slowest", "1f1b"))
        print(f"| {L} | {n} | {p} | {cap:g} | {fmt(b['slowest'])} | {fmt(row['slowest'])} | {fmt(b['1f1b'])} "
              f"| {fmt(row['1f1b'])} | {ratio:.2f} | {'yes' if same else 'NO'} |", flush=True)
    sys.path[:0] = [ROOT, HERE]
    h = highs([c for c in __import__("_scale").CASES[:2]])
    print("\n| homogeneous case | HiGHS MILP, exact bytes (s) | its optimum | gpuknap slowest (s) | its optimum "
          "| HiGHS / gpuknap |")
    print("|---|---:|---:|---:|---:|---:|")
    for (t, fun), row in zip(h, now["rows"][:2]):
        print(f"| L={row['case'][0]}, {row['case'][1]} options, P={row['case'][2]} | {t:.4f} | {fun:.6g} "
              f"| {row['slowest'][0]:.4f} | {row['slowest'][1]:.6g} | {t / row['slowest'][0]:.1f}x |")
    print("\nInfeasible models (time to say so):",
          ", ".join(f"L={L}, P={p}: {t * 1e3:.1f} ms" for L, _, p, t in infeasible_ms()))
    for score in ("slowest", "1f1b"):
        before = f"{base['top'][score][0]:.2f} s" if base else "-"
        print(f"\nbest_splits(demo, 16 stages, top=1000, {score}): before {before}, now {now['top'][score][0]:.2f} s")
    before = f"{base['rank'][0]:.3f} s" if base else "-"
    print(f"\nrank of 100,000 Stage lists (Llama-2-70B spec, 8 stages): before {before}, now {now['rank'][0]:.3f} s")


if __name__ == "__main__":
    main()
