"""Every plot type rendered on small models (M = 256 and an interleaved schedule included), checked
on the figure's texts: titles, axis labels, units, legend entries (not on pixels)."""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from paths import EXAMPLES  # noqa: E402

from gpuknap import LayerOption, PipelineModel, best_splits  # noqa: E402
from gpuknap.cli._plots import best_figure, curve_figure, scores_figure, sweep_figure, timeline_figure  # noqa: E402
from gpuknap.cli._report import split_record  # noqa: E402
from gpuknap.costs import gpt, transformer_model  # noqa: E402
from gpuknap.schedule import of_split  # noqa: E402


def texts(fig) -> set[str]:
    out = {t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text"))}
    for ax in fig.axes:
        out |= {ax.get_xlabel(), ax.get_ylabel(), ax.get_title()}
        legend = ax.get_legend()
        if legend is not None:
            out |= {t.get_text() for t in legend.get_texts()}
    return {t for t in out if t}


def has(fig, *words) -> None:
    found = " | ".join(sorted(texts(fig)))
    for word in words:
        assert word in found, (word, found[:2000])


def tiny_profile(m):
    opts = [LayerOption("NONE", 4.0, 1.0, 2.0), LayerOption("FULL", 1.0, 1.0, 3.0)]
    return PipelineModel(["L"] * 8, {"L": opts}, {"L": 1.0}, 40.0, m)


def tiny_analytic(m, p=2):
    cfg = gpt(4, 256, 4, seq=128, micro_batch=1, tensor_parallel=2, vocab=1000, pipeline_parallel=p)
    return transformer_model(cfg, 80 * 2**30, m, 0.0)


def test_timeline_of_256_micro_batches_shows_windows_not_a_barcode():
    import matplotlib.pyplot as plt

    model = tiny_analytic(256)
    found = best_splits(model, 2, 1, "1f1b", 2**20, backend="numpy")
    t, times, _ = of_split(model, list(found[0][0]), 2**20)
    fig = timeline_figure(t, times, "tiny: split", analytic=True)
    has(fig, "warm-up", "steady state (one window)", "cool-down", "elided", "time (ms)", "forward", "backward",
        "recompute", "idle (bubble, pipeline sends)", "256 micro-batches", "stage 0", "stage 1")
    assert len(fig.axes) == 3
    labels = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert len(labels) < 600 and "255" in labels  # numbers only where they fit, the last micro-batch among them
    plt.close(fig)


def test_interleaved_timeline_marks_chunks_and_profile_units():
    import matplotlib.pyplot as plt

    model = tiny_profile(4)
    t, times, _ = of_split(model, [2, 2, 2, 2], 1.0, None, 2)
    fig = timeline_figure(t, times, "tiny interleaved", analytic=False)
    has(fig, "time (profile time units)", "2 chunks per stage", "micro-batch 3 on chunk 1")
    assert len(fig.axes) == 1
    plt.close(fig)


def test_best_figure_stacks_memory_and_time_with_integer_stages():
    import matplotlib.pyplot as plt

    model = tiny_analytic(8, p=2)
    found = best_splits(model, 2, 1, "slowest", 2**20, backend="numpy")
    record = split_record(model, found[0][0], found[0][2], "slowest", found[0][1])
    solved = of_split(model, list(found[0][0]), 2**20)
    fig = best_figure([record], solved, "tiny: best split", [[0.1], [0.2]])
    has(fig, "memory (GiB)", "device capacity", "weights, gradients, optimizer", "activations", "fp32 logits",
        "time per iteration (s)", "compute", "bubble", "stage (* the slowest)", "communication (TP/CP/EP)")
    stage_axes = [ax for ax in fig.axes if ax.get_ylabel() == "memory (GiB)"]
    assert [t.get_text() for t in stage_axes[0].get_xticklabels()] == ["0", "1"]
    plt.close(fig)
    profile = tiny_profile(4)
    found = best_splits(profile, 2, 1, "slowest", 1.0, backend="numpy")
    record = split_record(profile, found[0][0], found[0][2], "slowest", found[0][1], bucket=1.0)
    fig = best_figure([record], None, "profile")
    has(fig, "stage time (profile time units)", "memory (GiB)")
    plt.close(fig)


def test_curve_and_scores_say_model_stage_budget_and_units():
    import matplotlib.pyplot as plt

    points = [{"budget_bytes": b * 2**30, "time": 10.0 - b} for b in range(1, 6)]
    fig = curve_figure(points, "llama: stage 2 of split [4, 4]", 3 * 2**30, analytic=True)
    has(fig, "llama: stage 2 of split [4, 4]", "least stage time (ms)", "memory budget for activations (GiB)",
        "the stage's budget (3.0 GiB)")
    plt.close(fig)
    fig = scores_figure(np.array([1.0, 2.0, np.inf]), "scores", 1.0, analytic=False)
    has(fig, "slowest stage time (profile time units)", "1 infeasible (not shown)", "best 1")
    plt.close(fig)


def test_sweep_map_scales_over_the_feasible_range_and_tells_invalid_from_oom():
    import matplotlib.pyplot as plt

    from gpuknap import sweep

    result = sweep(os.path.join(EXAMPLES, "llama2_70b.json"), {"stages": [1, 2, 3, 4], "tensor_parallel": [4, 8, 16]},
                   gpus=64, global_batch=64, backend="numpy", bucket=16 * 2**20)
    fig = sweep_figure(result.rows, result.skipped, "llama sweep")
    has(fig, "x: not a valid configuration", "OOM: does not fit the device memory", "best (red box)", "MFU",
        "tensor-parallel size", "pipeline stages", "throughput (tokens/s, whole cluster)")
    speeds = [r["throughput"]["tokens_per_second"] for r in result.rows if r["feasible"] and r["rank"] == 1]
    image = fig.axes[0].images[0]
    assert image.norm.vmin == pytest.approx(min(speeds)) and image.norm.vmax == pytest.approx(max(speeds))
    cells = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "OOM" in cells and "x" in cells
    plt.close(fig)
