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
from gpuknap.sweep import PILOT, pilot_plan

pace = importlib.import_module("gpuknap.sweep._pace")
sweep_mod = importlib.import_module("gpuknap.sweep._sweep")
progress_mod = importlib.import_module("gpuknap.cli._progress")

LLAMA = os.path.join(EXAMPLES, "llama2_70b.json")
GRID = {"stages": [1, 2, 4], "tensor_parallel": [2, 4, 8], "micro_batch_size": [1, 2], "interleave": [1, 2]}


def grid_configs(n, pairs):
    """``n`` configurations whose (stages, interleave) cycle through ``pairs`` values fastest
    (the grid's inner keys), as a stride through the grid would alias with."""
    return [{"stages": 2 + (i // pairs) % 5, "interleave": 1 + i % pairs, "at": i} for i in range(n)]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 40), st.integers(1, 48))
def test_pilot_draws_from_every_stages_x_interleave_group(n, pairs, pilot):
    configs = grid_configs(n, pairs)
    plan = pilot_plan(configs, pilot)
    if n <= 2 * pilot:
        assert plan == []
        return
    drawn = [i for indices, _ in plan for i in indices]
    assert len(drawn) == len(set(drawn)) == min(pilot, n) and sorted(drawn) == sorted(set(drawn))
    groups = {}
    for i, c in enumerate(configs):
        groups.setdefault((c["stages"], c["interleave"]), []).append(i)
    if len(groups) <= pilot:  # each group is a stratum with its size, drawn from at least once
        assert sorted((tuple(g), len(g)) for g in groups.values()) == sorted(
            (tuple(groups[(configs[idx[0]]["stages"], configs[idx[0]]["interleave"])]), size) for idx, size in plan)
        for indices, size in plan:
            key = {(configs[i]["stages"], configs[i]["interleave"]) for i in indices}
            assert len(key) == 1 and 1 <= len(indices) <= size
    assert sum(size for _, size in plan) == n
    assert plan == pilot_plan(configs, pilot)  # the same draw every time


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
    """Ten groups of ten, a pilot of 32: it draws 4, 4 and then 3 from each, a group at a time; each
    group's run takes 5 s (the clock ticks 5 s a reading), so the estimate is
    2 x 5 x 10 / 4 + 8 x 5 x 10 / 3 = 158.3 s."""
    configs = grid_configs(100, 2)
    monkeypatch.setattr(pace, "PILOT", 32)
    monkeypatch.setattr(pace, "time", Clock(5.0))
    log = []
    with pytest.raises(ValueError, match=r"about 3 min here \(158 s\): 100 configurations, timed on 32 of them drawn "
                                         r"from 10 of its 10 groups of like ones \(50.0 s\), over the limit of 150 s.*"
                                         r"--max-time 238, max_seconds=238"):
        pace.paced(configs, fake_run(log), 128, 150.0)
    assert len(log) == 10 and sorted(map(len, log)) == [3] * 8 + [4] * 2  # the pilot alone ran
    assert all(len({(c["stages"], c["interleave"]) for c in part}) == 1 for part in log)
    log = []  # the groups timed so far already over the limit: refused before the others run
    with pytest.raises(ValueError, match=r"would take over 42 s here \(42 s\): 100 configurations, timed on 11 of "
                                         r"them drawn from 3 of its 10 groups"):
        pace.paced(configs, fake_run(log), 128, 30.0)
    assert [len(part) for part in log] == [4, 4, 3]
    log = []  # under the estimate: every configuration once
    rows, skipped = pace.paced(configs, fake_run(log), 10, 159.0)
    assert sorted(r["config"]["at"] for r in rows) == list(range(100)) and skipped == []
    assert max(map(len, log)) <= 10 and len(log) == 10 + 7  # the pilot's groups, then 68 in batches of 10
    log = []  # no limit: no pilot (nothing to estimate), every configuration once in grid order
    rows, skipped = pace.paced(configs, fake_run(log), 10, None)
    assert [r["config"]["at"] for r in rows] == list(range(100)) and skipped == []
    assert log == [configs[i:i + 10] for i in range(0, 100, 10)]


def test_small_grids_run_no_pilot_and_are_never_refused(monkeypatch):
    monkeypatch.setattr(pace, "time", Clock(1e9))
    log = []
    configs = grid_configs(2 * PILOT, 3)
    rows, _ = pace.paced(configs, fake_run(log), 1000, 1.0)
    assert log == [configs]


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
        pace.paced(grid_configs(300, 4), run, 50, None)
    assert {stage for stage, _, _ in seen} == {"configurations"} and {n for _, _, n in seen} == {300}
    done = [d for _, d, _ in seen]
    assert done[0] == 0 and done[-1] == 300 and done == sorted(done)
    assert set(done) == set(range(301))  # every configuration counted as its batch's search ends


def test_pilot_rows_are_the_sweeps_rows_and_refusal_names_the_flag(monkeypatch):
    whole = sweep(LLAMA, GRID, gpus=32, global_batch=64, backend="numpy", bucket=16 * 2**20)
    monkeypatch.setattr(pace, "PILOT", 4)  # 30 valid configurations in 2 interleave groups (5 pairs > 4): a pilot of 4
    monkeypatch.setattr(sweep_mod, "BATCH", 7)
    piloted = sweep(LLAMA, GRID, gpus=32, global_batch=64, backend="numpy", bucket=16 * 2**20)
    assert json.dumps(piloted.rows) == json.dumps(whole.rows) and piloted.skipped == whole.skipped
    monkeypatch.setattr(pace, "time", Clock(100.0))
    with pytest.raises(ValueError, match=r"would take over 15 min here \(900 s\): 30 configurations, timed on 2 "
                                         r"of them drawn from 1 of its"):  # (the first group alone is over)
        sweep(LLAMA, GRID, gpus=32, global_batch=64, backend="numpy", bucket=16 * 2**20, max_seconds=60)
    assert len(sweep(LLAMA, GRID, gpus=32, global_batch=64, backend="numpy", bucket=16 * 2**20, top=3,
                     max_seconds=60).rows) == 3  # the best rows only: no pilot (its own estimate, on its own clock)
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
    assert len(err) == 1 and "over 15 min here (900 s)" in err[0] and "--max-time 1350" in err[0], err
    monkeypatch.setattr(importlib.import_module("gpuknap.sweep._prune"), "time", Clock(100.0))
    assert main(["sweep", *args[:-5], "--top", "2", "--max-time", "60"]) == 2  # the pruned search's own estimate
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the best 2 rows of this sweep could take up to about" in err[0], err
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
    assert lines[0].startswith("configurations [.....") and "left" not in lines[0]  # (one label: no phase number)
    assert lines[1].startswith("configurations [#####") and lines[1].endswith("31.0 s, ~90 s left"), lines[1]
    assert lines[2].startswith("DP passes (phase 2)") and "left" not in lines[2]
    assert all(len(x) <= progress_mod.WIDTH for x in lines)


def test_a_top_that_prunes_nothing_is_paced_as_a_full_sweep(monkeypatch):
    """``--top N`` with N at least the configurations can prune nothing: it runs (and is refused) as
    ``--all`` is, by its pilot (a red team's ``--top 1000`` skipped the estimate that refused
    ``--all``), and gives the first N rows of the full sweep."""
    import os

    from paths import EXAMPLES

    from gpuknap import sweep
    sweeps = importlib.import_module("gpuknap.sweep._sweep")
    calls, real = [], sweeps.paced
    monkeypatch.setattr(sweeps, "paced", lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
    spec = os.path.join(EXAMPLES, "llama2_70b.json")
    grid = {"stages": [2, 4], "tensor_parallel": [4, 8]}
    full = sweep(spec, grid, gpus=64, global_batch=256, top=None)
    assert calls == [4]
    some = sweep(spec, grid, gpus=64, global_batch=256, top=2)
    assert calls == [4]  # pruned as usual
    many = sweep(spec, grid, gpus=64, global_batch=256, top=1000)
    assert calls == [4, 4]
    key = lambda rows: [(sorted(r["config"].items()), r["counts"], r["iteration_time_s"]) for r in rows]  # noqa: E731
    assert key(many.rows) == key(full.rows) and key(some.rows) == key(full.rows[:2])


def test_a_top_sweep_is_refused_when_what_it_can_still_search_is_over_the_limit(monkeypatch):
    """``--top N`` estimates after every round: once it has N rows, the configurations still within
    reach of the N-th best row so far (all it can still search, the cutoff only falls) at the time
    per search so far.  The count is checked against what the sweep then searched, round after
    round."""
    prune = importlib.import_module("gpuknap.sweep._prune")
    monkeypatch.setattr(prune, "FIRST_ROUND", 4)  # 3 rows after the first round: a cutoff from then on
    monkeypatch.setattr(prune, "ROUND", 3)  # many rounds on 30 configurations
    seen, real = [], prune.check_pace
    monkeypatch.setattr(prune, "check_pace", lambda left, top, searched, spent, limit: (
        seen.append((left, searched)), real(left, top, searched, spent, limit)))
    kw = dict(gpus=32, global_batch=64, backend="numpy", bucket=16 * 2**20, top=3)
    free = sweep(LLAMA, GRID, **kw, max_seconds=None)
    assert seen == []  # no limit: nothing estimated
    limited = sweep(LLAMA, GRID, **kw, max_seconds=3600)
    assert json.dumps(limited.rows) == json.dumps(free.rows) and limited.searched == free.searched
    assert len(seen) >= 3 and [s for _, s in seen] == sorted(s for _, s in seen)
    assert all(limited.searched - searched <= left for left, searched in seen), (seen, limited.searched)
    assert seen[0][0] >= limited.searched - seen[0][1] > 0
    with pytest.raises(ValueError, match=r"the best 3 rows of this sweep could take up to about .* here: "
                                         r"4 configurations searched in [\d.]+ s and up to [\d,]+ more within reach "
                                         r"of the 3-th best row so far, over the limit of 1e-09 s; .*--max-time \d+"):
        sweep(LLAMA, GRID, **kw, max_seconds=1e-9)
    assert pace.check_pace(10, 3, 5, 2.0, 6.0) is None  # 2 s + 0.4 s x 10 = 6 s: within
    with pytest.raises(ValueError, match=r"about 6 s here: 5 configurations searched in 2.0 s and up to 10 more"):
        pace.check_pace(10, 3, 5, 2.0, 5.99)
    with pytest.raises(ValueError, match=r"about 10 min here \(600 s\): 5 configurations searched in 200.0 s"):
        pace.check_pace(10, 3, 5, 200.0, 5.0)


def test_before_n_rows_the_top_estimate_covers_the_next_round_and_the_configurations_proved_not_to_fit(monkeypatch):
    """A review's findings: with fewer than N rows there is no cutoff, and counting every
    configuration left refused grids that finish in seconds (a 1,128-configuration grid estimated
    at 34 s ran in 1.4 s); configurations proved not to fit were not counted, though they are
    searched when fewer than N rows fit.  Now: the next round, plus those, until there are N rows."""
    prune = importlib.import_module("gpuknap.sweep._prune")
    seen, real = [], prune.check_pace
    monkeypatch.setattr(prune, "check_pace", lambda left, top, searched, spent, limit: (
        seen.append((left, searched)), real(left, top, searched, spent, limit)))
    grid = dict(stages=[1, 2, 4, 8], tensor_parallel=[1, 2, 4, 8], micro_batch_size=[1, 2, 4], interleave=[1, 2],
                context_parallel=[1, 2])
    config = os.path.join(EXAMPLES, "llama2_7b_config.json")
    small = sweep(config, grid, gpus=64, global_batch=256, top=10, max_seconds=3600, seq=4096, backend="numpy",
                  capacity="4.5GiB")  # 3 of 162 fit: the rest proved not to, then searched for their rows
    assert sum(r["feasible"] for r in small.rows) < 10 and small.searched == 162
    assert seen and all(small.searched - searched <= left for left, searched in seen), seen
    seen.clear()
    wide = sweep(config, grid, gpus=64, global_batch=256, top=20, max_seconds=3600, seq=4096, backend="numpy")
    assert wide.searched < 162 and seen[0][0] <= prune.ROUND  # 16 searched, no 20th row yet: the next round
