"""gpuknap.sweep and `gpuknap sweep`: every row against best_splits run alone, Dask against
in-process, bad grids, and the all-infeasible exit."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest
from paths import EXAMPLES

from gpuknap import best_splits, sweep
from gpuknap.costs import estimate
from gpuknap.sweep import builder_of, expand

LLAMA = os.path.join(EXAMPLES, "llama2_70b.json")
MIXTRAL_SMALL = os.path.join(EXAMPLES, "mixtral_small_config.json")
DEEPSEEK = os.path.join(EXAMPLES, "deepseek_v3_small_config.json")
MIB = 2**20


def reference(source, grid, gpus, global_batch, score="1f1b", top=1, **kw):
    """The test reference: best_splits alone on each configuration's model."""
    builder, _, bucket, _ = builder_of(source, kw.get("capacity"), None, kw.get("seq"), kw.get("bucket"))
    configs, _ = expand(grid, gpus, global_batch, builder.layers)
    out = {}
    for c in configs:
        try:
            model = builder(c)
        except ValueError:
            continue
        if c["stages"] * c["interleave"] > model.layers:
            continue
        v = c["interleave"]
        found = best_splits(model, c["stages"], top, score, bucket, backend="numpy", interleave=v)
        sims = [estimate(model, f[0], model.option_names(f[0], f[2], None, v), v).iteration_time / 1e-3
                for f in found]
        rows = [(list(f[0]), f[1], t) for f, t in zip(found, sims)]
        even = megatron_even(model.layers, c["stages"] * v)
        names = model.plan(even, bucket, chunks=v) if rows and v > 1 else None
        if names is not None and even not in [r[0] for r in rows]:  # Megatron's even split, when it runs faster
            t = estimate(model, even, names, v).iteration_time / 1e-3
            if t < rows[0][2]:
                times = np.array(model.rank([even], bucket, "numpy", chunks=v).times(0))
                m = model.micro_batches
                value = times.max() if score == "slowest" else ((v * m - 1) * times.max() + times.sum()) / v
                rows = [(even, pytest.approx(float(value), rel=1e-12), t)] + rows[:top - 1]
        out[tuple(sorted(c.items()))] = [(r[0], r[1], pytest.approx(r[2], rel=1e-12)) for r in rows]
    return out


def megatron_even(layers, segments):
    """Megatron's even split over virtual stages, the extra layers on the first and last ones."""
    counts = [layers // segments] * segments
    for k in range(layers % segments):
        counts[k // 2 if k % 2 == 0 else segments - 1 - k // 2] += 1
    return counts


def check_rows(result, want):
    got = {}
    for r in result.rows:
        key = tuple(sorted(r["config"].items()))
        if r["feasible"]:
            got.setdefault(key, []).append((r["rank"], r["counts"], r["score"], r["iteration_time"]))
        else:
            got.setdefault(key, [])
    assert {k: [e[1:] for e in sorted(v)] for k, v in got.items()} == want


@pytest.mark.parametrize("score, top", [("1f1b", 1), ("slowest", 2)])
def test_every_row_equals_best_splits_alone_dense(score, top):
    grid = {"stages": [1, 2, 4, 8], "tensor_parallel": [2, 4, 8], "micro_batch_size": [1, 2], "interleave": [1, 2]}
    result = sweep(LLAMA, grid, gpus=64, global_batch=128, score=score, top_splits=top, backend="numpy", bucket=16 * MIB)
    assert len({tuple(sorted(r["config"].items())) for r in result.rows}) >= 20
    check_rows(result, reference(LLAMA, grid, 64, 128, score, top, bucket=16 * MIB))
    assert any(r.get("even_split") for r in result.rows)  # the even split beat the closed form's somewhere
    speeds = [r["throughput"]["samples_per_second"] for r in result.rows if r["feasible"]]
    assert speeds == sorted(speeds, reverse=True) and speeds
    best = result.best
    assert best["throughput"]["tokens_per_second"] == pytest.approx(best["throughput"]["samples_per_second"] * 8192)
    assert best["iteration_time"] == pytest.approx(128 / best["throughput"]["samples_per_second"] * 1e3)


def test_every_row_equals_best_splits_alone_moe():
    """A Hugging Face config with dense and MoE layers (interleaved: the local search)."""
    grid = {"stages": [1, 2, 4], "tensor_parallel": [1, 2, 4], "micro_batch_size": [1, 2], "interleave": [1, 2]}
    kw = dict(capacity="80 GiB", seq=2048, bucket=16 * MIB)
    result = sweep(DEEPSEEK, grid, gpus=32, global_batch=64, backend="numpy", **kw)
    assert len({tuple(sorted(r["config"].items())) for r in result.rows}) >= 20
    check_rows(result, reference(DEEPSEEK, grid, 32, 64, **kw))
    assert any(not r["exact"] for r in result.rows if r["config"]["interleave"] > 1)


def test_callable_source_and_skipped_reasons():
    from gpuknap import LayerOption, PipelineModel

    def build(config):  # a closure over a driver's own cost model
        t = 1.0 / config["tensor_parallel"]
        opts = [LayerOption("keep", 4e9 * config["micro_batch_size"], t, 2 * t), LayerOption("full", 1e9, t, 3 * t)]
        return PipelineModel(["x"] * 12, {"x": opts}, {"x": 2e9 / config["tensor_parallel"]}, 80e9,
                             config["micro_batches"])

    result = sweep(build, {"stages": [2, 3, 4], "tensor_parallel": [1, 2]}, gpus=8, global_batch=16,
                   backend="numpy")
    reasons = {s["reason"] for s in result.skipped}
    assert any("not a multiple of stages x tensor_parallel" in r for r in reasons)
    assert all(r["feasible"] for r in result.rows) and result.rows


def test_dask_local_cluster_gives_identical_rows():
    distributed = pytest.importorskip("distributed")
    grid = {"stages": [1, 2, 4], "tensor_parallel": [4, 8], "micro_batch_size": [1, 2], "interleave": [1, 2]}
    want = sweep(LLAMA, grid, gpus=32, global_batch=64, backend="numpy", bucket=16 * MIB)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        got = sweep(LLAMA, grid, gpus=32, global_batch=64, backend="numpy", bucket=16 * MIB, scheduler=client)
        assert got.rows == want.rows and got.skipped == want.skipped
        many = sweep(LLAMA, grid, gpus=32, global_batch=64, backend="numpy", bucket=16 * MIB,
                     scheduler=client, shards=7)
        assert many.rows == want.rows
        scale = 2.0  # a closure over local state, pickled to the workers

        def build(config):
            from gpuknap import LayerOption, PipelineModel
            t = scale / config["tensor_parallel"]
            return PipelineModel(["x"] * 10, {"x": [LayerOption("keep", 3e9, t, 2 * t)]}, {"x": 1e9}, 80e9,
                                 config["micro_batches"])

        local = sweep(build, grid, gpus=32, global_batch=64, backend="numpy")
        remote = sweep(build, grid, gpus=32, global_batch=64, backend="numpy", scheduler=client)
        assert remote.rows == local.rows and local.best is not None


def test_missing_dask_is_one_clear_error(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_dask(name, *args, **kwargs):
        if name.startswith("distributed"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(ValueError, match=r"gpuknap\[cluster\]"):
        sweep(LLAMA, {"stages": [2]}, gpus=8, global_batch=8, scheduler="tcp://127.0.0.1:1")


def cli(*args):
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy"}
    return subprocess.run([sys.executable, "-m", "gpuknap", "sweep", *args], capture_output=True, text=True, env=env)


def test_cli_json_plot_and_table(tmp_path):
    png = tmp_path / "sweep.png"
    args = [LLAMA, "--gpus", "32", "--global-batch", "64", "--stages", "2,4", "--tp", "4,8",
            "--micro-batch-size", "1,2", "--bucket", "16MiB"]
    p = cli(*args, "--json", "--plot", str(png))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    api = sweep(LLAMA, {"stages": [2, 4], "tensor_parallel": [4, 8], "micro_batch_size": [1, 2]}, gpus=32,
                global_batch=64, backend="numpy", bucket=16 * MIB)
    assert out["best"] == out["rows"][0]
    assert all(row.pop("command")[:3] == ["gpuknap", "best", LLAMA] for row in out["rows"])  # the CLI's own
    assert out["rows"] == json.loads(json.dumps(api.rows))
    assert png.stat().st_size > 10_000
    run = cli(*args)
    assert "tokens/s" in run.stdout and "P=" in run.stdout and "MFU" in run.stdout and "pruned by bound" in run.stdout
    assert run.stderr == ""  # communication is modelled now: no note that it is not


@pytest.mark.parametrize("source, args", [
    (MIXTRAL_SMALL, ["--gpus", "16", "--global-batch", "64", "--seq", "1024", "--stages", "1,2,4", "--tp", "1,2",
                     "--ep", "1,2,4", "--etp", "1,2", "--device", "h100,a100-80gb", "--reserved", "3GiB",
                     "--bucket", "2MiB", "--gpus-per-node", "4", "--device-field", "inter_bandwidth=20e9"]),
    (LLAMA, ["--gpus", "32", "--global-batch", "64", "--stages", "2,4", "--tp", "4,8", "--interleave", "1,2",
             "--micro-batch-size", "1,2", "--capacity", "60GiB", "--efficiency", "0.6", "--tp-comm-overlap"]),
])
def test_each_rows_command_plans_that_row(capsys, source, args):
    """Every row carries the ``gpuknap best`` arguments of its configuration (device, batch,
    overrides and score as the sweep had them); run, they give the row's split and run time, and the
    table ends with row 1's, the way to its framework settings (``--emit``).  A row that is
    Megatron's even split (interleaved) is best's note on the even split, the plan --emit writes."""
    from gpuknap.cli import main

    assert main(["sweep", source, *args, "--top", "4", "--quiet", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert sum(r["feasible"] for r in rows) >= 3
    for row in rows[:4]:
        command = row["command"]
        assert command[:2] == ["gpuknap", "best"]
        code = main([*command[1:], "--quiet", "--json"])
        got = json.loads(capsys.readouterr().out)
        if not row["feasible"]:
            assert code == 1 and got["results"] == []
            continue
        planned = got["even_split"] if row.get("even_split") else got["results"][0]  # best's note, --emit's plan
        assert code == 0 and planned["counts"] == row["counts"]
        assert planned["iteration_time_s"] == pytest.approx(row["iteration_time_s"], rel=1e-12)
    assert main([*rows[0]["command"][1:], "--emit", "megatron", "--quiet", "--json"]) == 0
    emitted = json.loads(capsys.readouterr().out)
    # the row's split, unless Megatron cannot run its plan as written (the cost is then stated)
    assert emitted["results"][0]["counts"] == rows[0]["counts"] or "costs +0 " not in emitted["settings"]["text"]
    assert main(["sweep", source, *args, "--top", "2", "--quiet"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.endswith(" ".join(shlex.quote(w) for w in rows[0]["command"])) and "--emit megatron" in last


@pytest.mark.parametrize("args, words", [
    (["--gpus", "6", "--stages", "4"], "no valid configuration"),
    (["--gpus", "8", "--tp", "0"], "--tp"),
    (["--gpus", "8", "--stages", "2,x"], "--stages"),
    (["--gpus", "-8"], "--gpus"),
    (["--gpus", "8", "--global-batch", "0"], "--global-batch"),
    (["--gpus", "8", "--scheduler", "tcp://127.0.0.1:1"], "scheduler"),
])
def test_cli_bad_grids_exit_2_with_one_line(args, words):
    if "--global-batch" not in args:
        args = args + ["--global-batch", "16"]
    p = cli(LLAMA, *args)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and words in lines[0], p.stderr


def test_api_refuses_unknown_grid_keys_and_sizes():
    for grid, words in (({"stage": [2]}, "unknown key 'stage'"), ({"stages": [0]}, "stages"),
                        ({"stages": []}, "empty")):
        with pytest.raises(ValueError, match=words):
            sweep(LLAMA, grid, gpus=8, global_batch=8)
    with pytest.raises(ValueError, match="simulated"):
        sweep(LLAMA, {"stages": [2]}, gpus=8, global_batch=8, score="simulated")


def test_cli_all_infeasible_exits_1_with_the_closest():
    p = cli(LLAMA, "--gpus", "8", "--global-batch", "64", "--stages", "1,2", "--tp", "1,2", "--capacity", "8GiB")
    assert p.returncode == 1, p.stderr
    assert "no configuration fits" in p.stderr and "the closest" in p.stderr and "layers" in p.stderr


def _dying_builder(marker):
    """A source whose first build of one configuration kills its process (a worker lost
    mid-sweep); later builds, after the marker exists, work."""
    def build(config):
        from gpuknap import LayerOption, PipelineModel
        if config["stages"] == 2 and config["tensor_parallel"] == 4 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        t = 2.0 / config["tensor_parallel"]
        return PipelineModel(["x"] * 10, {"x": [LayerOption("keep", 3e9, t, 2 * t)]}, {"x": 1e9}, 80e9,
                             config["micro_batches"])
    return build


def test_dask_reruns_the_shard_of_a_worker_that_died(tmp_path):
    distributed = pytest.importorskip("distributed")
    grid = {"stages": [1, 2, 4], "tensor_parallel": [4, 8]}
    (tmp_path / "done").write_text("")
    want = sweep(_dying_builder(str(tmp_path / "done")), grid, gpus=32, global_batch=64, backend="numpy")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        got = sweep(_dying_builder(str(tmp_path / "dies")), grid, gpus=32, global_batch=64, backend="numpy",
                    scheduler=client)
    assert (tmp_path / "dies").exists()  # a worker did die
    assert got.rows == want.rows


QWEN = os.path.join(EXAMPLES, "qwen2_7b_config.json")
MIXTRAL = os.path.join(EXAMPLES, "mixtral_8x7b_config.json")


def test_qwen2_7b_on_32_h100s_tp_sizes_no_longer_tie():
    """With communication modelled, TP 1, 2 and 4 of the same P and micro-batch size give
    different times, and every row shows each stage's communication."""
    grid = {"stages": [2], "tensor_parallel": [1, 2, 4], "micro_batch_size": [1]}
    result = sweep(QWEN, grid, gpus=32, global_batch=256, seq=4096, backend="numpy", device="h100")
    times = {r["config"]["tensor_parallel"]: r["iteration_time_s"] for r in result.rows if r["feasible"]}
    assert len(times) == 3 and len(set(times.values())) == 3
    for r in result.rows:
        if r["feasible"]:
            assert len(r["stage_breakdown"]) == 2
            assert (r["config"]["tensor_parallel"] > 1) == (r["stage_breakdown"][0]["tp"] > 0)
            assert r["stage_breakdown"][1]["p2p"] > 0 and r["stage_breakdown"][0]["dp"] > 0


def test_tp_spanning_nodes_ranks_below_tp_inside_a_node():
    grid = {"stages": [4], "tensor_parallel": [8, 16], "micro_batch_size": [1]}
    result = sweep(LLAMA, grid, gpus=64, global_batch=64, backend="numpy", bucket=16 * MIB, device="h100")
    feasible = [r for r in result.rows if r["feasible"]]
    assert [r["config"]["tensor_parallel"] for r in feasible] == [8, 16]
    inside, across = feasible
    assert across["breakdown"]["tp"] > 2 * inside["breakdown"]["tp"]


def test_mixtral_on_64_h100s_never_beats_the_efficiency():
    grid = {"stages": [2, 4, 8], "tensor_parallel": [1, 2, 4], "micro_batch_size": [1]}
    result = sweep(MIXTRAL, grid, gpus=64, global_batch=256, seq=4096, backend="numpy", device="h100",
                   expert_parallel=8, expert_tensor_parallel=1)
    feasible = [r for r in result.rows if r["feasible"]]
    assert feasible
    for r in feasible:
        assert 0 < r["mfu"] < 0.73 and r["tflops_per_gpu"] < 989 * 0.73
        assert r["breakdown"]["ep"] > 0  # the all-to-all of EP 8


def test_every_row_has_the_same_keys_and_the_footer_names_what_happened():
    """Infeasible rows carry a feasible row's run fields as null (a driver reading ``row["mfu"]``
    gets None, not a KeyError); the footer says when nothing was pruned rather than naming a
    row that is not there; Megatron's even split is labelled as such, not as a local search."""
    from types import SimpleNamespace

    from gpuknap.cli._sweep import table

    p = cli(LLAMA, "--gpus", "16", "--global-batch", "64", "--stages", "1,2,4", "--tp", "4",
            "--all", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["rows"]
    fit = [r for r in rows if r["feasible"]]
    unfit = [r for r in rows if not r["feasible"]]
    assert fit and unfit
    own = {"coverable_layers", "layers", "reason", "even_split"}
    keys = set(fit[0]) - own
    for r in rows:
        assert set(r) - own == keys, sorted(set(r) ^ keys)
    for r in unfit:
        assert all(r[k] is None for k in ("mfu", "iteration_time_s", "breakdown", "stage_breakdown", "idle_share",
                                          "headroom_bytes", "tflops_per_gpu"))
    one = cli(LLAMA, "--gpus", "16", "--global-batch", "64", "--stages", "4", "--tp", "4", "--top", "10")
    assert one.returncode == 0 and "none pruned by bound" in one.stdout and "row 10" not in one.stdout, one.stdout
    row = {**fit[0], "exact": False, "even_split": True, "config": fit[0]["config"]}
    shown = table(SimpleNamespace(rows=[row], searched=1, top=None, pruned=0, unfit=0, skipped=[]))
    assert "(Megatron's even split)" in shown and "local search" not in shown


def test_every_row_runs_in_batches_with_the_same_rows(monkeypatch):
    """A sweep of every row runs its configurations a batch at a time, so their jobs are not all
    held at once (a red team's 2,880 configurations held 9.2 GB); the rows do not change."""
    from gpuknap.sweep import _sweep as sweep_mod

    grid = {"stages": [1, 2, 4], "tensor_parallel": [2, 4, 8], "micro_batch_size": [1, 2], "interleave": [1, 2]}
    whole = sweep(LLAMA, grid, gpus=32, global_batch=64, backend="numpy", bucket=16 * MIB)
    sizes, real = [], sweep_mod.run_configs
    monkeypatch.setattr(sweep_mod, "run_configs", lambda part, *a, **k: sizes.append(len(part)) or real(part, *a, **k))
    monkeypatch.setattr(sweep_mod, "BATCH", 3)
    batched = sweep(LLAMA, grid, gpus=32, global_batch=64, backend="numpy", bucket=16 * MIB)
    assert len(sizes) > 2 and max(sizes) <= 3
    assert json.dumps(batched.rows) == json.dumps(whole.rows) and batched.skipped == whole.skipped
