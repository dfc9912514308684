"""GPU benchmark (issues 3 and 24): what a roofline of the min-plus kernel needs.

Usage: python scripts/bench_gpu.py [--quick] [--numpy-only] [--reps N]

1. The device and its measured device-to-device copy rate (bytes read plus
   bytes written per second, CUDA events around a ``cudaMemcpyAsync``): the
   roofline's peak, measured rather than the data sheet's.
2. Synthetic batches at 4 and 64 options, every row a chain of knapsack layers
   (real DP): kernel-only time (CUDA events around back-to-back launches of each
   level's kernel, divided by the launches), achieved GB/s at 16 bytes per cell
   (a read of the previous level and a write) and its share of the measured
   copy peak, cell-options per second; the engine's host-inclusive time beside
   it (uploads, launches, readouts); the CPU pass on the same batch for scale.
   Results are checked bit for bit against the CPU.
3. Real level shapes: the DP batches of the sweep at 1 MiB (``bench_sweep.py``'s
   grid), cut as the CPU cuts them (128 MiB chunks: a median of 4 rows x 58k
   buckets over thousands of levels) and as the GPU backend plans them (one
   chunk per batch): kernel-only against host-inclusive time, and whether
   launches dominate.
4. The sweep at 1 MiB end to end on the CPU and on CuPy, rows identical.

Every row is printed as soon as it is measured.  Without CuPy (or with
``--numpy-only``) only the CPU columns are measured.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from gpuknap import LayerOption  # noqa: E402
from gpuknap.engine import FrontTable, cupy_available, get_backend, numba_available  # noqa: E402
from gpuknap.engine._backend import NUMPY  # noqa: E402
from gpuknap.engine._batch import Knapsack, build_chunk, plan_chunks  # noqa: E402
from gpuknap.engine._solve import _upload, run_chunk  # noqa: E402

BYTES_PER_CELL = 16
#: Synthetic batches ``(rows, buckets, steps, options)``: full run, then ``--quick``.
SYNTHETIC = [(4096, 65536, 12, 4), (1024, 65536, 24, 4), (512, 65536, 24, 64)]
SYNTHETIC_QUICK = [(256, 65536, 8, 4), (64, 65536, 8, 64)]
#: Bytes the copy rate is measured on: full run, then ``--quick``.
COPY_BYTES, COPY_BYTES_QUICK = 4 * 2**30, 2**30


def sweep_grid(quick: bool) -> dict:
    """The sweep's grid (bench_sweep.py's); ``quick``: the first two values of each axis."""
    from bench_sweep import GRID

    return {k: v[:2] for k, v in GRID.items()} if quick else GRID


def make_batch(rows, buckets, steps, options, seed=0):
    """``rows`` distinct chains of ``steps`` layers, each of its own kind with ``options`` options."""
    rng = np.random.default_rng(seed)
    fronts = {}
    for r in range(rows):
        mem = np.sort(rng.integers(1, max(2, 2 * buckets // steps), options))
        times = np.sort(rng.uniform(1, 10, options))[::-1]
        fronts[r] = [LayerOption(f"o{j}", float(m), float(t), 0.0) for j, (m, t) in enumerate(zip(mem, times))]
    table = FrontTable(fronts, 1.0)
    problems = [Knapsack((((r, 1), steps),), buckets - 1, r) for r in range(rows)]
    return table, problems


def cell_options(chunks) -> tuple[int, int]:
    cells = work = 0
    for chunk in chunks:
        for lv in chunk.levels:
            cells += lv.rows * lv.width
            for seg in lv.segments:
                work += (seg.stop - seg.start) * lv.width * int((seg.weights < lv.width).sum())
    return cells, work


def copy_peak(cp, nbytes: int, reps: int = 5) -> float:
    """Measured device-to-device copy rate, bytes read + written per second."""
    src = cp.ones(nbytes // 8)
    dst = cp.empty_like(src)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    best = float("inf")
    for _ in range(reps):
        start.record()
        dst.data.copy_from_device_async(src.data, src.nbytes)
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) / 1e3)
    return 2 * src.nbytes / best


def kernel_seconds(backend, chunks, reps: int) -> tuple[float, int]:
    """Kernel-only seconds of every level of ``chunks`` on the CuPy backend: CUDA events
    around ``reps`` back-to-back launches of each level's kernel (with its buffers made
    beforehand), divided by ``reps``; and the number of levels."""
    from gpuknap.engine._kernels import MAX_GRID_Y, THREADS, _kernel

    cp = backend.xp
    kernel = _kernel(cp)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    total, levels = 0.0, 0
    for chunk in chunks:
        prev = cp.zeros((1, chunk.root_width))
        for lv, (parent, (w, t), _, _) in zip(chunk.levels, _upload(backend, chunk)):
            out = cp.empty((lv.rows, lv.width))
            grid = ((lv.width + THREADS - 1) // THREADS, min(lv.rows, MAX_GRID_Y))
            args = (prev, cp.int64(prev.shape[1]), parent, w, t, cp.int32(w.shape[1]), out, cp.int64(lv.rows),
                    cp.int64(lv.width))
            kernel(grid, (THREADS,), args)  # the level's real input for the next one
            start.record()
            for _ in range(reps):
                kernel(grid, (THREADS,), args)
            end.record()
            end.synchronize()
            total += cp.cuda.get_elapsed_time(start, end) / 1e3 / reps
            levels += 1
            prev = out
    return total, levels


def host_seconds(backend, chunks, repeat: int = 2):
    """Host-inclusive seconds of the engine on ``chunks`` (uploads, launches, readouts
    back on the host), best of ``repeat``, and the readouts."""
    best, out = float("inf"), None
    for _ in range(repeat):
        if backend.is_gpu:
            backend.xp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = [run_chunk(backend, c) for c in chunks]
        if backend.is_gpu:
            backend.xp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - t0)
    return best, out


def cpu_seconds(chunks, repeat: int = 1):
    """The CPU pass on ``chunks``: the fused pass where Numba runs, else NumPy's."""
    ok, _ = numba_available()
    if ok:
        cpu = get_backend("numba").fused(0)
        space = cpu.Workspace()
        best, out = float("inf"), None
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = [cpu.run_chunk(c, None, space) for c in chunks]
            best = min(best, time.perf_counter() - t0)
        return "fused CPU", best, out
    t, out = host_seconds(NUMPY, chunks, repeat)
    return "NumPy", t, out


def synthetic_rows(args, gpu, peak) -> None:
    shapes = SYNTHETIC_QUICK if args.quick else SYNTHETIC
    print("\n## Synthetic batches (every row a knapsack chain)\n")
    print("| rows | buckets | options | steps | cell-options | CPU pass (s) | kernel-only (s) | achieved GB/s "
          "| % of copy peak | cell-options/s | host-inclusive (s) | kernel / host | bit-identical |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for rows, buckets, steps, options in shapes:
        table, problems = make_batch(rows, buckets, steps, options)
        chunks = [build_chunk(e, table) for e in plan_chunks(problems, 2**62, 1.0)]
        cells, work = cell_options(chunks)
        name, t_cpu, ref = cpu_seconds(chunks)
        cols = ["-"] * 7
        if gpu is not None:
            run_chunk(gpu, chunks[0])  # compile and warm up
            t_k, _ = kernel_seconds(gpu, chunks, args.reps)
            t_h, got = host_seconds(gpu, chunks)
            same = all(np.array_equal(a, b) for a, b in zip(got, ref))
            gbs = cells * BYTES_PER_CELL / t_k
            cols = [f"{t_k:.4f}", f"{gbs / 1e9:,.0f}", f"{100 * gbs / peak:.0f}", f"{work / t_k:.3g}",
                    f"{t_h:.4f}", f"{t_k / t_h:.0%}", "yes" if same else "NO"]
        print(f"| {rows:,} | {buckets:,} | {options} | {steps} | {work:.3g} | {t_cpu:.3f} ({name}) | "
              + " | ".join(cols) + " |", flush=True)


def sweep_batches(quick: bool, backend: str) -> list:
    """The chunks of every DP batch of the sweep at 1 MiB as ``backend`` plans them."""
    from bench_engine import capture
    from bench_sweep import BATCH, GPUS, LLAMA

    from gpuknap import MEGABYTE, sweep

    grid = sweep_grid(quick)
    return capture(lambda b: sweep(LLAMA, grid, gpus=GPUS, global_batch=BATCH, backend=b, bucket=MEGABYTE), backend)


def replay_rows(args, gpu, peak) -> None:
    print("\n## Real level shapes: the sweep at 1 MiB\n")
    print("| cut as | levels | median rows x buckets | cell-options | CPU pass (s) | kernel-only (s) | achieved GB/s "
          "| % of copy peak | host-inclusive (s) | levels per host second | launches dominate |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|:---:|")
    plans = [("the CPU (128 MiB chunks)", "numpy")] + ([("the GPU (one chunk per batch)", "cupy")] if gpu else [])
    for label, backend in plans:
        chunks = sweep_batches(args.quick, backend)
        levels = [lv for c in chunks for lv in c.levels]
        if not levels:
            print(f"| {label} | 0 | - | 0 | (no stage of this grid needs the DP) |", flush=True)
            continue
        cells, work = cell_options(chunks)
        shape = (f"{int(np.median([lv.rows for lv in levels]))} x "
                 f"{int(np.median([lv.width for lv in levels])):,}")
        name, t_cpu, ref = cpu_seconds(chunks)
        cols = ["-"] * 6
        if gpu is not None:
            t_k, n = kernel_seconds(gpu, chunks, args.reps)
            t_h, got = host_seconds(gpu, chunks)
            if not all(np.array_equal(a, b) for a, b in zip(got, ref)):
                raise SystemExit("CuPy readouts differ from the CPU's")
            gbs = cells * BYTES_PER_CELL / t_k
            cols = [f"{t_k:.4f}", f"{gbs / 1e9:,.0f}", f"{100 * gbs / peak:.0f}", f"{t_h:.4f}", f"{n / t_h:,.0f}",
                    "yes" if t_h > 2 * t_k else "no"]
        print(f"| {label} | {len(levels):,} | {shape} | {work:.3g} | {t_cpu:.3f} ({name}) | " + " | ".join(cols)
              + " |", flush=True)
    if gpu is not None:
        print("\n(launches dominate: the host-inclusive time is more than twice the kernels' own; the GPU backend "
              "then gains from fewer, larger levels, which is why it plans one chunk per batch)")


def sweep_rows(args, gpu) -> None:
    """The sweep at 1 MiB end to end, once on the CPU's best backend and once on CuPy: same rows."""
    from bench_sweep import BATCH, GPUS, LLAMA

    from gpuknap import MEGABYTE, sweep

    grid = sweep_grid(args.quick)
    cpu = "numba" if numba_available()[0] else "numpy"
    print("\n## The sweep at 1 MiB end to end\n")
    print("| backend | configurations | seconds | rows identical to the CPU's |")
    print("|---|---:|---:|:---:|")
    want = None
    for backend in [cpu] + (["cupy"] if gpu is not None else []):
        sweep(LLAMA, {k: v[:1] for k, v in grid.items()}, gpus=GPUS, global_batch=BATCH, backend=backend,
              bucket=MEGABYTE)  # compile and warm up
        t0 = time.perf_counter()
        got = sweep(LLAMA, grid, gpus=GPUS, global_batch=BATCH, backend=backend, bucket=MEGABYTE)
        seconds = time.perf_counter() - t0
        want = got.rows if want is None else want
        print(f"| {backend} | {len(got.rows)} | {seconds:.2f} | {'yes' if got.rows == want else 'NO'} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller batches and grid (about a minute on a GPU)")
    ap.add_argument("--numpy-only", action="store_true", help="CPU columns only")
    ap.add_argument("--reps", type=int, default=5, help="back-to-back launches per level for kernel-only time")
    ap.add_argument("--part", default="synthetic,replay,sweep")
    args = ap.parse_args()
    ok, why = cupy_available()
    gpu = get_backend("cupy") if ok and not args.numpy_only else None
    print(f"# {platform.node()} {platform.machine()}, {os.cpu_count()} CPU cores; numpy {np.__version__}; "
          f"cupy: {'yes' if ok else why}; numba: {numba_available()[0]}; {time.strftime('%Y-%m-%d %H:%M')}")
    peak = float("nan")
    if gpu is not None:
        cp = gpu.xp
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        peak = copy_peak(cp, COPY_BYTES_QUICK if args.quick else COPY_BYTES)
        print(f"# device {name}; measured device-to-device copy: {peak / 1e9:,.0f} GB/s (read + write), "
              "the peak every '% of copy peak' below is against", flush=True)
    if "synthetic" in args.part:
        synthetic_rows(args, gpu, peak)
    if "replay" in args.part:
        replay_rows(args, gpu, peak)
    if "sweep" in args.part:
        sweep_rows(args, gpu)


if __name__ == "__main__":
    main()
