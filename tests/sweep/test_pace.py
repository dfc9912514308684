"""A sweep of every row: its pilot (a spread sample, run first), the time estimated on it and the
refusal over the limit, and progress counted over the whole sweep."""
from __future__ import annotations

import importlib
import io
import json
import math
import os

import pytest
from hypothesis import given, settings, strategies as st
from paths import EXAMPLES

from gpuknap import sweep
from gpuknap.engine import reporting
from gpuknap.sweep import PILOT, pilot_order

pace = importlib.import_module("gpuknap.sweep._pace")
sweep_mod = importlib.import_module("gpuknap.sweep._sweep")
progress_mod = importlib.import_module("gpuknap.cli._progress")

LLAMA = os.path.join(EXAMPLES, "llama2_70b.json")
GRID = {"stages": [1, 2, 4], "tensor_parallel": [2, 4, 8], "micro_batch_size": [1, 2], "interleave": [1, 2]}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5000), st.integers(1, 64))
def test_pilot_is_spread_over_the_grid_then_the_rest_in_order(n, pilot):
    order = pilot_order(n, pilot)
    assert sorted(order) == list(range(n))
    if n <= 2 * pilot:
        assert order == list(range(n))
        return
    first, rest = order[:pilot], order[pilot:]
    assert rest == sorted(rest) and first == sorted(first) and first[0] == 0
    gaps = [b - a for a, b in zip(first, first[1:] + [n])]  # every stretch of the grid is sampled
    assert max(gaps) <= math.ceil(n / pilot) and min(gaps) >= n // pilot


class Clock:
    """``time.perf_counter`` that advances ``tick`` seconds a call."""

    def __init__(self, tick):
        self.now, self.tick = 0.0, tick

    def perf_counter(self):
        self.now += self.tick
        return self.now


def fake_run(log):
    def run(part):
        log.append(list(part))
        return [{"config": c} for c in part], []
    return run


def test_estimate_over_the_limit_refuses_after_the_pilot_alone(monkeypatch):
    monkeypatch.setattr(pace, "time", Clock(5.0))  # the pilot takes 5 s: 100 configurations about 16 s
    log = []
    with pytest.raises(ValueError, match=r"about 16 s here: 100 configurations, timed on 32 .* over the limit of 15 s"
                                         r".*--max-time 24"):
        pace.paced(list(range(100)), fake_run(log), 128, 15.0)
    assert log == [[i * 100 // PILOT for i in range(PILOT)]]
    for limit in (16.0, None):  # at the estimate, or no limit: every configuration once
        log = []
        rows, skipped = pace.paced(list(range(100)), fake_run(log), 10, limit)
        assert sorted(r["config"] for r in rows) == list(range(100)) and skipped == []
        assert max(map(len, log)) <= 10 and log[0][:2] == [0, 3]  # batches of 10 at most, the pilot first


def test_small_grids_run_no_pilot_and_are_never_refused(monkeypatch):
    monkeypatch.setattr(pace, "time", Clock(1e9))
    log = []
    rows, _ = pace.paced(list(range(2 * PILOT)), fake_run(log), 1000, 1.0)
    assert log == [list(range(2 * PILOT))]


def test_progress_counts_configurations_over_the_whole_sweep():
    """A batch's own ``searches`` count is added to the batches before it; other reports (DP
    passes, local searches) keep the line alive; the count never goes back."""
    def run(part):
        pace_report = importlib.import_module("gpuknap.engine").report
        for done in range(len(part) + 1):
            pace_report("searches", done, len(part))
            pace_report("DP passes", 1, 2)
        pace_report("searches", 0, len(part))  # a local search afterwards: not a step back
        return [{"config": c} for c in part], []

    seen = []
    with reporting(lambda *a: seen.append(a)):
        pace.paced(list(range(300)), run, 50, None)
    assert {stage for stage, _, _ in seen} == {"configurations"} and {n for _, _, n in seen} == {300}
    done = [d for _, d, _ in seen]
    assert done[0] == 0 and done[-1] == 300 and done == sorted(done)
    assert set(done) == set(range(301))  # every configuration counted as its batch's search ends


def test_pilot_rows_are_the_sweeps_rows_and_refusal_names_the_flag(monkeypatch):
    whole = sweep(LLAMA, GRID, gpus=32, global_batch=64, backend="numpy", bucket=16 * 2**20)
    monkeypatch.setattr(pace, "PILOT", 4)  # 30 valid configurations: a pilot of 4, then the rest
    monkeypatch.setattr(sweep_mod, "BATCH", 7)
    piloted = sweep(LLAMA, GRID, gpus=32, global_batch=64, backend="numpy", bucket=16 * 2**20)
    assert json.dumps(piloted.rows) == json.dumps(whole.rows) and piloted.skipped == whole.skipped
    monkeypatch.setattr(pace, "time", Clock(100.0))
    with pytest.raises(ValueError, match="would take about 12 min here: 30 configurations, timed on 4"):
        sweep(LLAMA, GRID, gpus=32, global_batch=64, backend="numpy", bucket=16 * 2**20, max_seconds=60)
    assert len(sweep(LLAMA, GRID, gpus=32, global_batch=64, backend="numpy", bucket=16 * 2**20, top=3,
                     max_seconds=60).rows) == 3  # the best rows only: no pilot, no estimate
    for bad in (0, -1, math.inf, True, "60"):
        with pytest.raises(ValueError, match="max_seconds must be a positive number of seconds"):
            sweep(LLAMA, GRID, gpus=32, global_batch=64, max_seconds=bad)


def test_cli_refusal_is_one_line_and_bad_max_time_exits_2(monkeypatch, capsys):
    from gpuknap.cli import main

    monkeypatch.setattr(pace, "PILOT", 4)
    monkeypatch.setattr(pace, "time", Clock(100.0))
    args = [LLAMA, "--gpus", "32", "--global-batch", "64", "--stages", "1,2,4", "--tp", "2,4,8",
            "--micro-batch-size", "1,2", "--interleave", "1,2", "--all", "--backend", "numpy", "--bucket", "16MiB"]
    assert main(["sweep", *args, "--max-time", "600"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "about 12 min here" in err[0] and "--max-time 1125" in err[0], err
    for bad in ("0", "x", "-5", "inf"):
        assert main(["sweep", *args, "--max-time", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--max-time" in err[0], err


def test_the_line_says_the_time_left_of_the_configurations_phase(monkeypatch):
    out = io.StringIO()
    out.isatty = lambda: True
    monkeypatch.setattr(progress_mod.sys, "stderr", out)
    clock = Clock(0.0)
    monkeypatch.setattr(progress_mod.time, "perf_counter", clock.perf_counter)
    bar = progress_mod.Bar(quiet=False)
    for stage, done, total, at in (("configurations", 0, 400, 1.0), ("configurations", 100, 400, 31.0),
                                   ("DP passes", 1, 4, 40.0)):
        clock.now = at
        bar(stage, done, total)
    lines = [x.strip() for x in out.getvalue().split("\r") if x.strip()]
    assert lines[0].startswith("configurations (phase 1)") and "left" not in lines[0]
    assert lines[1].startswith("configurations [#####") and lines[1].endswith("31.0 s, ~90 s left"), lines[1]
    assert lines[2].startswith("DP passes (phase 2)") and "left" not in lines[2]
    assert all(len(x) <= progress_mod.WIDTH for x in lines)
