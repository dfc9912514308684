"""Training settings out and back: MindFormers and Megatron, read back equal to the plan; the
closest setting for plans a framework cannot run; the layout syntax as Megatron reads it."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import yaml
from paths import EXAMPLES

from gpuknap import best_splits
from gpuknap.formats import emit, framework, load_spec, megatron, mindformers, read_settings, restrict
from gpuknap.formats.framework import framework_plan
from gpuknap.search import constrained_splits, with_grouped

DEMO = os.path.join(EXAMPLES, "demo.json")
CONFIGS = ["llama2_7b_config.json", "mixtral_small_config.json", "deepseek_v3_small_config.json"]
ISSUE_ARGS = ["--capacity", "80GiB", "--stages", "8", "--micro-batches", "32", "--seq", "4096", "--tp", "8"]
TIGHT_ARGS = ["--capacity", "16GiB", "--stages", "4", "--micro-batches", "32", "--seq", "8192",
              "--micro-batch-size", "4", "--tp", "8"]


def cli(*args):
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy"}
    return subprocess.run([sys.executable, "-m", "gpuknap", *args], capture_output=True, text=True, env=env)


def spec_of(config, args):
    kw = dict(zip(args[::2], args[1::2]))
    return load_spec(os.path.join(EXAMPLES, config), capacity=kw["--capacity"],
                     micro_batches=int(kw["--micro-batches"]), stages=int(kw["--stages"]), seq=int(kw["--seq"]),
                     tensor_parallel=int(kw["--tp"]), micro_batch=int(kw.get("--micro-batch-size", 1)))


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("args", [ISSUE_ARGS, TIGHT_ARGS], ids=["issue", "tight"])
def test_emitted_settings_read_back_as_the_constrained_plan(config, args, tmp_path):
    spec = spec_of(config, args)
    for name, suffix in (("mindformers", ".yaml"), ("megatron", ".sh")):
        p = cli("best", os.path.join(EXAMPLES, config), *args, "--emit", name, "--json")
        if p.returncode == 1:  # nothing fits this model under these settings: said so
            continue
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        path = tmp_path / f"{name}{suffix}"
        path.write_text(out["settings"]["text"])
        counts, names = read_settings(str(path)).split(spec.model)
        plan = constrained_splits(spec.model, spec.stages, name, 1, "slowest", spec.bucket, "numpy")
        assert (counts, names) == (list(plan[0][0]), plan[0][3])
        ev = framework.evaluate(with_grouped(spec.model), counts, names)
        assert ev.feasible and math.isclose(ev.slowest, out["results"][0]["score"], rel_tol=1e-12)
        assert "no single setting runs this plan exactly" not in out["settings"]["text"]
        free = best_splits(spec.model, spec.stages, 1, "slowest", spec.bucket, "numpy")
        assert out["settings"]["unconstrained_score"] == free[0][1] <= out["results"][0]["score"]


def test_sapp_demo_mindformers_offset_rule_and_rank_from(tmp_path):
    p = cli("best", DEMO, "--emit", "mindformers")
    assert p.returncode == 0, p.stderr
    path = tmp_path / "mf.yaml"
    path.write_text(p.stdout)
    spec = load_spec(DEMO)
    found = constrained_splits(spec.model, 16, "mindformers", backend="numpy")
    counts, score, _, names, _ = found[0]
    offset = yaml.safe_load(p.stdout)["model"]["model_config"]["offset"]
    decoders = [c - (i == 0) - (i == len(counts) - 1) for i, c in enumerate(counts)]
    assert sum(offset) == 96 % 16 and [96 // 16 + o for o in offset] == decoders
    assert mindformers.load(str(path)).split(spec.model) == (list(counts), names)
    r = cli("rank", DEMO, "--from", str(path), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["feasible"] and math.isclose(out["best"]["slowest"], score, rel_tol=1e-12)
    assert out["best"]["counts"] == list(counts)


def test_the_demos_unconstrained_plan_gets_each_stages_closest_mindformers_setting(tmp_path):
    """The unconstrained demo plan mixes SLCT and COMM in stages: MindFormers cannot run it, so every
    stage gets its fastest MindFormers setting on that split, said per stage with its memory."""
    spec = load_spec(DEMO)
    counts, _, choice = best_splits(spec.model, 16, backend="numpy")[0]
    names = spec.model.option_names(list(counts), choice)
    plan = framework_plan(spec.model, list(counts), names)
    assert any(seg.count("SLCT") and seg.count("COMM") for seg in plan.segments)
    text = mindformers.dump(plan)
    assert "these settings do not run the plan exactly" in text
    assert sum("the plan wants" in line and "MiB" in line for line in text.splitlines()) == 16
    path = tmp_path / "mf.yaml"
    path.write_text(text)
    back, ran = mindformers.load(str(path)).split(spec.model)
    ev = framework.evaluate(spec.model, back, ran)
    assert back == list(counts) and ev.feasible  # the split is kept; every stage fits its setting
    assert ev.slowest >= best_splits(spec.model, 16, backend="numpy")[0][1]


def test_megatron_writes_the_closest_setting_with_memory_per_stage():
    """A plan no single Megatron setting runs (the unconstrained one) gets the closest, scored by stage."""
    spec = spec_of("deepseek_v3_small_config.json", TIGHT_ARGS)
    counts, score, choice = best_splits(spec.model, 4, backend="numpy")[0]
    text = emit("megatron", spec.model, counts, choice, "x", score)
    if "no single setting runs this plan exactly" in text:
        assert sum("MiB (fits)" in line or "MiB (OVER budget)" in line for line in text.splitlines()) == 4
    assert '--pipeline-model-parallel-layout "E' in text and "--num-layers 16" in text


def test_megatron_writes_no_recompute_flags_when_the_plan_recomputes_nothing():
    p = cli("best", os.path.join(EXAMPLES, "llama2_7b_config.json"), *ISSUE_ARGS, "--emit", "megatron")
    assert p.returncode == 0 and "no single setting" not in p.stdout
    flags = p.stdout.split("GPUKNAP_ARGS=(")[1].split(")")[0]
    assert "--recompute" not in flags
    assert '--pipeline-model-parallel-layout "Et*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4L"' in flags
    assert "this plan recomputes nothing" in p.stdout


def test_sapp_slct_is_not_megatrons_core_attn():
    """SAPP-PPB's SLCT was measured with MindFormers' select recompute (the MLP activation): Megatron
    plans of the demo use none or full recompute only, and selective flags are not scored on it."""
    p = cli("best", DEMO, "--emit", "megatron")
    assert p.returncode == 0, p.stderr
    assert "core_attn" not in p.stdout and "selective" not in p.stdout
    with pytest.raises(ValueError, match="kind 'BODY': none of its options"):
        from gpuknap.engine import LayerOption
        from gpuknap.search import PipelineModel
        m = load_spec(DEMO).model
        fronts = {**m.fronts, "BODY": [LayerOption("SLCT", 1.0, 1.0, 2.0)]}
        restrict(PipelineModel(m.kinds, fronts, m.static, m.capacity, m.micro_batches), "megatron")


def test_a_measured_profiles_megatron_block_states_the_micro_batches_planned():
    """A SAPP-PPB profile carries no batch: the block cannot write --global-batch-size, so it says how
    many micro-batches an iteration the plan held in flight for (the --micro-batches given), and an
    interleaved plan whose count Megatron's schedule cannot run is refused as for a costed model."""
    sapp = os.path.join(EXAMPLES, "sapp_ppb_demo.json")
    for micro in (5, 16):
        p = cli("best", sapp, "--capacity", "1TiB", "--stages", "4", "--micro-batches", str(micro), "--emit",
                "megatron")
        assert p.returncode == 0, p.stderr
        assert f"run {micro} micro-batches an iteration" in p.stdout
        assert f"--global-batch-size {micro} x --micro-batch-size" in p.stdout
    spec = load_spec(sapp, capacity="1TiB", stages=4, micro_batches=8)
    counts, _, _, names, _ = constrained_splits(spec.model, 4, "megatron", backend="numpy", interleave=2)[0]
    assert "run 8 micro-batches" in emit("megatron", spec.model, counts, names=names, chunks=2)
    six = dataclasses.replace(spec.model, micro_batches=6)  # planned with a micro-batch group, say
    with pytest.raises(ValueError, match="micro_batches: Megatron's interleaved schedule runs a multiple"):
        emit("megatron", six, counts, names=names, chunks=2)


def test_interleaved_plans_round_trip(tmp_path):
    spec = load_spec(DEMO, capacity="100GB")
    found = constrained_splits(spec.model, 8, "megatron", backend="numpy", interleave=2)
    counts, _, _, names, _ = found[0]
    text = emit("megatron", spec.model, counts, names=names, chunks=2)
    path = tmp_path / "run.sh"
    path.write_text(text)
    st = megatron.load(str(path))
    assert st.chunks == 2 and st.split(spec.model) == (list(counts), names)


@pytest.mark.parametrize("text, want", [
    ("Et*3|(tt|)*29,m|L", ["Ettt"] + ["tt"] * 29 + ["m", "L"]),
    ("E||t|L", ["E", "", "t", "L"]),
    ("(t*2|)*2,tL", ["tt", "tt", "tL"]),
    ("E(t|)*2L", ["Et", "t", "L"]),
])
def test_parse_layout_follows_megatrons_syntax(text, want):
    assert megatron.parse_layout(text) == want


@pytest.mark.parametrize("text", ["((t|)*2|)*2", "E(t|L", "Et t|L", "(t|)L", "()*2tL"])
def test_parse_layout_refuses_what_megatron_refuses(text):
    """pipeline_parallel_layer_layout.py expands one level of ``(...)*N`` and then ``x*N``; any
    character left that is not E, t, m, L or | (a nested or unclosed group, a space) is refused."""
    with pytest.raises(ValueError, match="cannot read the layout"):
        megatron.parse_layout(text)


@pytest.mark.parametrize("content, words", [
    ("parallel_config: {pipeline_stage: 4}\nmodel: {model_config: {num_layers: 96, offset: [1, 0, 0, 0]}}\n",
     "offset"),
    ("model: {model_config: {num_layers: 96}}\n", "pipeline_stage: missing"),
    ("parallel_config: {pipeline_stage: 1000000000}\nmodel: {model_config: {num_layers: 96}}\n", "pipeline_stage"),
    ("parallel_config: {pipeline_stage: 4}\nmodel: {model_config: {num_layers: 95}}\n", "offset"),
    ("parallel_config: {pipeline_stage: 4}\nmodel: {model_config: {num_layers: 100}}\n", "num_layers"),
    ("--num-layers 95 --pipeline-model-parallel-size 3\n--pipeline-model-parallel-layout 'Et*48|t*47,m|L'\n",
     "MTP"),
    ("--num-layers 96 --pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 'Et*48|t*48L'\n"
     "--recompute-granularity selective --recompute-modules mlp\n", "mlp"),
    ("--num-layers 96 --pipeline-model-parallel-size 3\n--pipeline-model-parallel-layout 'Et*48|t*48L'\n",
     "multiple"),
    ("--num-layers 96 --pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 'Et*48|t*4x8L'\n",
     "cannot read"),
    ("--num-layers 96 --pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout '((t*9999|)*9999|)*9999'\n",
     "--pipeline-model-parallel-layout"),
    ("--num-layers 96 --pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 't*99999999999999'\n",
     "over"),
])
def test_bad_settings_exit_2_with_one_line(tmp_path, content, words):
    path = tmp_path / ("s.txt" if content.startswith("--") else "s.yaml")
    path.write_text(content)
    p = cli("rank", DEMO, "--from", str(path))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and words in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_emit_json_carries_both_frameworks_settings():
    p = cli("best", DEMO, "--emit", "json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out["settings"]) == {"megatron", "mindformers"}
    assert "GPUKNAP_ARGS=(" in out["settings"]["megatron"]["text"]
    assert "offset:" in out["settings"]["mindformers"]["text"]
