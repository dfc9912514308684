"""The schedule as a Gantt chart that stays readable at any number of micro-batches.

Colour says what the time is spent on: forward, backward, the recompute at the start of a
backward, the communication inside an operation (tensor-, context- and expert-parallel, for
cost-modelled models), idle (white: bubbles and pipeline sends).  Micro-batch numbers are
written only where they fit.  With many micro-batches the chart shows the warm-up, one
steady-state window and the cool-down, the elided stretches marked, instead of a barcode.
Boxes are drawn in one collection per stage and colour, so a chart of thousands of
operations takes a fraction of a second.
"""
from __future__ import annotations

from typing import Any, Sequence

COLOURS = {"forward": "#9ecae1", "backward": "#3182bd", "recompute": "#fd8d3c", "communication": "#737373"}
#: Operations per stage above which the chart shows windows instead of the whole iteration.
WINDOWED = 96
#: Most micro-batch numbers written on one chart.
MAX_LABELS = 600


def time_unit(analytic: bool, span: float) -> tuple[str, float]:
    """``(label, factor)``: analytic models are in ms (shown in s beyond 10 s); profiles in their unit."""
    if not analytic:
        return "time (profile time units)", 1.0
    return ("time (s)", 1e-3) if span > 10_000 else ("time (ms)", 1.0)


def communication_shares(model: Any, counts: Sequence[int], names: Sequence[str], chunks: int) -> list:
    """``[stage][chunk]``: the share of each (stage, chunk)'s time spent communicating inside its
    operations (from the options' ``parts``; 0 for measured profiles)."""
    p = len(counts) // chunks
    comm = [[0.0] * chunks for _ in range(p)]
    total = [[0.0] * chunks for _ in range(p)]
    by_name = {kind: {getattr(o, "name", None): o for o in model.fronts[kind]} for kind in model.kind_order}
    layer = 0
    for i, n in enumerate(counts):
        c, s = divmod(i, p)
        for _ in range(n):
            option = by_name[model.kinds[layer]][names[layer]]
            parts = dict(getattr(option, "parts", ()))
            comm[s][c] += parts.get("tp", 0.0) + parts.get("cp", 0.0) + parts.get("ep", 0.0)
            total[s][c] += option.forward_time + option.backward_time
            layer += 1
    return [[x / t if t > 0 else 0.0 for x, t in zip(cr, tr)] for cr, tr in zip(comm, total)]


def windows(t: Any) -> list[tuple[float, float]]:
    """The stretches of time to draw: the whole iteration, or with many operations the warm-up,
    one steady-state window in the middle and the cool-down."""
    span = t.iteration_time
    per_stage = 2 * t.chunks * t.micro_batches
    if per_stage <= WINDOWED or span <= 0:
        return [(0.0, span)]
    slot = span / (t.chunks * t.micro_batches + t.stages)  # about one micro-batch's turn on a stage
    width = slot * (2 * t.stages + 4)
    mid = span / 2
    if 3 * width >= span:
        return [(0.0, span)]
    return [(0.0, width), (mid - width / 2, mid + width / 2), (span - width, span)]


def draw(plt: Any, axes: Sequence[Any], t: Any, times: Any, comm: Sequence | None, unit: tuple[str, float],
         title: str) -> None:
    """The chart on ``axes`` (one per window of :func:`windows`, left to right)."""
    from matplotlib.patches import Patch

    label, factor = unit
    spans = windows(t)
    boxes: dict[tuple[int, str], list] = {}
    numbers = []
    for op in t.ops:
        start, end = op.start * factor, op.end * factor
        length = end - start
        key = "forward" if op.kind == "F" else "backward"
        rec = times.recompute[op.stage][op.chunk] * factor if op.kind == "B" else 0.0
        share = comm[op.stage][op.chunk] if comm else 0.0
        talk = length * share
        boxes.setdefault((op.stage, key), []).append((start + rec, max(length - rec - talk, 0.0)))
        if rec > 0:
            boxes.setdefault((op.stage, "recompute"), []).append((start, min(rec, length)))
        if talk > 0:
            boxes.setdefault((op.stage, "communication"), []).append((end - talk, talk))
        numbers.append((op, start, length))
    for ax, (lo, hi) in zip(axes, spans):
        for (stage, key), ranges in boxes.items():
            y = t.stages - 1 - stage
            ax.broken_barh(ranges, (y - 0.4, 0.8), facecolors=COLOURS[key], edgecolor="white", linewidth=0.2)
        ax.set_xlim(lo * factor, hi * factor)
        ax.set_ylim(-0.6, t.stages - 0.4)
        ax.set_yticks(range(t.stages))
        if ax is axes[0]:
            ax.set_yticklabels([f"stage {s}" for s in range(t.stages - 1, -1, -1)])
        else:
            ax.tick_params(axis="y", length=0, labelleft=False)
    _label_micro_batches(axes, spans, numbers, factor, t)
    if len(axes) > 1:
        elided = t.chunks * t.micro_batches
        for ax in axes[1:]:
            ax.spines["left"].set_linestyle((0, (2, 2)))
        for ax in axes[:-1]:
            ax.spines["right"].set_linestyle((0, (2, 2)))
        axes[1].set_title("steady state (one window)", fontsize=8)
        axes[0].set_title("warm-up", fontsize=8)
        axes[-1].set_title("cool-down", fontsize=8)
        axes[1].set_xlabel(f"{label}; the stretches between the windows are elided "
                           f"({elided} micro-batch passes per stage in all)")
    else:
        axes[0].set_xlabel(label)
    handles = [Patch(facecolor=COLOURS[k], label=k) for k in ("forward", "backward", "recompute")]
    if comm and any(x > 0 for row in comm for x in row):
        handles.append(Patch(facecolor=COLOURS["communication"], label="communication (TP/CP/EP)"))
    handles.append(Patch(facecolor="white", edgecolor="0.6", label="idle (bubble, pipeline sends)"))
    if t.chunks > 1:
        handles.append(Patch(facecolor="white", edgecolor="white", label="3' = micro-batch 3 on chunk 1"))
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    total = t.iteration_time * factor
    axes[0].figure.suptitle(f"{title}\nschedule {total:.4g} {label.split('(')[1][:-1]}, bubble {100 * t.bubble:.1f}%, "
                       f"{t.micro_batches} micro-batches" + (f", {t.chunks} chunks per stage" if t.chunks > 1 else ""),
                       fontsize=10)


def _label_micro_batches(axes: Sequence[Any], spans: list, numbers: list, factor: float, t: Any) -> None:
    """Each operation's micro-batch number inside its box, where the box is wide enough."""
    placed = 0
    for ax, (lo, hi) in zip(axes, spans):
        width_px = ax.get_window_extent().width or 1.0
        per_px = (hi - lo) * factor / width_px
        for op, start, length in numbers:
            if placed >= MAX_LABELS:
                return
            if length / per_px < 14 or start < lo * factor or start + length > hi * factor:
                continue
            ax.text(start + length / 2, t.stages - 1 - op.stage, str(op.micro_batch) + "'" * op.chunk,
                    ha="center", va="center",
                    fontsize=6, color="black" if op.kind == "F" else "white")
            placed += 1


def figure(plt: Any, t: Any, times: Any, comm: Sequence | None, unit: tuple[str, float], title: str,
           height: float | None = None) -> Any:
    """A figure holding only the chart."""
    spans = windows(t)
    fig, axes = plt.subplots(1, len(spans), figsize=(12, height or 0.45 * t.stages + 2.0), squeeze=False,
                             sharey=True, gridspec_kw={"wspace": 0.04})
    draw(plt, list(axes[0]), t, times, comm, unit, title)
    fig.subplots_adjust(left=0.08, right=0.84, bottom=0.18, top=0.8)
    return fig
