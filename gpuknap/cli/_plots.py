"""Pictures: the best splits' stage chart, the schedule's Gantt chart, a stage's curve, the
scores of many splits, the sweep's heat maps (matplotlib, an optional extra)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..engine import MEGABYTE


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib (pip install 'gpuknap[plot]')") from None
    return plt


def require_matplotlib() -> None:
    """Raise ValueError now (before any work) if plots cannot be made."""
    _pyplot()


def _draw_splits(ax_t: Any, ax_m: Any, records: Sequence[dict]) -> None:
    """Per-stage time, and memory against budget, for each of the best splits."""
    width = 0.8 / max(len(records), 1)
    for i, rec in enumerate(records):
        xs = np.arange(len(rec["stages"])) + i * width
        ax_t.bar(xs, [r["time"] for r in rec["stages"]], width, label=f"#{i + 1} {rec['counts']}")
        ax_m.bar(xs, [r["memory_bytes"] / MEGABYTE for r in rec["stages"]], width)
        ax_m.scatter(xs, [r["budget_bytes"] / MEGABYTE for r in rec["stages"]], marker="_", color="k", s=80)
    ax_t.set_ylabel("stage time")
    ax_m.set_ylabel("memory (MiB); - budget")
    ax_m.set_xlabel("stage")
    ax_t.set_ylim(top=ax_t.get_ylim()[1] * (1.15 + 0.1 * len(records)))  # room for the legend above the bars
    ax_t.legend(fontsize=6, loc="upper right", ncol=1 if len(records) < 6 else 2)


def plot_splits(records: Sequence[dict], path: str) -> None:
    """Per-stage time, and memory against budget, for each of the best splits."""
    plt = _pyplot()
    fig, (ax_t, ax_m) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    _draw_splits(ax_t, ax_m, records)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_best(records: Sequence[dict], solved: Any, path: str, title: str) -> None:
    """``best --plot``: the best split's schedule as a Gantt chart (when ``solved``, from
    :func:`gpuknap.schedule.of_split`) above the per-stage time and memory of the splits found."""
    if solved is None:
        return plot_splits(records, path)
    plt = _pyplot()
    t, times = solved[0], solved[1]
    fig = plt.figure(figsize=(12, 0.45 * t.stages + 6.5))
    grid = fig.add_gridspec(3, 1, height_ratios=[0.45 * t.stages + 1.8, 2.2, 2.2])
    ax_g = fig.add_subplot(grid[0])
    _draw_timeline(plt, ax_g, t, times, title)
    ax_t = fig.add_subplot(grid[1])
    ax_m = fig.add_subplot(grid[2], sharex=ax_t)
    _draw_splits(ax_t, ax_m, records)
    ax_t.set_title("per-stage time and memory of the splits found", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curve(points: Sequence[dict], path: str, title: str, budget: float | None = None) -> None:
    """A stage's least time against its memory budget."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [p["budget_bytes"] / MEGABYTE for p in points if p["time"] is not None]
    ys = [p["time"] for p in points if p["time"] is not None]
    ax.step(xs, ys, where="post", marker=".")
    if budget is not None:
        ax.axvline(budget / MEGABYTE, color="k", linestyle=":", label="stage budget")
        ax.legend()
    ax.set_xlabel("memory budget (MiB)")
    ax.set_ylabel("least time")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_scores(slowest: np.ndarray, path: str, title: str, best: float | None = None) -> None:
    """The distribution of the feasible splits' slowest-stage times, the best marked."""
    plt = _pyplot()
    finite = slowest[np.isfinite(slowest)]
    fig, ax = plt.subplots(figsize=(7, 4))
    if len(finite):
        ax.hist(finite, bins=min(50, max(1, len(np.unique(finite)))), color="tab:blue")
    if best is not None:
        ax.axvline(best, color="k", linestyle=":", label=f"best {best:.6g}")
        ax.legend()
    ax.set_xlabel("slowest stage time (profile time units)")
    ax.set_ylabel("splits")
    infeasible = len(slowest) - len(finite)
    ax.set_title(f"{title}\n{len(slowest):,} splits scored: {len(finite):,} feasible"
                 + (f", {infeasible:,} infeasible (not shown)" if infeasible else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_timeline(t: Any, times: Any, path: str, title: str) -> None:
    """A Gantt chart: one row per stage, forward and backward boxes coloured by micro-batch,
    chunks told apart by shade and hatch, the recompute part of each backward hatched, idle
    time left white; iteration time and bubble in the title."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, 0.45 * t.stages + 1.8))
    _draw_timeline(plt, ax, t, times, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _draw_timeline(plt: Any, ax: Any, t: Any, times: Any, title: str) -> None:
    from matplotlib.patches import Patch

    cmap = plt.get_cmap("tab20")
    for op in t.ops:
        colour = cmap(op.micro_batch % 20)
        y = t.stages - 1 - op.stage
        light = op.kind == "F"
        ax.broken_barh([(op.start, op.end - op.start)], (y - 0.4, 0.8), facecolors=colour,
                       edgecolor="black", linewidth=0.3, alpha=0.55 if light else 1.0,
                       hatch="" if op.chunk % 2 == 0 else "..")
        rec = times.recompute[op.stage][op.chunk]
        if op.kind == "B" and rec > 0:
            ax.broken_barh([(op.start, rec)], (y - 0.4, 0.8), facecolors="none", edgecolor="black",
                           linewidth=0.0, hatch="////")
    ax.set_yticks(range(t.stages))
    ax.set_yticklabels([f"stage {s}" for s in range(t.stages - 1, -1, -1)])
    ax.set_xlim(0, t.iteration_time)
    ax.set_xlabel("time (profile time units)")
    ax.set_title(f"{title}\niteration time {t.iteration_time:.6g}, bubble {100 * t.bubble:.1f}%, "
                 f"{t.micro_batches} micro-batches" + (f", {t.chunks} chunks per stage" if t.chunks > 1 else ""),
                 fontsize=10)
    handles = [Patch(facecolor="0.6", alpha=0.55, edgecolor="black", label="forward (light)"),
               Patch(facecolor="0.6", edgecolor="black", label="backward (dark)"),
               Patch(facecolor="white", edgecolor="black", hatch="////", label="recompute in backward"),
               Patch(facecolor="white", label="idle (white)")]
    if t.chunks > 1:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="..", label="odd chunks (dotted)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.9 / (0.45 * t.stages + 1.8)),
              ncol=len(handles), fontsize=8, frameon=False)


def plot_sweep(rows: Sequence[dict], path: str, title: str) -> None:
    """Throughput of each configuration's best split as heat maps over stages x tensor-parallel
    size, one per micro-batch size (the best over interleaving in each cell); the best
    configuration boxed; grey where nothing fits or the configuration was not valid."""
    plt = _pyplot()
    feasible = [r for r in rows if r["feasible"] and r["rank"] == 1]
    tokens = bool(feasible) and all(r["throughput"]["tokens_per_second"] is not None for r in feasible)
    unit = "tokens/s" if tokens else "samples/s"
    value = (lambda r: r["throughput"]["tokens_per_second"]) if tokens else \
        (lambda r: r["throughput"]["samples_per_second"])
    configs = [r["config"] for r in rows]
    ps = sorted({c["stages"] for c in configs})
    tps = sorted({c["tensor_parallel"] for c in configs})
    mbss = sorted({c["micro_batch_size"] for c in configs})
    top = max((value(r) for r in feasible), default=1.0)
    fig, axes = plt.subplots(1, len(mbss), figsize=(0.75 * len(tps) * len(mbss) + 2.5, 0.5 * len(ps) + 2.6),
                             squeeze=False, constrained_layout=True)
    scale, suffix = (1e3, "k") if top >= 1e4 else (1.0, "")
    best = max(feasible, key=value, default=None)
    image = None
    for ax, mbs in zip(axes[0], mbss):
        grid = np.full((len(ps), len(tps)), np.nan)
        for r in feasible:
            c = r["config"]
            if c["micro_batch_size"] == mbs:
                i, j = ps.index(c["stages"]), tps.index(c["tensor_parallel"])
                grid[i, j] = np.nanmax([grid[i, j], value(r)])
        cmap = plt.get_cmap("viridis").copy()
        cmap.set_bad("0.85")
        image = ax.imshow(grid, cmap=cmap, vmin=0, vmax=top, aspect="auto", origin="lower")
        for i in range(len(ps)):
            for j in range(len(tps)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j] / scale:.0f}{suffix}" if scale > 1 else f"{grid[i, j]:.3g}",
                            ha="center", va="center", fontsize=7,
                            color="white" if grid[i, j] < 0.6 * top else "black")
        if best is not None and best["config"]["micro_batch_size"] == mbs:
            i, j = ps.index(best["config"]["stages"]), tps.index(best["config"]["tensor_parallel"])
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
        ax.set_xticks(range(len(tps)))
        ax.set_xticklabels(tps)
        ax.set_yticks(range(len(ps)))
        ax.set_yticklabels(ps)
        ax.set_xlabel("tensor-parallel size")
        if ax is axes[0][0]:
            ax.set_ylabel("pipeline stages")
        ax.set_title(f"micro-batch size {mbs}", fontsize=9)
    fig.colorbar(image, ax=axes[0].tolist(), label=f"throughput ({unit}, whole cluster)")
    chosen = "" if best is None else f"\nbest (red box): P={best['config']['stages']}, " \
        f"TP={best['config']['tensor_parallel']}, mbs={best['config']['micro_batch_size']}, " \
        f"v={best['config']['interleave']}: {value(best):,.0f} {unit}"
    fig.suptitle(f"{title}{chosen}\ngrey: nothing fits, or not a valid configuration", fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
