"""Training settings out and back: MindFormers and Megatron, read back equal to the plan."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from paths import EXAMPLES

from gpuknap import best_splits
from gpuknap.formats import framework, load_spec, megatron, mindformers, restrict
from gpuknap.formats.framework import framework_plan

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


def segments_of(model, counts, names):
    """Per stage: decoder option counts, as a framework sees them."""
    return [dict(seg.options) for seg in framework_plan(model, counts, names).segments]


def plan_of(spec, emit):
    model = restrict(spec.model, emit)
    found = best_splits(model, spec.stages, 1, "slowest", spec.bucket, backend="numpy",
                        exclusive=dict(mindformers=mindformers.EXCLUSIVE).get(emit, ()))
    counts, score, choice = found[0]
    return model, list(counts), model.option_names(list(counts), choice), score


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("args", [ISSUE_ARGS, TIGHT_ARGS], ids=["issue", "tight"])
def test_emitted_settings_read_back_as_the_plan(config, args, tmp_path):
    spec = spec_of(config, args)
    for emit, reader, suffix in (("mindformers", mindformers.load, ".yaml"), ("megatron", megatron.load, ".sh")):
        p = cli("best", os.path.join(EXAMPLES, config), *args, "--emit", emit)
        if p.returncode == 1:  # nothing fits this model under these settings: said so, nothing to emit
            assert "no feasible split" in p.stdout
            continue
        if p.returncode == 2:  # a heterogeneous stage the first-layers rule cannot run: refused, by stage
            assert emit == "mindformers" and "recomputes the first layers of a stage" in p.stderr
            continue
        assert p.returncode == 0, p.stderr
        path = tmp_path / f"{emit}{suffix}"
        path.write_text(p.stdout)
        settings = reader(str(path))
        counts, names = settings.split(spec.model)
        model, want_counts, want_names, score = plan_of(spec, emit)
        assert counts == want_counts
        exact = "no single setting runs this plan exactly" not in p.stdout
        if exact:
            assert not framework.mismatches(model, counts, want_names, names)
            ev = framework.evaluate(spec.model, counts, names)
            assert math.isclose(ev.slowest, score, rel_tol=1e-9) and ev.feasible
        if emit == "mindformers":
            assert exact  # the search ran among plans MindFormers can express


def test_moe_plans_use_both_layer_kinds_and_tight_plans_recompute():
    spec = spec_of("deepseek_v3_small_config.json", TIGHT_ARGS)
    model, counts, names, _ = plan_of(spec, "megatron")
    kinds = {model.kinds[i] for i, n in enumerate(names)}
    assert {"dense", "moe"} <= kinds and set(names) - {"NONE", "HEAD", "TAIL"}


def test_sapp_demo_mindformers_offset_rule_and_rank_from(tmp_path):
    p = cli("best", DEMO, "--emit", "mindformers")
    assert p.returncode == 0, p.stderr
    path = tmp_path / "mf.yaml"
    path.write_text(p.stdout)
    st = mindformers.load(str(path))
    model, counts, names, score = plan_of(load_spec(DEMO), "mindformers")
    decoders = [c - (i == 0) - (i == len(counts) - 1) for i, c in enumerate(counts)]
    import yaml
    offset = yaml.safe_load(p.stdout)["model"]["model_config"]["offset"]
    assert sum(offset) == 96 % 16 and [96 // 16 + o for o in offset] == decoders == list(st.decoders)
    assert segments_of(model, *st.split(model)) == segments_of(model, counts, names)
    r = cli("rank", DEMO, "--from", str(path), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["feasible"] and math.isclose(out["best"]["slowest"], score, rel_tol=1e-12)
    assert out["best"]["counts"] == counts


def test_the_demos_unconstrained_plan_is_refused_for_mindformers():
    spec = load_spec(DEMO)
    counts, _, choice = best_splits(spec.model, 16, backend="numpy")[0]
    plan = framework_plan(spec.model, list(counts), spec.model.option_names(list(counts), choice))
    with pytest.raises(ValueError, match="SLCT and .* COMM layers; MindFormers recomputes the first layers"):
        mindformers.dump(plan)


def test_interleaved_plans_round_trip(tmp_path):
    spec = load_spec(DEMO)
    model = spec.model
    counts = [3] * 16 + [3] * 15 + [5]
    in_flight = [[2, 1]] * 16
    choice = model.rank([counts], backend="numpy", in_flight=in_flight, chunks=2).choice(0)
    names = model.option_names(counts, choice, in_flight, 2)
    plan = framework_plan(model, counts, names, 2, "demo")
    st = megatron.Settings(16, tuple(seg.roles for seg in plan.segments), None)
    assert megatron.parse_layout(megatron.layout(plan), 16) == list(st.segments)
    assert st.split(model)[0] == counts and st.chunks == 2
    try:
        text = mindformers.dump(plan)
    except ValueError:  # this split happens to mix SLCT and COMM in a chunk: check the lists alone
        return
    path = tmp_path / "mf.yaml"
    path.write_text(text)
    back = mindformers.load(str(path))
    assert back.chunks == 2 and back.split(model)[0] == counts
    assert segments_of(model, *back.split(model)) == segments_of(model, counts, names)


@pytest.mark.parametrize("text, want", [
    ("Et*3|(tt|)*29,m|L", ["Ettt"] + ["tt"] * 29 + ["m", "L"]),
    ("E||t|L", ["E", "", "t", "L"]),
    ("(t*2|)*2,tL", ["tt", "tt", "tL"]),
])
def test_parse_layout_follows_megatrons_syntax(text, want):
    assert megatron.parse_layout(text) == want


def test_megatron_writes_the_closest_setting_with_memory_per_stage():
    p = cli("best", os.path.join(EXAMPLES, "deepseek_v3_small_config.json"), *TIGHT_ARGS, "--emit", "megatron")
    assert p.returncode == 0, p.stderr
    assert "no single setting runs this plan exactly" in p.stdout
    assert sum("MiB (fits)" in line or "MiB (OVER budget)" in line for line in p.stdout.splitlines()) == 4
    assert '--pipeline-model-parallel-layout "E' in p.stdout and "--recompute-granularity" in p.stdout


def test_megatron_writes_no_recompute_flags_when_the_plan_recomputes_nothing():
    p = cli("best", os.path.join(EXAMPLES, "llama2_7b_config.json"), *ISSUE_ARGS, "--emit", "megatron")
    assert p.returncode == 0 and "no single setting" not in p.stdout and "--recompute" not in p.stdout
    assert p.stdout.rstrip().endswith('--pipeline-model-parallel-layout "Et*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4L"')


def test_megatron_demo_gets_the_fastest_single_setting_that_fits():
    """The demo's options have no Megatron full recompute: the closest setting is selective core_attn
    (every layer SLCT), and every stage fits."""
    p = cli("best", DEMO, "--emit", "megatron")
    assert p.returncode == 0 and "the closest that fits every stage's memory" in p.stdout
    assert "OVER budget" not in p.stdout
    assert p.stdout.rstrip().endswith("--recompute-granularity selective\n--recompute-modules core_attn")


@pytest.mark.parametrize("content, words", [
    ("parallel_config: {pipeline_stage: 4}\nmodel: {model_config: {num_layers: 96, offset: [1, 0, 0, 0]}}\n",
     "offset"),
    ("model: {model_config: {num_layers: 96}}\n", "pipeline_stage: missing"),
    ("parallel_config: {pipeline_stage: 1000000000}\nmodel: {model_config: {num_layers: 96}}\n", "pipeline_stage"),
    ("parallel_config: {pipeline_stage: 4}\nmodel: {model_config: {num_layers: 95}}\n", "95 layers"),
    ("parallel_config: {pipeline_stage: 4}\nmodel: {model_config: {num_layers: 100}}\n", "num_layers"),
    ("--pipeline-model-parallel-size 3\n--pipeline-model-parallel-layout 'Et*48|t*47,m|L'\n", "MTP"),
    ("--pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 'Et*48|t*48L'\n"
     "--recompute-granularity selective --recompute-modules mlp\n", "mlp"),
    ("--pipeline-model-parallel-size 3\n--pipeline-model-parallel-layout 'Et*48|t*48L'\n", "multiple"),
    ("--pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 'Et*48|t*4x8L'\n", "cannot read"),
    ("--pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout '((t*9999|)*9999|)*9999'\n", "over"),
    ("--pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 't*99999999999999'\n", "over"),
])
def test_bad_settings_exit_2_with_one_line(tmp_path, content, words):
    path = tmp_path / ("s.txt" if content.startswith("--") else "s.yaml")
    path.write_text(content)
    p = cli("rank", DEMO, "--from", str(path))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and words in lines[0] and "Traceback" not in p.stderr


def test_emitting_options_a_framework_cannot_run_is_refused():
    spec = spec_of("deepseek_v3_small_config.json", TIGHT_ARGS)
    counts, _, choice = best_splits(spec.model, 4, backend="numpy")[0]
    names = spec.model.option_names(list(counts), choice)
    if "MOEACT" in names:  # the unrestricted plan uses MoE activation recompute
        with pytest.raises(ValueError, match="'MOEACT' has no MindFormers setting"):
            mindformers.dump(framework_plan(spec.model, list(counts), names))
