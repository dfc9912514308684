"""Pictures a user reads at a glance: the best split (its schedule over where each stage's memory
and time go), a stage's time against its memory budget, the scores of many splits, and the
sweep's heat maps (matplotlib, an optional extra).  Each ``*_figure`` function builds the figure
(the tests read its texts); each ``plot_*`` saves it and closes it.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import _gantt

GIB = 2**30
MEMORY = (("static_bytes", "weights, gradients, optimizer", "#6baed6"),
          ("activation_bytes", "activations", "#fd8d3c"), ("logits_bytes", "fp32 logits", "#e6550d"),
          ("reserved_bytes", "reserved", "#bdbdbd"))
TIME = (("compute", "compute", "#3182bd"), ("recompute", "recompute", "#fd8d3c"),
        (("tp", "cp", "ep", "p2p"), "communication (TP, CP, EP, p2p)", "#737373"),
        ("dp", "data-parallel tail and optimizer", "#9e9ac8"), ("bubble", "bubble", "#d9d9d9"))


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


def _save(plt: Any, fig: Any, path: str) -> None:
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _stages(ax_m: Any, ax_t: Any, record: dict) -> None:
    """The best split per stage: stacked memory against the device's capacity, and stacked time
    (where it goes, for cost-modelled models; the stage's time otherwise)."""
    rows = record["stages"]
    xs = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for key, label, colour in MEMORY:
        values = np.array([r[key] / GIB for r in rows])
        if values.any():
            ax_m.bar(xs, values, 0.7, bottom=bottom, color=colour, label=label)
            bottom += values
    ax_m.axhline(rows[0]["capacity_bytes"] / GIB, color="black", linestyle="--", linewidth=1, label="device capacity")
    ax_m.set_ylabel("memory (GiB)")
    ax_m.set_ylim(0, rows[0]["capacity_bytes"] / GIB * 1.12)
    ax_m.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    breakdown = [r.get("breakdown") for r in rows]
    bottom = np.zeros(len(rows))
    if all(b is not None for b in breakdown):
        for keys, label, colour in TIME:
            keys = keys if isinstance(keys, tuple) else (keys,)
            values = np.array([sum(b.get(k, 0.0) for k in keys) for b in breakdown])
            if values.any():
                ax_t.bar(xs, values, 0.7, bottom=bottom, color=colour, label=label)
                bottom += values
        ax_t.set_ylabel("time per iteration (s)")
        ax_t.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    else:
        ax_t.bar(xs, [r["time"] for r in rows], 0.7, color=TIME[0][2], label="stage time")
        ax_t.set_ylabel("stage time (profile time units)")
    slowest = [s for s, r in enumerate(rows) if r["slowest"]]
    for s in slowest:
        ax_t.annotate("*", (s, ax_t.get_ylim()[1] * 0.98), ha="center", va="top", fontsize=12)
    for ax in (ax_m, ax_t):
        ax.set_xticks(xs)
        ax.set_xticklabels([str(s) for s in xs])
        ax.set_xlim(-0.6, len(rows) - 0.4)
    ax_t.set_xlabel("stage (* the slowest)")


def best_figure(records: Sequence[dict], solved: Any, title: str, comm: Sequence | None = None) -> Any:
    """``best --plot``: the best split's schedule (when ``solved``, from
    :func:`gpuknap.schedule.of_split`) over its stages' memory and time."""
    plt = _pyplot()
    record = records[0]
    analytic = record.get("iteration_time_s") is not None
    if solved is None:
        fig, (ax_m, ax_t) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
        _stages(ax_m, ax_t, record)
        fig.suptitle(title, fontsize=10)
        fig.subplots_adjust(left=0.08, right=0.74, top=0.9, hspace=0.12)
        return fig
    t, times = solved[0], solved[1]
    unit = _gantt.time_unit(analytic, t.iteration_time)
    spans = _gantt.windows(t)
    fig = plt.figure(figsize=(13, 0.36 * t.stages + 6.0))
    grid = fig.add_gridspec(3, 1, height_ratios=[0.36 * t.stages + 1.0, 2.0, 2.0], hspace=0.38)
    top = grid[0].subgridspec(1, len(spans), wspace=0.04)
    axes = [fig.add_subplot(top[0, i]) for i in range(len(spans))]
    _gantt.draw(plt, axes, t, times, comm, unit, title)
    ax_m = fig.add_subplot(grid[1])
    ax_t = fig.add_subplot(grid[2], sharex=ax_m)
    _stages(ax_m, ax_t, record)
    ax_m.set_title("the best split per stage: memory against the device, and where each stage's time goes",
                   fontsize=9)
    fig.subplots_adjust(left=0.08, right=0.78, top=0.9, bottom=0.07)
    return fig


def plot_best(records: Sequence[dict], solved: Any, path: str, title: str, comm: Sequence | None = None) -> None:
    plt = _pyplot()
    _save(plt, best_figure(records, solved, title, comm), path)


def timeline_figure(t: Any, times: Any, title: str, analytic: bool, comm: Sequence | None = None) -> Any:
    """``timeline --plot``: the schedule alone."""
    return _gantt.figure(_pyplot(), t, times, comm, _gantt.time_unit(analytic, t.iteration_time), title)


def plot_timeline(t: Any, times: Any, path: str, title: str, analytic: bool = False,
                  comm: Sequence | None = None) -> None:
    plt = _pyplot()
    _save(plt, timeline_figure(t, times, title, analytic, comm), path)


def curve_figure(points: Sequence[dict], title: str, budget: float | None, analytic: bool) -> Any:
    """``curve --plot``: a stage's least time against its memory budget."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    xs = [p["budget_bytes"] / GIB for p in points if p["time"] is not None]
    ys = [p["time"] for p in points if p["time"] is not None]
    ax.step(xs, ys, where="post", marker=".", label="least time within the budget")
    if budget is not None:
        ax.axvline(budget / GIB, color="k", linestyle=":", label=f"the stage's budget ({budget / GIB:.1f} GiB)")
    ax.legend(fontsize=8)
    ax.set_xlabel("memory budget for activations (GiB)")
    ax.set_ylabel("least stage time (ms)" if analytic else "least stage time (profile time units)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_curve(points: Sequence[dict], path: str, title: str, budget: float | None = None,
               analytic: bool = False) -> None:
    plt = _pyplot()
    _save(plt, curve_figure(points, title, budget, analytic), path)


def scores_figure(slowest: np.ndarray, title: str, best: float | None, analytic: bool) -> Any:
    """``rank --plot``: the distribution of the feasible splits' slowest-stage times, the best marked."""
    plt = _pyplot()
    finite = slowest[np.isfinite(slowest)]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    if len(finite):
        ax.hist(finite, bins=min(50, max(1, len(np.unique(finite)))), color="#3182bd")
    if best is not None:
        ax.axvline(best, color="k", linestyle=":", label=f"best {best:.6g}")
        ax.legend(fontsize=8)
    ax.set_xlabel("slowest stage time (ms)" if analytic else "slowest stage time (profile time units)")
    ax.set_ylabel("splits")
    infeasible = len(slowest) - len(finite)
    ax.set_title(f"{title}\n{len(slowest):,} splits scored: {len(finite):,} feasible"
                 + (f", {infeasible:,} infeasible (not shown)" if infeasible else ""), fontsize=10)
    fig.tight_layout()
    return fig


def plot_scores(slowest: np.ndarray, path: str, title: str, best: float | None = None,
                analytic: bool = False) -> None:
    plt = _pyplot()
    _save(plt, scores_figure(slowest, title, best, analytic), path)


def _heat(plt: Any, fig: Any, rows: Sequence[dict], skipped: Sequence[dict]) -> str:
    """Heat maps of throughput over stages x tensor-parallel size, one per micro-batch size, drawn
    into ``fig`` (a figure or subfigure); returns the line naming the best configuration."""
    feasible = [r for r in rows if r["feasible"] and r["rank"] == 1]
    tokens = bool(feasible) and all(r["throughput"]["tokens_per_second"] is not None for r in feasible)
    unit = "tokens/s" if tokens else "samples/s"
    value = (lambda r: r["throughput"]["tokens_per_second"]) if tokens else \
        (lambda r: r["throughput"]["samples_per_second"])
    configs = [r["config"] for r in rows] + [s["config"] for s in skipped]
    ps = sorted({c["stages"] for c in configs})
    tps = sorted({c["tensor_parallel"] for c in configs})
    mbss = sorted({c["micro_batch_size"] for c in configs})
    speeds = [value(r) for r in feasible]
    low, high = (min(speeds), max(speeds)) if speeds else (0.0, 1.0)
    if high <= low:
        low, high = low * 0.99, high * 1.01 + 1e-9
    axes = fig.subplots(1, len(mbss), squeeze=False)
    best = max(feasible, key=value, default=None)
    image = None
    for ax, mbs in zip(axes[0], mbss):
        grid = np.full((len(ps), len(tps)), np.nan)
        state = np.zeros((len(ps), len(tps)), dtype=int)  # 0 absent, 1 invalid, 2 does not fit, 3 runs
        for s in skipped:
            c = s["config"]
            if c["micro_batch_size"] == mbs:
                state[ps.index(c["stages"]), tps.index(c["tensor_parallel"])] |= 1
        for r in rows:
            c = r["config"]
            if c["micro_batch_size"] == mbs:
                i, j = ps.index(c["stages"]), tps.index(c["tensor_parallel"])
                if r["feasible"]:
                    grid[i, j] = np.nanmax([grid[i, j], value(r)])
                    state[i, j] = 3
                elif state[i, j] != 3:
                    state[i, j] = 2
        cmap = plt.get_cmap("viridis").with_extremes(bad="white")
        image = ax.imshow(grid, cmap=cmap, vmin=low, vmax=high, aspect="auto", origin="lower")
        for i in range(len(ps)):
            for j in range(len(tps)):
                if state[i, j] == 3:
                    v = grid[i, j]
                    text = f"{v / 1e3:.0f}k" if high >= 1e4 else f"{v:.3g}"
                    ax.text(j, i, text, ha="center", va="center", fontsize=7,
                            color="white" if v < low + 0.6 * (high - low) else "black")
                elif state[i, j] == 2:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, color="#fcbba1"))
                    ax.text(j, i, "OOM", ha="center", va="center", fontsize=7, color="#a50f15")
                elif state[i, j] == 1:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, color="#eeeeee"))
                    ax.text(j, i, "x", ha="center", va="center", fontsize=9, color="#636363")
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
    chosen = ""
    if best is not None:
        c = best["config"]
        mfu = "" if best.get("mfu") is None else f", MFU {100 * best['mfu']:.1f}%"
        chosen = (f"\nbest (red box): P={c['stages']} TP={c['tensor_parallel']} mbs={c['micro_batch_size']}"
                  + "".join(f" {k}={c[key]}" for k, key in (("v", "interleave"), ("EP", "expert_parallel"),
                                                            ("CP", "context_parallel")) if c.get(key, 1) > 1)
                  + f": {value(best):,.0f} {unit}{mfu}")
    fig.suptitle("x: not a valid configuration   OOM: does not fit the device memory   (each cell: the best "
                 "over the other grid keys)", fontsize=8)
    return chosen



#: The parts of a row's time, as the cost model names them (``breakdown``), and their colours.
PARTS = (("compute", "compute", "#3182bd"), ("recompute", "recompute", "#fd8d3c"), ("tp", "TP", "#636363"),
         ("cp", "CP", "#969696"), ("ep", "EP all-to-all", "#31a354"), ("p2p", "p2p", "#bcbddc"),
         ("dp", "DP exposed + optimizer", "#9e9ac8"), ("bubble", "bubble", "#e0e0e0"))


def _label(c: dict) -> str:
    extra = "".join(f" {k}={c[key]}" for k, key in (("CP", "context_parallel"), ("EP", "expert_parallel"),
                                                     ("ETP", "expert_tensor_parallel"), ("v", "interleave"))
                    if c.get(key) not in (None, 1))
    device = f" {c['device']}" if c.get("device") else ""
    return f"P={c['stages']} TP={c['tensor_parallel']}{extra} mbs={c['micro_batch_size']}{device}"


def _bars(fig: Any, rows: Sequence[dict], count: int) -> None:
    """Horizontal bars of the ``count`` best rows, best on top: the busiest stage's time split into
    its parts (seconds) when the rows are cost-modelled, else the iteration time alone."""
    shown = [r for r in rows if r["feasible"]][:count]
    ax = fig.subplots()
    if not shown:
        ax.text(0.5, 0.5, "no configuration fits", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    y = np.arange(len(shown))[::-1]
    modelled = all(r.get("breakdown") for r in shown)
    if modelled:
        left = np.zeros(len(shown))
        for key, name, colour in PARTS:
            width = np.array([r["breakdown"][key] for r in shown])
            if width.any():
                ax.barh(y, width, left=left, color=colour, label=name, height=0.7)
            left += width
        ax.set_xlabel("seconds per iteration on the busiest stage")
        ax.legend(fontsize=7, ncol=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    else:
        left = np.array([r["iteration_time"] for r in shown])
        ax.barh(y, left, color="#3182bd", height=0.7)
        ax.set_xlabel("iteration time (profile time unit)")
    tokens = all(r["throughput"]["tokens_per_second"] is not None for r in shown)
    for yi, r, end in zip(y, shown, left):
        speed = r["throughput"]["tokens_per_second"] if tokens else r["throughput"]["samples_per_second"]
        mfu = "" if r.get("mfu") is None else f", MFU {100 * r['mfu']:.0f}%"
        ax.text(end, yi, f" {speed:,.0f} {'tok' if tokens else 'samples'}/s{mfu}", va="center", fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{i}. {_label(r['config'])}" for i, r in enumerate(shown, 1)], fontsize=8)
    ax.set_xlim(0, max(left) * 1.35)
    ax.set_title(f"the {len(shown)} best configurations (ties: less idle, less memory, smaller TP)", fontsize=9,
                 pad=18 if modelled else 6)


def sweep_figure(rows: Sequence[dict], skipped: Sequence[dict], title: str, top: int | None = None) -> Any:
    """``sweep --plot``.  With ``top`` (the rows are the best ones only): a bar chart of them with
    their time breakdown.  With every row (``--all``): throughput heat maps over stages x
    tensor-parallel size (a colour scale over the feasible range; "x" invalid, "OOM" does not
    fit; the best boxed) above the bar chart of the ten best."""
    plt = _pyplot()
    count = min(top or 10, 40)
    bars = min(count, sum(1 for r in rows if r["feasible"])) or 1
    if top is not None:
        fig = plt.figure(figsize=(11, 1.6 + 0.32 * bars), constrained_layout=True)
        _bars(fig, rows, count)
        fig.suptitle(title, fontsize=10)
        return fig
    configs = [r["config"] for r in rows] + [s["config"] for s in skipped]
    ps, tps = {c["stages"] for c in configs}, {c["tensor_parallel"] for c in configs}
    mbss = {c["micro_batch_size"] for c in configs}
    heat_h = 0.55 * len(ps) + 2.4
    fig = plt.figure(figsize=(max(0.9 * len(tps) * len(mbss) + 3.0, 11), heat_h + 1.4 + 0.32 * bars),
                     constrained_layout=True)
    top_fig, bottom = fig.subfigures(2, 1, height_ratios=[heat_h, 1.4 + 0.32 * bars])
    chosen = _heat(plt, top_fig, rows, skipped)
    _bars(bottom, rows, count)
    fig.suptitle(f"{title}{chosen}", fontsize=10)
    return fig


def plot_sweep(rows: Sequence[dict], path: str, title: str, skipped: Sequence[dict] = (),
               top: int | None = None) -> None:
    plt = _pyplot()
    _save(plt, sweep_figure(rows, skipped, title, top), path)
