"""The CLI as a subprocess: shipped examples, SAPP-PPB, JSON against the solvers, exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from paths import EXAMPLES, SAMPLE

from gpuknap import best_splits, choose, pp_lite
from gpuknap.formats import load_spec

DEMO = os.path.join(EXAMPLES, "demo.json")


def run(*args, check_rc=None):
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy"}
    p = subprocess.run([sys.executable, "-m", "gpuknap", *args], capture_output=True, text=True, env=env)
    if check_rc is not None:
        assert p.returncode == check_rc, (p.stdout, p.stderr)
    return p


def test_best_default_example_human_table():
    p = run("best", "--quiet", check_rc=0)
    assert "slowest" in p.stdout and "*" in p.stdout and "total / capacity" in p.stdout


@pytest.mark.parametrize("score", ["slowest", "1f1b", "simulated"])
def test_best_json_matches_solver(score):
    p = run("best", DEMO, "--top", "3", "--score", score, "--json", check_rc=0)
    out = json.loads(p.stdout)
    spec = load_spec(DEMO)
    want = best_splits(spec.model, spec.stages, 3, score, spec.bucket, backend="numpy")
    assert [r["counts"] for r in out["results"]] == [list(c) for c, _, _ in want]
    assert [r["score"] for r in out["results"]] == [s for _, s, _ in want]
    for r, (_, _, choice) in zip(out["results"], want):
        assert [st["time"] for st in r["stages"]] == list(choice.times)
        assert [st["memory_bytes"] for st in r["stages"]] == [c.memory for c in choice.stages]
        assert sum(st["layers"] for st in r["stages"]) == spec.model.layers


def test_best_on_sapp_ppb_sample():
    p = run("best", SAMPLE, "--stages", "16", "--capacity", "56000MB", "--micro-batches", "32", "--json", check_rc=0)
    ref = json.loads(run("best", DEMO, "--json", check_rc=0).stdout)
    assert json.loads(p.stdout)["results"][0]["counts"] == ref["results"][0]["counts"]


def test_rank_csv_and_npy(tmp_path):
    spec = load_spec(DEMO)
    rows = [[4, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 6], [98 - 15] + [1] * 15, [6] * 15 + [8]]
    csv_in = tmp_path / "s.csv"
    csv_in.write_text("# counts\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    npy_out = tmp_path / "scores.npy"
    p = run("rank", DEMO, "--splits", str(csv_in), "--out", str(npy_out), "--json", check_rc=0)
    out = json.loads(p.stdout)
    scores = np.load(npy_out)
    for i, r in enumerate(rows):
        want = pp_lite(spec.model.stages(r), spec.model.fronts, spec.bucket)
        assert scores[i] == (np.inf if want is None else want.slowest)
    assert out["best"]["row"] == int(np.argmin(scores)) and out["feasible"] == int(np.isfinite(scores).sum())
    np.save(tmp_path / "s.npy", np.array(rows))
    p2 = run("rank", DEMO, "--splits", str(tmp_path / "s.npy"), "--out", str(tmp_path / "o.csv"), check_rc=0)
    assert "best: row" in p2.stdout
    assert (tmp_path / "o.csv").read_text().splitlines()[0] == "row,slowest,counts"


def test_curve_json_matches_least_times():
    counts = [4, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 6]
    p = run("curve", DEMO, "--stage", "2", "--counts", ",".join(map(str, counts)), "--points", "7", "--json",
            check_rc=0)
    out = json.loads(p.stdout)
    spec = load_spec(DEMO)
    stage = spec.model.stages(counts)[2]
    assert len(out["points"]) >= 7
    for pt in out["points"]:
        c = choose(stage.groups, spec.model.fronts, pt["budget_bytes"], spec.bucket)
        assert pt["time"] == (None if c is None else c.time)


def test_infeasible_exits_1_in_words(tmp_path):
    p = run("best", DEMO, "--capacity", "1 GiB", check_rc=1)
    assert "no feasible split" in p.stdout


@pytest.mark.parametrize("args, words", [
    (["best", "/nonexistent/spec.json"], "cannot read"),
    (["best", SAMPLE, "--stages", "4"], "capacity"),
    (["rank", DEMO, "--splits", "/nonexistent.csv"], "cannot read"),
    (["best", DEMO, "--backend", "cupy"], "cupy"),
    (["best", DEMO, "--bucket", "3 parsecs"], "bucket"),
])
def test_bad_input_exits_2_with_one_line(args, words):
    p = run(*args)
    if "cupy" in args and p.returncode == 0:
        pytest.skip("CuPy with a GPU is present")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr and words in lines[0].lower()


def test_bad_spec_exits_2_naming_the_field(tmp_path):
    data = json.load(open(DEMO))
    data["kinds"]["BODY"]["options"][2]["backward"] = "soon"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    p = run("best", str(path), check_rc=2)
    assert "kinds.BODY.options[2].backward" in p.stderr and str(path) in p.stderr


def test_rank_bad_row_exits_2_with_row_number(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("4,5,6,6,6,6,6,6,6,6,7,7,7,7,7,6\n1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1\n")
    p = run("rank", DEMO, "--splits", str(path), check_rc=2)
    assert f"{path}: line 2 " in p.stderr  # the file's own line number, 1-based


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "best.png"
    run("best", DEMO, "--top", "2", "--plot", str(out), check_rc=0)
    assert out.stat().st_size > 1000


def test_best_bound_json_matches_the_api():
    p = run("best", DEMO, "--top", "2", "--bucket", "300MiB", "--bound", "--json", check_rc=0)
    out = json.loads(p.stdout)
    spec = load_spec(DEMO, bucket="300MiB")
    want = best_splits(spec.model, spec.stages, 2, "slowest", spec.bucket, backend="numpy", bound=True)
    assert [r["lower_bound"] for r in out["results"]] == [w[3] for w in want]
    for r in out["results"]:
        assert all(st["time_lower_bound"] <= st["time"] for st in r["stages"])
    human = run("best", DEMO, "--bucket", "300MiB", "--bound", check_rc=0).stdout
    assert "exact-bytes optimum >=" in human and ">= bound" in human


def test_best_interleaved_json_plot_and_simulated_times(tmp_path):
    """best --interleave: the same splits as the API, each with its simulated schedule time
    (equal to gpuknap timeline's), and a picture."""
    png = tmp_path / "best.png"
    args = ("best", DEMO, "--capacity", "160GiB", "--stages", "4", "--interleave", "2", "--top", "2",
            "--score", "1f1b")
    out = json.loads(run(*args, "--json", "--plot", str(png), check_rc=0).stdout)
    spec = load_spec(DEMO, capacity="160GiB")
    want = best_splits(spec.model, 4, 2, "1f1b", spec.bucket, backend="numpy", interleave=2)
    assert out["interleave"] == 2 and out["exact"] is True
    assert [r["counts"] for r in out["results"]] == [list(c) for c, _, _ in want]
    assert [r["score"] for r in out["results"]] == [s for _, s, _ in want]
    first = out["results"][0]
    t = json.loads(run("timeline", DEMO, "--capacity", "160GiB", "--interleave", "2", "--counts",
                       ",".join(map(str, first["counts"])), "--json", check_rc=0).stdout)["timeline"]
    assert first["iteration_time_simulated"] == t["iteration_time"]
    assert png.stat().st_size > 10_000
    human = run(*args, check_rc=0).stdout
    assert "4 stages x 2 chunks" in human and "simulated schedule" in human


def test_simulated_score_is_the_timeline_without_sends():
    """On a cost-modelled model (sends between stages), ``best --score simulated`` ranks by
    the schedule without sends: its score is ``timeline --p2p 0``'s iteration time, bit for
    bit, and ``timeline`` without ``--p2p`` (the model's sends) is longer."""
    qwen = os.path.join(EXAMPLES, "qwen2_7b_config.json")
    common = ("--seq", "4096", "--micro-batches", "8")
    best = json.loads(run("best", qwen, *common, "--stages", "4", "--score", "simulated", "--json",
                          check_rc=0).stdout)["results"][0]
    counts = ",".join(map(str, best["counts"]))
    bare = json.loads(run("timeline", qwen, *common, "--counts", counts, "--p2p", "0", "--json",
                          check_rc=0).stdout)["timeline"]["iteration_time"]
    sent = json.loads(run("timeline", qwen, *common, "--counts", counts, "--json",
                          check_rc=0).stdout)["timeline"]["iteration_time"]
    assert best["score"] == bare < sent


def test_best_interleaved_local_search_says_so(tmp_path):
    spec = {"device": {"capacity": "80 GiB"}, "pipeline": {"stages": 2, "micro_batches": 4},
            "kinds": {k: {"static": "1 GiB", "options": [{"name": "none", "memory": "1 GiB",
                                                            "forward": f"{f} ms", "backward": f"{2 * f} ms"}]}
                      for k, f in (("a", 1.0), ("b", 2.0))},
            "layers": [{"kind": k, "count": 2} for k in "abab"]}
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(spec))
    p = run("best", str(path), "--interleave", "2", check_rc=0)
    assert "not proven optimal" in p.stdout
    out = json.loads(run("best", str(path), "--interleave", "2", "--json", check_rc=0).stdout)
    assert out["exact"] is False and out["optimum_lower_bound"] <= out["results"][0]["score"]


def test_best_interleaved_emits_framework_settings():
    """Interleaved plans are written too (issue 20): 2 x 16 virtual stages in Megatron's layout."""
    p = run("best", DEMO, "--capacity", "160GiB", "--interleave", "2", "--emit", "megatron")
    assert p.returncode == 0, p.stderr
    layout = p.stdout.split('--pipeline-model-parallel-layout "')[1].split('"')[0]
    assert layout.count("|") == 31


def test_device_field_memory_takes_a_unit_or_bytes():
    from gpuknap.cli._flags import device_field

    assert device_field("memory=70GiB") == ("memory", 70 * 2**30)
    assert device_field("memory = 75161927680") == ("memory", 75161927680.0)
    assert device_field("peak_flops=1e15") == ("peak_flops", 1e15)


def test_best_interleaved_says_when_megatrons_even_split_simulates_faster(capsys):
    """The 1f1b closed form's best interleaved split can put most layers in one chunk; the even split
    (Megatron's default) is simulated beside it, and the timeline of that split agrees."""
    from gpuknap.cli import main

    flags = [os.path.join(EXAMPLES, "llama2_70b.json"), "--stages", "4", "--tp", "4", "--micro-batch-size", "1",
             "--micro-batches", "64", "--dp", "4", "--interleave", "2", "--quiet"]
    assert main(["best", *flags, "--score", "1f1b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    even = out["even_split"]
    assert even["counts"] == [11] + [10] * 6 + [11]
    assert even["iteration_time_simulated"] < out["results"][0]["iteration_time_simulated"]
    assert main(["timeline", *flags, "--counts", ",".join(map(str, even["counts"])), "--p2p", "0", "--json"]) == 0
    timeline = json.loads(capsys.readouterr().out)["timeline"]
    assert timeline["iteration_time"] == pytest.approx(even["iteration_time_simulated"], rel=1e-9)
    assert main(["best", *flags, "--score", "1f1b"]) == 0
    assert "Megatron's even split [11, 10, 10, 10, 10, 10, 10, 11] simulates to" in capsys.readouterr().out


def test_emit_interleaved_writes_the_even_split_when_it_simulates_faster(capsys, tmp_path):
    from gpuknap.cli import main

    flags = [os.path.join(EXAMPLES, "llama2_70b.json"), "--stages", "4", "--tp", "4", "--micro-batch-size", "1",
             "--micro-batches", "64", "--dp", "4", "--interleave", "2", "--quiet"]
    assert main(["best", *flags, "--score", "1f1b", "--emit", "megatron", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    even = out["even_split"]  # the object best gives, and the emitted plan is that split
    assert even["counts"] == out["results"][0]["counts"] == [11] + [10] * 6 + [11] and out["exact"] is False
    assert even["iteration_time_simulated"] == out["results"][0]["iteration_time_simulated"]
    assert even["iteration_time_s"] == pytest.approx(out["results"][0]["iteration_time_s"], rel=1e-12)
    text = out["settings"]["text"]
    assert '--pipeline-model-parallel-layout "Et*10|t*10|t*10|t*10|t*10|t*10|t*10|t*10L"' in text
    assert "emitted: the even split" in text
    path = tmp_path / "run.sh"
    path.write_text(text)
    assert main(["rank", flags[0], "--tp", "4", "--micro-batch-size", "1", "--dp", "4", "--from", str(path),
                 "--quiet", "--json"]) == 0  # read back: the same split, fitting
    back = json.loads(capsys.readouterr().out)
    assert back["best"]["counts"] == out["results"][0]["counts"] and back["feasible"]


def test_rank_splits_builds_the_cost_model_for_the_splits_stages(capsys, tmp_path):
    """A cost-modelled model depends on its stage count (a tied embedding is held twice with more
    than one stage, DeepSeek's MTP block needs an embedding copy on the last stage): rank --splits
    builds it for the splits' stages."""
    from gpuknap.cli import main

    data = json.load(open(os.path.join(EXAMPLES, "qwen2_7b_config.json")))
    config = tmp_path / "tied.json"
    config.write_text(json.dumps({**data, "tie_word_embeddings": True}))
    counts = [8, 7, 7, 8]
    (tmp_path / "s.csv").write_text(",".join(map(str, counts)) + "\n")
    flags = ["--capacity", "80GiB", "--micro-batches", "8", "--seq", "4096", "--dp", "1", "--quiet"]
    assert main(["rank", str(config), "--splits", str(tmp_path / "s.csv"), "--json", *flags]) == 0
    got = [st["static_bytes"] for st in json.loads(capsys.readouterr().out)["best"]["stages"]]
    keywords = dict(capacity="80GiB", micro_batches=8, seq=4096, data_parallel=1)
    for stages, same in ((4, True), (None, False)):  # built for 4 stages: the same; for one: not
        model = load_spec(str(config), stages=stages, **keywords).model
        bounds = np.cumsum([0] + counts)
        want = [sum(model.static[model.kinds[i]] for i in range(a, b)) for a, b in zip(bounds, bounds[1:])]
        assert (got == pytest.approx(want, rel=1e-12)) == same


def test_timeline_counts_build_the_cost_model_for_their_stages(capsys, tmp_path):
    """timeline --counts without --stages: the cost model is built for the counts' stage count (a
    tied embedding's second copy, the pipeline sends), as with --stages given."""
    from gpuknap.cli import main

    data = json.load(open(os.path.join(EXAMPLES, "qwen2_7b_config.json")))
    config = tmp_path / "tied.json"
    config.write_text(json.dumps({**data, "tie_word_embeddings": True}))
    flags = ["--capacity", "80GiB", "--micro-batches", "8", "--seq", "4096", "--dp", "1", "--quiet", "--json"]
    outs = []
    for extra in ([], ["--stages", "4"]):
        assert main(["timeline", str(config), "--counts", "8,7,7,8", *extra, *flags]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["iteration_time_s"] == outs[1]["iteration_time_s"]
    assert outs[0]["stage_breakdown"] == outs[1]["stage_breakdown"]
    assert all(st["p2p"] > 0 for st in outs[0]["stage_breakdown"])


def test_timeline_counts_other_than_the_spec_stages_are_costed_for_their_own(capsys, tmp_path):
    """A spec's pipeline.stages gives way to --counts: the cost model is rebuilt for the counts'
    stage count, exactly as a spec saying that count."""
    from gpuknap.cli import main

    spec = json.load(open(os.path.join(EXAMPLES, "llama2_70b.json")))
    one, four = tmp_path / "one.json", tmp_path / "four.json"  # one stage: no pipeline sends
    one.write_text(json.dumps({**spec, "pipeline": {**spec["pipeline"], "stages": 1}}))
    four.write_text(json.dumps({**spec, "pipeline": {**spec["pipeline"], "stages": 4}}))
    outs = []
    for path in (one, four):
        assert main(["timeline", str(path), "--counts", "21,20,20,21", "--quiet", "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["iteration_time_s"] == outs[1]["iteration_time_s"]
    assert outs[0]["stage_breakdown"] == outs[1]["stage_breakdown"]
    assert all(st["p2p"] > 0 for st in outs[0]["stage_breakdown"])


def test_micro_batches_suit_the_counts_stages_not_the_specs(capsys, tmp_path):
    """An interleaved spec of 12 stages x 2 chunks given counts of 5 x 2: --micro-batches is checked
    against the 5 stages the counts give (100 runs, as the refusal of the spec's own 96 advises), and
    timeline, curve and rank --splits all score the split exactly as a spec saying 5 stages does."""
    import yaml

    from gpuknap.cli import main

    spec = yaml.safe_load(open(os.path.join(EXAMPLES, "gpt3_175b.yaml")))
    twelve, five = tmp_path / "twelve.yaml", tmp_path / "five.yaml"
    twelve.write_text(yaml.safe_dump({**spec, "pipeline": {**spec["pipeline"], "interleave": 2}}))
    five.write_text(yaml.safe_dump({**spec, "pipeline": {**spec["pipeline"], "interleave": 2, "stages": 5}}))
    counts = "1,11,11,11,11,11,11,11,11,9"
    (tmp_path / "s.csv").write_text(counts + "\n")
    assert main(["rank", str(twelve), "--splits", str(tmp_path / "s.csv"), "--quiet"]) == 2
    assert "95 or 100 would do" in capsys.readouterr().err
    for command in (["timeline", "--counts", counts], ["curve", "--counts", counts, "--stage", "3"],
                    ["rank", "--splits", str(tmp_path / "s.csv")]):
        outs = []
        for path in (twelve, five):
            assert main([command[0], str(path), *command[1:], "--micro-batches", "100", "--quiet", "--json"]) == 0
            outs.append(json.loads(capsys.readouterr().out))
        for out in outs:
            out.pop("source")
        assert outs[0] == outs[1]


@pytest.mark.parametrize("v", [2, 16])
def test_best_and_the_sweep_agree_on_the_even_split(capsys, v):
    """best --interleave takes Megatron's even split as faster exactly when the sweep ranks it
    first: both compare the runs' times, sends and tails included (a near tie at v = 16, where
    the simulated times without sends order the two the other way)."""
    from gpuknap import sweep
    from gpuknap.cli import main

    config = os.path.join(EXAMPLES, "llama2_7b_config.json")
    rows = sweep(config, {"stages": [2], "tensor_parallel": [4], "micro_batch_size": [2], "interleave": [v]},
                 gpus=32, global_batch=64, seq=4096).rows
    assert main(["best", config, "--seq", "4096", "--stages", "2", "--tp", "4", "--interleave", str(v),
                 "--micro-batch-size", "2", "--micro-batches", "8", "--dp", "4", "--score", "1f1b", "--quiet",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    even = out.get("even_split")
    assert bool(rows[0].get("even_split")) == (even is not None)
    first = even["iteration_time_s"] if even else out["results"][0]["iteration_time_s"]
    assert first == pytest.approx(rows[0]["iteration_time_s"], rel=1e-12)


def test_an_even_split_that_ties_but_for_rounding_does_not_replace_the_search(capsys):
    """A red team's case (2026-12-03): Megatron's even split of this configuration runs in the
    same time as the search's best but for the last bit (sums of the same times in another order),
    and simulates slower; neither ``best`` nor the sweep may put it first (EVEN_MARGIN), while
    their comparison of the two times, read from their own output, agrees to 1e-15."""
    from gpuknap import sweep
    from gpuknap.cli import main
    from gpuknap.search import EVEN_MARGIN, even_is_faster

    assert even_is_faster(1.0 - 2 * EVEN_MARGIN, 1.0) and not even_is_faster(1.0 - EVEN_MARGIN / 2, 1.0)
    config = os.path.join(EXAMPLES, "mixtral_small_config.json")
    common = ["--seq", "4096", "--stages", "2", "--interleave", "2", "--tp", "2", "--ep", "2", "--etp", "1",
              "--capacity", "24GiB"]
    assert main(["best", config, *common, "--micro-batches", "8", "--dp", "4", "--score", "1f1b", "--top", "3",
                 "--quiet", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "even_split" not in out
    even = [r for r in out["results"] if r["counts"] == [5, 4, 4, 5]]
    if even:  # found by the search itself: its time is the best's but for rounding
        assert even[0]["iteration_time_s"] == pytest.approx(out["results"][0]["iteration_time_s"], rel=1e-15)
    rows = sweep(config, {"stages": [2], "tensor_parallel": [2], "expert_parallel": [2], "expert_tensor_parallel": [1],
                          "interleave": [2]}, gpus=16, global_batch=32, seq=4096, capacity="24GiB", top_splits=2).rows
    assert not any(r.get("even_split") for r in rows) and all(r["exact"] for r in rows)
    assert [r["counts"] for r in rows if r["rank"] == 1] == [out["results"][0]["counts"]]


def test_an_infeasible_interleaved_best_says_why_as_the_sweep_does(capsys):
    """``coverable_layers`` is a bound only without interleaving: an infeasible interleaved ``best``
    writes null (it wrote every layer, which claims they fit) and the even split's stage furthest
    over, as the sweep's row for the same configuration does (a red team, 2026-12-03)."""
    from gpuknap import sweep
    from gpuknap.cli import main

    spec = os.path.join(EXAMPLES, "llama2_70b.json")
    assert main(["best", spec, "--stages", "2", "--tp", "4", "--micro-batch-size", "4", "--micro-batches", "16",
                 "--dp", "4", "--interleave", "2", "--capacity", "40GiB", "--json", "--quiet"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["results"] == [] and out["coverable_layers"] is None
    (row,) = sweep(spec, {"stages": [2], "tensor_parallel": [4], "micro_batch_size": [4], "interleave": [2]},
                   gpus=32, global_batch=256, capacity="40GiB").rows
    assert row["coverable_layers"] is None and not row["feasible"]
    assert main(["best", spec, "--stages", "2", "--tp", "4", "--micro-batch-size", "4", "--micro-batches", "16",
                 "--dp", "4", "--interleave", "2", "--capacity", "40GiB", "--quiet"]) == 1
    text = capsys.readouterr().out.strip()
    assert text.endswith(row["reason"]), (text, row["reason"])


def test_a_sweeps_json_says_the_one_device_it_ran_on(capsys):
    """``sweep --device b200`` (one name: the source's device) records it at the top of the JSON, and
    its rows are those of a grid listing that device (a red team found only the rows' commands
    saying b200, 2026-12-03)."""
    from gpuknap import sweep
    from gpuknap.cli import main

    spec = os.path.join(EXAMPLES, "llama2_70b.json")
    assert main(["sweep", spec, "--gpus", "64", "--global-batch", "256", "--stages", "2,4", "--tp", "4,8", "--device",
                 "b200", "--all", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == "b200" and out["dispatcher"] == "alltoall" and "device" not in out["grid"]
    listed = sweep(spec, {"stages": [2, 4], "tensor_parallel": [4, 8], "device": ["b200"]}, gpus=64,
                   global_batch=256).rows
    assert [r["iteration_time_s"] for r in out["rows"]] == [r["iteration_time_s"] for r in listed]
    assert main(["sweep", spec, "--gpus", "64", "--global-batch", "256", "--stages", "2,4", "--tp", "4,8", "--device",
                 "h100,b200", "--top", "2", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] is None and out["grid"]["device"] == ["h100", "b200"]


def test_byte_fields_are_written_the_same_however_the_size_was_given(capsys):
    """A bucket read as ``1MiB`` (a float) and the default (an int), a capacity from the spec and
    from ``--device h100``: the same JSON text, every whole ``*_bytes`` value an integer (a red
    team found ``1048576`` and ``1048576.0`` for the same question, 2026-12-03)."""
    from gpuknap.cli import main

    def text(*argv):
        assert main([*argv, "--json", "--quiet"]) in (0, 1)
        return capsys.readouterr().out

    config = os.path.join(EXAMPLES, "llama2_7b_config.json")
    plan = ["best", config, "--capacity", "80GiB", "--stages", "2", "--micro-batches", "8", "--seq", "4096", "--tp", "8",
            "--dp", "1"]
    assert text(*plan) == text(*plan, "--bucket", "1MiB") == text(*plan, "--bucket", "1048576")
    spec = os.path.join(EXAMPLES, "llama2_70b.json")
    assert text("best", spec) == text("best", spec, "--device", "h100")
    sweep = ["sweep", spec, "--gpus", "64", "--global-batch", "256", "--stages", "4", "--tp", "8", "--all"]
    plain, given = (json.loads(text(*sweep, *extra)) for extra in ((), ("--bucket", "1MiB")))
    for out in (plain, given):
        for row in [*out["rows"], out["best"]]:
            row.pop("command")  # which says --bucket when given
    assert plain == given and json.dumps(plain) == json.dumps(given)

    def fields(value, key=""):
        if isinstance(value, dict):
            for k, v in value.items():
                yield from fields(v, k)
        elif isinstance(value, list):
            for v in value:
                yield from fields(v, key)
        elif key.endswith("_bytes") and isinstance(value, float):
            yield key, value

    for out in (text(*plan), text(*sweep), text("timeline", spec)):
        assert not [f for f in fields(json.loads(out)) if f[1].is_integer()]


def test_rank_scores_each_distinct_split_once_with_the_same_answers(tmp_path, monkeypatch, capsys):
    """Repeated splits over several blocks: the scores and the best row (the first of the least
    score) are those of one batch of every row (a red-team round found a file repeating one split
    solved again in every block of 250,000 rows)."""
    from gpuknap.cli import _commands, main  # noqa: PLC0415

    spec = load_spec("gpuknap/examples/demo.json")
    rng = np.random.default_rng(3)
    rows = [np.diff(np.concatenate(([0], np.sort(rng.choice(np.arange(1, 98), 15, replace=False)), [98])))
            for _ in range(300)]
    splits = np.array(rows)[rng.integers(0, 300, 1000)]
    np.save(tmp_path / "rep.npy", splits)
    monkeypatch.setattr(_commands, "RANK_BLOCK", 64)
    assert main(["rank", "gpuknap/examples/demo.json", "--splits", str(tmp_path / "rep.npy"), "--out",
                 str(tmp_path / "out.npy"), "--json", "--quiet"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = spec.model.rank(splits, spec.bucket, "numpy").slowest
    assert np.array_equal(np.load(tmp_path / "out.npy").reshape(len(splits), -1)[:, -1], want)
    assert got["best"]["row"] == int(np.argmin(want)) and got["best"]["counts"] == splits[np.argmin(want)].tolist()


def test_rank_max_work_caps_the_whole_file_not_each_block(tmp_path, monkeypatch, capsys):
    """``--max-work`` is the limit on the whole file: after the first block, a file whose blocks
    together need more is refused (exit 2, one line) before the other blocks run; within the
    limit, the same file is scored."""
    from gpuknap.cli import _commands, main  # noqa: PLC0415
    from gpuknap.engine import counting  # noqa: PLC0415

    spec = load_spec("gpuknap/examples/demo.json")
    rng = np.random.default_rng(5)
    rows = {tuple(np.diff(np.concatenate(([0], np.sort(rng.choice(np.arange(1, 98), 15, replace=False)), [98]))))
            for _ in range(200)}
    splits = np.array(sorted(rows))
    np.save(tmp_path / "many.npy", splits)
    block = 50
    with counting() as spent:
        spec.model.rank(splits[:block], spec.bucket, "numpy")
    assert spent[0] > 0
    monkeypatch.setattr(_commands, "RANK_BLOCK", block)
    ran = []
    real = type(spec.model).rank
    monkeypatch.setattr(type(spec.model), "rank", lambda self, *a, **k: ran.append(1) or real(self, *a, **k))
    argv = ["rank", "gpuknap/examples/demo.json", "--splits", str(tmp_path / "many.npy"), "--quiet"]
    assert main(argv + ["--max-work", str(2 * spent[0])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-work" in err[0] and f"{len(splits):,} distinct splits" in err[0], err
    assert len(ran) == 1  # refused after the first block
    ran.clear()
    assert main(argv + ["--max-work", str(100 * spent[0])]) in (0, 1)  # scored (1: none of them fits)
    assert len(ran) == 4 and "DP cells" not in capsys.readouterr().err


def test_curve_of_an_interleaved_spec_searches_its_chunks(tmp_path, capsys):
    """``curve`` without ``--counts`` on an interleaved spec takes the best interleaved split (it
    had searched one chunk with the spec's two-chunk in-flight table and failed), the same curve
    as ``--counts`` of that split."""
    from gpuknap.cli import main  # noqa: PLC0415

    spec = {"layers": [{"kind": "B", "count": 12}],
            "kinds": {"B": {"static": "1 GiB", "options": [{"name": "N", "memory": "1 GiB", "forward": 1, "backward": 2},
                                                           {"name": "F", "memory": "0.1 GiB", "forward": 1,
                                                            "backward": 3}]}},
            "device": {"capacity": "20 GiB"}, "pipeline": {"stages": 3, "micro_batches": 6, "interleave": 2}}
    path = tmp_path / "il.json"
    path.write_text(json.dumps(spec))
    found = best_splits(load_spec(str(path)).model, 3, 1, "slowest", interleave=2)
    counts = ",".join(map(str, found[0][0]))
    assert main(["curve", str(path), "--stage", "1", "--json"]) == 0
    searched = json.loads(capsys.readouterr().out)
    assert main(["curve", str(path), "--stage", "1", "--counts", counts, "--json"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert searched["counts"] == list(found[0][0]) and searched["points"] == given["points"]


@pytest.mark.parametrize("designed, limit, refused", [
    ([10, 1000, 1000], 1500, "for the first 100 distinct splits"),  # cheap first: the third block is refused
    ([5440, 0], 6000, None),  # 51 splits: the estimate scales by rows, not whole blocks, and the file fits
    ([3000, 10, 10], 6000, "distinct splits need about"),  # refused after the first block, by estimate
])
def test_rank_max_work_is_a_total_over_the_blocks(tmp_path, monkeypatch, capsys, designed, limit, refused):
    """Blocks whose DP cells are set here (each block's real solve is counted apart): a block over
    what the earlier ones left is refused before it runs, and the first block's cells scaled by
    rows refuse a file early; a file within the limit is scored."""
    from gpuknap.cli import _commands, main  # noqa: PLC0415
    from gpuknap.engine import check_work, counting, work_limit  # noqa: PLC0415

    rng = np.random.default_rng(11)
    rows: set = set()
    while len(rows) < 50 * (len(designed) - 1) + (1 if refused is None else 50):
        rows.add(tuple(np.diff(np.concatenate(([0], np.sort(rng.choice(np.arange(1, 98), 15, replace=False)),
                                               [98])))))
    np.save(tmp_path / "s.npy", np.array(sorted(rows)))
    monkeypatch.setattr(_commands, "RANK_BLOCK", 50)
    model_type = type(load_spec("gpuknap/examples/demo.json").model)
    real, calls = model_type.rank, []

    def rank(self, splits, bucket, *a, **k):
        check_work(designed[len(calls)], bucket)  # the block's designed cells, against the limit left
        calls.append(len(splits))
        with counting(), work_limit(10**15):  # the real solve, counted apart
            return real(self, splits, bucket, *a, **k)

    monkeypatch.setattr(model_type, "rank", rank)
    rc = main(["rank", "gpuknap/examples/demo.json", "--splits", str(tmp_path / "s.npy"), "--quiet",
               "--max-work", str(limit)])
    err = capsys.readouterr().err.strip().splitlines()
    if refused is None:
        assert rc in (0, 1) and not err and len(calls) == -(-len(rows) // 50)
    else:
        assert rc == 2 and len(err) == 1 and refused in err[0] and "--max-work" in err[0], err


def test_rank_reads_whole_number_floats_as_counts(tmp_path, capsys):
    """A .npy of float counts that are whole numbers scores as the integers would (it was refused
    later without the file's name)."""
    from gpuknap.cli import main  # noqa: PLC0415

    splits = np.array([[6] * 14 + [7, 7], [7, 7] + [6] * 14])
    np.save(tmp_path / "i.npy", splits)
    np.save(tmp_path / "f.npy", splits.astype(np.float64))
    outs = []
    for name in ("i.npy", "f.npy"):
        assert main(["rank", "gpuknap/examples/demo.json", "--splits", str(tmp_path / name), "--json"]) in (0, 1)
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["best"] == outs[1]["best"] and outs[0]["feasible"] == outs[1]["feasible"]


def test_a_suggested_bucket_passes_the_limit_that_suggested_it(capsys):
    """The batch path: a bucket too fine for the working memory, then for one call's work limit;
    each suggestion passes the limit that made it.  The command's calls also count together
    (``command_budget``): a refusal at their total knows only the calls so far, so its bucket is a
    lower bound, and may be followed by one more; three reruns at most reach an answer."""
    from gpuknap.cli import main  # noqa: PLC0415
    import re  # noqa: PLC0415

    bucket, seen, sizes = "1 B", [], []
    units = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    for _ in range(4):
        rc = main(["best", "gpuknap/examples/demo.json", "--quiet", "--max-work", "1e6", "--bucket", bucket])
        err = capsys.readouterr().err
        if rc != 2:
            break
        which = "memory" if "working memory" in err else "total" if "count together" in err else "work"
        assert which not in seen, err  # the limit that suggested the last bucket does not refuse it
        seen.append(which)
        number, unit = re.search(r"at least ([\d.]+) (bytes|KiB|MiB|GiB)", err).groups()
        sizes.append(float(number) * units[unit])
        bucket = f"{number} {'B' if unit == 'bytes' else unit}"
    assert rc in (0, 1) and len(seen) <= 3 and sizes == sorted(sizes)


@pytest.mark.parametrize("argv", [
    ["curve", "gpuknap/examples/demo.json", "--stage", "1", "--counts", "5,5,5,6,6,6,6,6,6,6,7,7,7,7,7,6",
     "--bucket", "1 KiB"],
    ["timeline", "gpuknap/examples/demo.json", "--counts", "5,5,5,6,6,6,6,6,6,6,7,7,7,7,7,6", "--bucket", "4 KiB"]])
def test_max_memory_holds_single_stage_solves(argv, capsys):
    """``--max-memory`` holds the single-stage solves of curve and timeline too (they took 0.6-1.5 GB
    under ``--max-memory 1MiB``): refused before any table is built, naming the flag; with the
    suggested bucket the command runs."""
    import re  # noqa: PLC0415

    from gpuknap.cli import main  # noqa: PLC0415

    assert main(argv + ["--max-memory", "1 MiB", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-memory" in err[0] and "over 1 MiB" in err[0] and "least_times" not in err[0]
    number, unit = re.search(r"at least ([\d.]+) (KiB|MiB)", err[0]).groups()
    bucket_at = argv.index("--bucket") + 1
    argv = argv[:bucket_at] + [f"{number} {unit}"] + argv[bucket_at + 1:]
    assert main(argv + ["--max-memory", "1 MiB", "--quiet"]) in (0, 1)


@pytest.mark.parametrize("command, extra", [("curve", ["--stage", "0"]), ("timeline", [])])
def test_curve_and_timeline_answer_in_json_when_nothing_fits(command, extra, capsys):
    """With ``--json`` and no split that fits, curve and timeline print their JSON (no split) and exit
    1, as best does; without it, one sentence on stdout."""
    from gpuknap.cli import main  # noqa: PLC0415

    argv = [command, "gpuknap/examples/demo.json", *extra, "--capacity", "2GiB"]
    assert main(argv + ["--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["command"] == command and got["counts"] is None
    assert main(argv) == 1
    out = capsys.readouterr()
    assert "no feasible split" in out.out and "fits the device memory" in out.out and not out.err


def test_a_capacity_without_its_unit_is_pointed_out_when_nothing_fits(tmp_path, capsys):
    """A spec's ``capacity: 80`` is 80 bytes; when nothing fits, the answer says so."""
    from gpuknap.cli import main  # noqa: PLC0415

    spec = json.load(open(DEMO))
    spec["device"]["capacity"] = 80
    (tmp_path / "s.json").write_text(json.dumps(spec))
    assert main(["best", str(tmp_path / "s.json")]) == 1
    assert "its capacity is 80 bytes" in capsys.readouterr().out
    spec["device"]["capacity"] = "80 GiB"
    (tmp_path / "s.json").write_text(json.dumps(spec))
    assert main(["best", str(tmp_path / "s.json"), "--capacity", "2GiB"]) == 1
    assert "without a unit" not in capsys.readouterr().out


def test_counts_in_sentences_agree_with_their_nouns():
    from gpuknap.cli._flags import plural  # noqa: PLC0415
    assert [plural(n, "configuration") for n in (0, 1, 2, 1500)] == [
        "0 configurations", "1 configuration", "2 configurations", "1,500 configurations"]


def test_rank_splits_of_other_stages_than_the_spec_are_costed_for_their_own(capsys, tmp_path):
    """rank --splits follows timeline's rule: the spec's pipeline.stages gives way to the splits'
    width (the model rebuilt as a spec saying that count would build it); a pipeline.in_flight
    table written for the spec's own stage count is still refused by name."""
    import yaml

    from gpuknap.cli import main

    src = os.path.join(EXAMPLES, "gpt3_175b.yaml")
    spec = yaml.safe_load(open(src))
    eight = tmp_path / "eight.yaml"
    eight.write_text(yaml.safe_dump({**spec, "pipeline": {**spec["pipeline"], "stages": 8}}))
    splits = tmp_path / "s.csv"
    splits.write_text("13,12,12,12,12,12,12,13\n12,12,12,12,12,12,13,13\n")
    outs = []
    for path in (src, eight):
        assert main(["rank", str(path), "--splits", str(splits), "--quiet", "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out)["best"])
    assert outs[0] == outs[1] and outs[0]["counts"] == [13, 12, 12, 12, 12, 12, 12, 13]
    demo = json.load(open(os.path.join(EXAMPLES, "demo.json")))
    table = tmp_path / "table.json"
    table.write_text(json.dumps({**demo, "pipeline": {**demo["pipeline"], "in_flight": [[16 - s] for s in range(16)]}}))
    (tmp_path / "d.csv").write_text("13,12,12,12,12,12,12,13\n")
    assert main(["rank", str(table), "--splits", str(tmp_path / "d.csv"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the spec's pipeline needs 16" in err and "rebuilt for 8 stages" in err and "pipeline.in_flight" in err
    assert len(err.strip().splitlines()) == 1


def test_timeline_of_a_run_that_does_not_fit_says_where_and_its_time_memory_aside(capsys):
    """A run as it was run (--recompute) whose split the memory model does not fit: exit 1, the
    stage furthest over and what it needs, and the run's time as if it fitted, equal to the same
    run on a device large enough (time does not depend on capacity); a plan still to be chosen
    (no --recompute) gets no time."""
    from gpuknap.cli import main

    config = os.path.join(EXAMPLES, "llama2_7b_config.json")
    flags = ["--seq", "4096", "--tp", "2", "--dp", "4", "--micro-batches", "16", "--counts", "9,8,8,9", "--json",
             "--quiet"]
    assert main(["timeline", config, *flags, "--recompute", "none", "--capacity", "200GiB"]) == 0
    fits = json.loads(capsys.readouterr().out)
    assert main(["timeline", config, *flags, "--recompute", "none", "--capacity", "9GiB"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["timeline"] is None and out["unfit"]["needed_bytes"] > out["unfit"]["capacity_bytes"] == 9 * 2**30
    assert out["unfit"]["fits_in_exact_bytes"] is False
    run = out["run_if_it_fitted"]
    for key in ("iteration_time_s", "mfu", "tflops_per_gpu", "gpus", "breakdown", "stage_breakdown"):
        assert run[key] == fits[key], key
    assert main(["timeline", config, *flags, "--capacity", "9GiB"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["run_if_it_fitted"] is None and out["unfit"]["stage"] in range(4)
    assert main(["timeline", config, *flags[:-2], "--recompute", "none", "--capacity", "9GiB", "--quiet"]) == 1
    text = capsys.readouterr().out
    assert "does not fit the device memory: stage" in text and "if it fitted (memory aside)" in text
    assert "MiB over" in text


@pytest.mark.parametrize("name, dense, moe", [("moe_act", "NONE", "MOEACT"),
                                              ("selective+moe_act", "SLCT", "SLCT+MOEACT")])
def test_timeline_recompute_moe_act_is_megatrons_recompute_modules(capsys, name, dense, moe):
    """--recompute moe_act (Megatron's --recompute-modules moe_act, with core_attn for
    selective+moe_act) runs MoE layers MOEACT and dense layers as Megatron leaves them: the same
    run as the kinds' options fixed one by one through the API; a dense model refuses it."""
    from gpuknap.cli import main
    from gpuknap.costs import estimate, fixed
    from gpuknap.formats import load_spec

    config = os.path.join(EXAMPLES, "deepseek_v3_small_config.json")
    flags = ["--seq", "4096", "--stages", "2", "--micro-batches", "8", "--dp", "1"]
    assert main(["timeline", config, *flags, "--recompute", name, "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    model = fixed(load_spec(config, seq=4096, stages=2, micro_batches=8, data_parallel=1).model,
                  {"dense": dense, "moe": moe})
    counts = out["timeline"]["counts"]
    run = estimate(model, counts, [model.fronts[k][0].name for k in model.kinds])
    assert out["iteration_time_s"] == run.iteration_time and out["breakdown"] == run.breakdown
    llama = os.path.join(EXAMPLES, "llama2_7b_config.json")
    assert main(["timeline", llama, *flags, "--recompute", name, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--recompute" in err[0] and "no MoE layers" in err[0]


def test_emit_of_a_moe_model_with_fixed_recompute_states_its_expert_parallelism(capsys, tmp_path):
    """With --recompute full every MoE layer keeps only FULL, no MOEACT option: the emitted run still
    knows the model has experts (from their parameters), so the block writes the EP sizes, grouped
    GEMM and the dispatcher the plan assumed, and reads back to the same score."""
    from gpuknap.cli import main

    config = os.path.join(EXAMPLES, "mixtral_small_config.json")
    flags = ["--seq", "4096", "--micro-batches", "8", "--ep", "2", "--dp", "2", "--quiet"]
    assert main(["best", config, "--stages", "2", *flags, "--recompute", "full", "--emit", "megatron"]) == 0
    block = capsys.readouterr().out
    for line in ("--expert-model-parallel-size 2", "--expert-tensor-parallel-size 1", "--moe-grouped-gemm",
                 "--moe-token-dispatcher-type alltoall", "--recompute-granularity full"):
        assert line in block, line
    assert main(["best", config, "--stages", "2", *flags, "--recompute", "full", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["results"][0]
    (tmp_path / "run.sh").write_text(block)
    assert main(["rank", config, "--from", str(tmp_path / "run.sh"), *flags[:-3], "--dp", "2", "--quiet",
                 "--json"]) == 0
    back = json.loads(capsys.readouterr().out)["best"]
    assert back["counts"] == best["counts"] and back["score"] == best["score"]


@pytest.mark.parametrize("score", ["1f1b", "slowest"])
def test_an_interleaved_records_1f1b_time_is_its_score_or_the_exact_closed_form(score):
    """Interleaved 1F1B: a record scored by 1f1b carries its own score as iteration_time_1f1b
    (float sums of the closed form can be an ulp off it: GPT-3 175B on 6 x 2 was); other
    records carry ((vM - 1) * slowest + sum) / v computed exactly and rounded once."""
    from fractions import Fraction  # noqa: PLC0415

    path = os.path.join(EXAMPLES, "gpt3_175b.yaml")
    out = json.loads(run("best", path, "--stages", "6", "--interleave", "2", "--score", score, "--top", "5",
                         "--json", check_rc=0).stdout)
    m = out["micro_batches"]
    for r in out["results"]:
        times = [Fraction(s["time"]) for s in r["stages"]]
        exact = float(((2 * m - 1) * max(times) + sum(times)) / 2)
        assert r["iteration_time_1f1b"] == (r["score"] if score == "1f1b" else exact)
        assert abs(r["iteration_time_1f1b"] - exact) <= 2 * np.spacing(exact)


def test_emitted_plans_carry_their_simulated_time(capsys):
    """--emit's records have iteration_time_simulated like best's: for a plain pipeline whose
    constrained plan is best's, the two are equal."""
    from gpuknap.cli import main

    flags = [os.path.join(EXAMPLES, "llama2_7b_config.json"), "--capacity", "80GiB", "--stages", "8",
             "--micro-batches", "32", "--seq", "4096", "--tp", "8", "--dp", "1", "--quiet", "--json"]
    assert main(["best", *flags, "--emit", "megatron"]) == 0
    emitted = json.loads(capsys.readouterr().out)["results"][0]
    assert main(["best", *flags]) == 0
    best = json.loads(capsys.readouterr().out)["results"][0]
    assert emitted["counts"] == best["counts"] and emitted["iteration_time_simulated"] == best[
        "iteration_time_simulated"]


def test_megatron_settings_read_back_with_the_specs_own_data_parallel_size(capsys, tmp_path):
    """llama2_70b.json's preset trains with DP 8; its Megatron block (which cannot say DP) read
    back without --dp takes the spec's 8, so the micro-batches and the run are the plan's (it took
    DP 1 for the micro-batches and 8 for the GPUs, 7.4x slower); --dp still decides."""
    from gpuknap.cli import main

    spec = os.path.join(EXAMPLES, "llama2_70b.json")
    assert main(["best", spec, "--quiet", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert main(["best", spec, "--quiet", "--emit", "megatron"]) == 0
    path = tmp_path / "run.sh"
    path.write_text(capsys.readouterr().out)
    assert main(["rank", spec, "--from", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    back = json.loads(captured.out)
    assert back["micro_batches"] == best["micro_batches"] == 64
    assert back["best"]["counts"] == best["results"][0]["counts"]
    assert back["best"]["iteration_time_s"] == pytest.approx(best["results"][0]["iteration_time_s"], rel=1e-12)
    said = [line for line in captured.err.splitlines() if "data-parallel size" in line]
    assert len(said) == 1 and "the spec's 8 is used" in said[0]
    assert main(["rank", spec, "--from", str(path), "--dp", "2", "--json", "--quiet"]) in (0, 1)  # less sharding
    assert json.loads(capsys.readouterr().out)["micro_batches"] == 2048 // (4 * 2)


def test_a_splits_file_too_large_for_the_memory_is_refused_before_it_is_ranked(capsys, tmp_path, monkeypatch):
    """rank --splits estimates the memory ranking the file holds (the 64-bit counts, hashes, scores
    and codes) and refuses, in one line, what the machine does not have (a red team's 100 million
    int8 rows, inside the 2 GiB file limit, ran out of memory part way)."""
    from gpuknap.cli import _commands, main
    from gpuknap.formats.splitfiles import rank_bytes

    splits = np.array([[49, 49], [48, 50], [50, 48]] * 100, dtype=np.int8)
    np.save(tmp_path / "s.npy", splits)
    argv = ["rank", DEMO, "--splits", str(tmp_path / "s.npy"), "--quiet"]
    monkeypatch.setattr(_commands, "available_host_bytes", lambda: rank_bytes(300, 2) - 1)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "300 splits of 2 counts" in err[0] and "rank the file in parts" in err[0], err
    monkeypatch.setattr(_commands, "available_host_bytes", lambda: rank_bytes(300, 2))
    assert main(argv) in (0, 1)  # ranked (2 stages of the demo may not fit: exit 1)
    assert "memory" not in capsys.readouterr().err


def test_the_work_limit_holds_a_whole_command(tmp_path, capsys):
    """A red team (2026-12-03) ran ``timeline`` on 16 stages, each within ``--max-work`` alone, for 13x
    the limit, and ``best --top 1000`` for 10x its estimate: a command's DP calls now count together.
    The stages of one plan are sized before any runs (refused at once, naming a bucket at which the
    command runs), and ``sweep --max-memory`` is taken as the integer it is."""
    import re  # noqa: PLC0415

    from gpuknap.cli import main  # noqa: PLC0415

    options = [{"name": n, "memory": f"{m} MB", "forward": "90 ms", "backward": f"{b} ms"}
               for n, m, b in (("NONE", 100, 180), ("SLCT", 60, 187.2), ("COMM", 20, 202.5), ("BOTH", 4, 209.7))]
    spec = {"name": "big", "layers": [{"kind": "BODY", "count": 1600}],
            "kinds": {"BODY": {"static": "1 MB", "options": options}}, "device": {"capacity": "20000 MB"},
            "pipeline": {"stages": 16, "micro_batches": 32}}
    path = tmp_path / "big.json"
    path.write_text(json.dumps(spec))
    counts = ",".join(["100"] * 16)
    rc = main(["timeline", str(path), "--counts", counts, "--bucket", "64KiB", "--max-work", "1e8", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "planning 16 stages needs" in err[0] and "count together" in err[0], err
    assert "earlier DP calls" not in err[0]  # refused before any of the stages' DP ran (none counted)
    advised = re.search(r"at least ([\d.]+) (KiB|MiB)", err[0]).groups()
    assert main(["timeline", str(path), "--counts", counts, "--bucket", " ".join(advised), "--max-work", "1e8",
                 "--quiet"]) == 0
    capsys.readouterr()
    from gpuknap.engine import check_work, command_budget, work_limit  # noqa: PLC0415
    with work_limit(100), command_budget():
        check_work(60, 1.0, "a call")
        with pytest.raises(ValueError, match="earlier DP calls used 60: 120 in all, over the work limit of 100"):
            check_work(60, 1.0, "a call")
    assert main(["sweep", os.path.join(EXAMPLES, "llama2_70b.json"), "--gpus", "64", "--global-batch", "256", "--stages", "4", "--tp", "8",
                 "--max-memory", "1GiB", "--all", "--quiet"]) == 0
