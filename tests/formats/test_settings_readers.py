"""The Megatron and MindFormers readers agree with the frameworks and refuse what they would ignore:
unknown, misspelt and duplicated names (by name, with "did you mean"), contradictions Megatron or
MindFormers would refuse, oversized files before parsing, and bad arguments to the public API.
Each case: ``rank --from`` exits 2 with one line naming the file and the key, or reads the file as
the framework does."""
from __future__ import annotations

import os

import numpy as np
import pytest
from framework_rules import _format
from paths import EXAMPLES

from gpuknap.cli import main
from gpuknap.formats import framework, load_spec, megatron, mindformers, read_settings
from gpuknap.formats._settings import MAX_SETTINGS_BYTES

DEMO = os.path.join(EXAMPLES, "demo.json")  # HEAD, 96 BODY, TAIL
LLAMA = os.path.join(EXAMPLES, "llama2_7b_config.json")  # embedding, 32 dense, output
MEG = ("--num-layers 96\n--pipeline-model-parallel-size 2\n"
       "--pipeline-model-parallel-layout 'Et*48|t*48L'\n")
MF = ("parallel_config: {pipeline_stage: 2, micro_batch_num: 32}\n"
      "model: {model_config: {num_layers: 96, offset: [0, 0]}}\n")


def rank(capsys, tmp_path, content, *extra, name="s.txt", spec=DEMO):
    path = tmp_path / name
    path.write_text(content)
    rc = main(["rank", spec, "--from", str(path), "--quiet", *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err, str(path)


def refused(capsys, tmp_path, content, words, name="s.txt", spec=DEMO, *extra):
    rc, _, err, path = rank(capsys, tmp_path, content, *extra, name=name, spec=spec)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    for w in [path, *words]:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("content, words", [
    (MEG + "--recompute-granularity full --recompute-method blocky --recompute-num-layers 2\n",
     ["--recompute-method", "'blocky'", "block or uniform"]),
    ("--num-layers 20\n--pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 'Et*48|t*48L'\n",
     ["96 decoder layers", "--num-layers 20"]),
    (MEG + "--recompute-granularty full\n", ["--recompute-granularty", "did you mean --recompute-granularity"]),
    (MEG + "--recompute_granularity full\n", ["--recompute_granularity", "did you mean --recompute-granularity"]),
    (MEG + "--micro-batch-size 1\n--micro-batch-size 2\n", ["--micro-batch-size", "given twice"]),
    ("--pipeline-model-parallel-size 5\n--num-layers 96\n", ["without --pipeline-model-parallel-layout",
                                                           "not divisible by --pipeline-model-parallel-size 5"]),
    ("--pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 'Et*48|t*48L'\n", ["--num-layers: missing"]),
    (MEG + "--num-virtual-stages-per-pipeline-rank 2\n", ["--num-virtual-stages-per-pipeline-rank", "layout"]),
    (MEG + "--decoder-first-pipeline-num-layers 4\n", ["--decoder-first-pipeline-num-layers"]),
    (MEG + "--account-for-loss-in-pipeline-split\n", ["--account-for-loss-in-pipeline-split"]),
    (MEG + "--recompute-granularity full\n", ["--recompute-method is missing"]),
    (MEG + "--recompute-granularity full --recompute-method block\n", ["--recompute-num-layers is missing"]),
    (MEG + "--recompute-granularity selective --recompute-method block\n", ["--recompute-method", "selective"]),
    (MEG + "--tensor-model-parallel-size $TP\n", ["--tensor-model-parallel-size", "shell variable"]),
    (MEG + "--recompute-granularity selective --recompute-modules core_attn\n", ["SLCT", "MindFormers"]),
    (MEG + "--sequence-parallel=true\n", ["--sequence-parallel", "switch"]),
    ("--num-layers 96\n--pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 'Et*24|t*24|t*24|t*24L'\n"
     "--no-overlap-p2p-communication\n", ["interleaved", "more than 2"]),  # on 2 stages it needs the overlap
    (MEG + "--overlap-p2p-comm\n", ["--overlap-p2p-comm is not a Megatron flag", "on by default"]),
    (MEG + "--virtual-pipeline-model-parallel-size 2\n", ["not a Megatron flag", "layout"]),
    (MEG + "--num-layers-in-first-pipeline-stage 4\n", ["not a Megatron flag", "--decoder-first-pipeline-num"]),
    (MEG + "--sequence-length 4096\n", ["not a Megatron flag", "--seq-length"]),
    (MEG + "--recompute-granularity selective --recompute-modules\n", ["--recompute-modules", "at least one"]),
    ("torchrun x.py --num-layers 96 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*48|t*48L\n",
     ["'Et*48|t*48L'", "pipe", "quote it"]),
    (MEG + "--seq-length 4096\n--encoder-seq-length 4096\n", ["--seq-length", "--encoder-seq-length"]),
    ("--num-layers 95\n--mtp-num-layers 1\n--pipeline-model-parallel-size 2\n"
     "--pipeline-model-parallel-layout 'Et*47m|t*48L'\n", ["MTP layers (m) after every decoder layer"]),
    ("--num-layers 96\n--pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 'Et*48|t*48 L'\n",
     ["cannot read the layout", "' '"]),
])
def test_megatron_reader_refuses_by_name(capsys, tmp_path, content, words):
    refused(capsys, tmp_path, content, words)


def test_a_torchrun_script_with_continuations_and_arrays_is_read(capsys, tmp_path):
    script = """#!/bin/bash
# a launch script as Megatron's examples write them
GPUS_PER_NODE=8
MODEL_ARGS=(
    --num-layers 32   # every decoder layer
    --hidden-size 4096
)
torchrun --nproc_per_node $GPUS_PER_NODE pretrain_gpt.py \\
    ${MODEL_ARGS[@]} \\
    --pipeline-model-parallel-size 2 \\
    --pipeline-model-parallel-layout "Et*16|t*16L" \\
    --recompute-granularity full --recompute-method block --recompute-num-layers 3 \\
    --micro-batch-size 1 --seq-length 4096 --tensor-model-parallel-size 8 --global-batch-size 32 --bf16
"""
    path = tmp_path / "run.sh"
    path.write_text(script)
    st = read_settings(str(path))
    assert st.stages == 2 and st.granularity == "full" and (st.method, st.num) == ("block", 3)
    rc = main(["rank", LLAMA, "--capacity", "80GiB", "--micro-batches", "32", "--from", str(path), "--quiet"])
    out = capsys.readouterr()
    assert rc in (0, 1), out.err
    assert "FULLx3 NONEx13" in out.out


def test_uniform_recompute_keeps_one_input_per_group(tmp_path):
    """recompute.py: uniform N checkpoints groups of N layers, one saved input each: a stage's
    activations are those of ceil(n / N) layers' inputs, not n."""
    spec = load_spec(LLAMA, capacity="80GiB", micro_batches=32, seq=4096, tensor_parallel=8)
    model = spec.model
    rows = {}
    for method, n in (("block", 16), ("uniform", 1), ("uniform", 4), ("uniform", 16)):
        path = tmp_path / f"{method}{n}.sh"
        path.write_text("--num-layers 32 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
                        f"Et*16\\|t*16L --recompute-granularity full --recompute-method {method} "
                        f"--recompute-num-layers {n}\n")
        st = megatron.load(str(path))
        counts, names = st.split(model)
        ev = framework.evaluate(model, counts, names)
        rows[(method, n)] = ev
        assert names.count("FULL") == (32 if n == 1 or method == "block" else 2 * -(-16 // n))
    assert rows[("block", 16)].memory == rows[("uniform", 1)].memory
    assert rows[("uniform", 4)].memory[0] < rows[("uniform", 1)].memory[0]
    assert rows[("uniform", 16)].memory[0] < rows[("uniform", 4)].memory[0]
    assert rows[("uniform", 4)].times == rows[("uniform", 1)].times  # every layer recomputed once either way


@pytest.mark.parametrize("content, words", [
    (MF.replace("offset: [0, 0]", "offset: [0, 0], pp_interleave_nun: 2"),
     ["pp_interleave_nun", "did you mean 'pp_interleave_num'"]),
    (MF + "recompute_config: {select_recompte: [1, 1]}\n", ["select_recompte", "did you mean 'select_recompute'"]),
    (MF.replace("offset: [0, 0]", "offest: [1, -1]"), ["offest", "did you mean 'offset'"]),
    (MF + "recompute_confg: {recompute: [1, 1]}\n", ["recompute_confg", "did you mean 'recompute_config'"]),
    (MF + "parallel_config: {pipeline_stage: 2}\n", ["parallel_config", "given twice"]),
    (MF.replace("micro_batch_num: 32", "micro_batch_num: 32, data_paralel: 2"), ["data_paralel", "data_parallel"]),
    (MF.replace("offset: [0, 0]", "offset: [[0, 0], [0, 0]], pp_interleave_num: 2"),
     ["offset", "pipeline_interleave: True"]),
    (MF.replace("offset: [0, 0]", "offset: [0, 0], mtp_depth: 1"), ["offset", "remainder", "1"]),
    (MF + "recompute_config: {recompute: [1, 1, 1]}\n", ["recompute_config.recompute", "3 counts for 2 stages"]),
    (MF + "recompute_config: {recompute: [-1, 1]}\n", ["recompute_config.recompute", "negative"]),
    (MF + "recompute_config: {recompute: [[1, -1]]}\n", ["recompute_config.recompute[0][1]", "negative"]),
    (MF + "recompute_config: {select_recompute: {'feed_forward\\.mul': [1, 1]}}\n", ["per-pattern"]),
    (MF + "swap_config: {swap: True}\n", ["swap_config.swap"]),
    (MF + "use_legacy: False\nrecompute_config: {recompute: [1, 1]}\n"
     "model: {model_config: {recompute: [1, 1]}}\n", ["model", "given twice"]),
])
def test_mindformers_reader_refuses_by_name(capsys, tmp_path, content, words):
    refused(capsys, tmp_path, content, words, name="mf.yaml")


def test_mindformers_yaml_mentioning_megatron_flags_in_a_comment_is_mindformers(tmp_path):
    path = tmp_path / "mf.yaml"
    path.write_text("# converted from --pipeline-model-parallel-layout 'Et*48|t*48L'\n" + MF)
    assert isinstance(read_settings(str(path)), mindformers.Settings)


def test_mcore_reads_select_lists_where_its_release_does(tmp_path):
    """transformer_config_utils.py: r1.6 converts only ``recompute`` from the recompute configuration,
    so an mcore model's select lists live in model_config; r1.7 and later convert every key of the
    recompute dict and refuse model_config's beside it (a red team's finding).  A list only in
    recompute_config is read as r1.7 reads it, one in model_config as r1.6 does, each with a note."""
    body = MF + "recompute_config: {select_recompute: [3, 0]}\n"
    path = tmp_path / "legacy.yaml"
    path.write_text(body)
    assert read_settings(str(path)).select == (3, 0) and not read_settings(str(path)).notes
    path = tmp_path / "mcore.yaml"
    path.write_text(body + "use_legacy: False\n")
    st = read_settings(str(path))
    assert st.select == (3, 0) and any("r1.7 and later read it" in n for n in st.notes), st.notes
    path.write_text(MF.replace("offset: [0, 0]", "offset: [0, 0], select_recompute: [0, 2]") + "use_legacy: False\n"
                    + "recompute_config: {select_recompute: [3, 0]}\n")
    st = read_settings(str(path))
    assert st.select == (0, 2) and any("as MindFormers r1.6 reads it" in n for n in st.notes), st.notes


def test_flat_recompute_lists_spread_over_chunks_as_mindformers_does(tmp_path):
    """``_alloc_recompute_layer``: a count per stage goes to its chunks one layer at a time."""
    body = ("parallel: {pipeline_config: {pipeline_interleave: True}}\n"
            "parallel_config: {pipeline_stage: 4}\n"
            "model: {model_config: {num_layers: 96, pp_interleave_num: 3, offset: [[-2, 0, 0, 0], [0, 0, 0, 0], "
            "[0, 0, 0, 2]]}}\nrecompute_config: {recompute: [7, 0, 30, 5], select_recompute: True}\n")
    path = tmp_path / "mf.yaml"
    path.write_text(body)
    st = read_settings(str(path))
    layers = np.array(st.decoders).reshape(3, 4)
    want = _format([7, 0, 30, 5], layers)
    assert np.array_equal(np.array(st.recompute).reshape(3, 4), want)
    assert st.select == st.decoders


def test_mtp_layers_count_with_the_offsets(tmp_path):
    """LayerSetting is built over num_layers + MTP layers; the MTP layers are the last ids."""
    path = tmp_path / "mf.yaml"
    path.write_text(MF.replace("num_layers: 96", "num_layers: 95").replace("offset: [0, 0]",
                                                                            "offset: [0, 0], mtp_depth: 1"))
    st = read_settings(str(path))
    assert st.mtp == 1 and st.decoders == (48, 47)


def test_oversized_settings_are_refused_before_parsing(capsys, tmp_path):
    refused(capsys, tmp_path, "--num-layers 96 " * (MAX_SETTINGS_BYTES // 10), ["bytes", "settings"])


def test_rank_from_builds_the_model_the_settings_run(capsys, tmp_path):
    """The file's sizes fill the flags not given; a flag that says otherwise is refused by name."""
    block = ("--num-layers 32 --pipeline-model-parallel-size 4 --pipeline-model-parallel-layout 'Et*8|t*8|t*8|t*8L'"
             " --tensor-model-parallel-size 8 --sequence-parallel --micro-batch-size 2 --global-batch-size 64"
             " --seq-length 4096 --use-distributed-optimizer --bf16\n")
    rc, out, err, _ = rank(capsys, tmp_path, block, "--capacity", "80GiB", "--json", spec=LLAMA)
    assert rc == 0, err
    rc2 = main(["rank", LLAMA, "--capacity", "80GiB", "--tp", "8", "--seq", "4096", "--micro-batch-size", "2",
                "--micro-batches", "32", "--from", str(tmp_path / "s.txt"), "--quiet", "--json"])
    assert rc2 == 0 and capsys.readouterr().out == out
    refused(capsys, tmp_path, block, ["--tp 4", "tp = 8"], "s.txt", LLAMA, "--capacity", "80GiB", "--tp", "4")
    refused(capsys, tmp_path, block, ["--micro-batches 16", "32 micro-batches"], "s.txt", LLAMA, "--capacity",
            "80GiB", "--micro-batches", "16")


def test_public_api_names_the_bad_argument(tmp_path):
    with pytest.raises(ValueError, match="stages"):
        megatron.parse_layout("Et|tL", stages=0)
    with pytest.raises(ValueError, match="stages"):
        megatron.parse_layout("Et|tL", stages=True)
    with pytest.raises(ValueError, match="layout"):
        megatron.parse_layout(None)
    with pytest.raises(ValueError, match="where"):
        megatron.parse_layout("EtL", where=3)
    for load in (megatron.load, mindformers.load, read_settings):
        with pytest.raises(ValueError, match="path"):
            load(None)
    for dump in (megatron.dump, mindformers.dump):
        with pytest.raises(ValueError, match="plan"):
            dump("not a plan")
        with pytest.raises(ValueError, match="plan"):
            dump(framework.FrameworkPlan("x", 1, 1, ()))
    model = load_spec(DEMO).model
    with pytest.raises(ValueError, match="names"):
        framework.framework_plan(model, [98], ["NONE"])
    with pytest.raises(ValueError, match="mtp"):
        framework.framework_plan(model, [98], ["HEAD"] + ["NONE"] * 96 + ["TAIL"], mtp=-1)


def _activations(capsys, tmp_path, content, name, *extra):
    import json
    rc, out, err, _ = rank(capsys, tmp_path, content, "--capacity", "80GiB", "--seq", "4096", "--json", *extra,
                           name=name, spec=LLAMA)
    assert rc == 0, err
    return [s["memory_bytes"] for s in json.loads(out)["best"]["stages"]]


RUN = ("--num-layers 32 --pipeline-model-parallel-size 4 --pipeline-model-parallel-layout 'Et*8|t*8|t*8|t*8L'"
       " --tensor-model-parallel-size 8 --micro-batch-size 2 --global-batch-size 32 --use-distributed-optimizer --bf16")


def test_a_whole_run_without_a_switch_runs_without_it(capsys, tmp_path):
    """A launch script that states its run and leaves --sequence-parallel out runs without it (Megatron's
    default): its activations are the whole sequence's, as the same run with the flag turned off on the
    command line; MindFormers likewise for use_seq_parallel; a fragment without the sizes leaves it to the
    command line."""
    on = _activations(capsys, tmp_path, RUN + " --sequence-parallel\n", "on.txt")
    off = _activations(capsys, tmp_path, RUN + "\n", "off.txt")
    spec = load_spec(LLAMA, capacity="80GiB", seq=4096, tensor_parallel=8, micro_batch=2, micro_batches=16,
                     sequence_parallel=False, stages=4)
    names = ["HEAD"] + ["NONE"] * 32 + ["TAIL"]
    want = framework.evaluate(spec.model, [9, 8, 8, 9], names).memory  # the run without it, built apart
    assert off == pytest.approx(list(want), rel=1e-12) and all(a > b for a, b in zip(off, on))
    assert _activations(capsys, tmp_path, RUN.replace(" --tensor-model-parallel-size 8", "") + "\n", "f2.txt",
                        "--tp", "8") == on  # a fragment: the command line's default (on)
    mf = ("parallel_config: {pipeline_stage: 4, micro_batch_num: 16, model_parallel: 8, data_parallel: 1%s}\n"
          "runner_config: {batch_size: 2}\n"
          "model: {model_config: {num_layers: 32, offset: [0, 0, 0, 0], seq_length: 4096, "
          "use_flash_attention: True}}\n")  # (a legacy model's default is False)
    assert _activations(capsys, tmp_path, mf % "", "a.yaml") == _activations(
        capsys, tmp_path, mf % ", use_seq_parallel: False", "b.yaml")
    assert _activations(capsys, tmp_path, mf % ", use_seq_parallel: True", "c.yaml") == on


def test_a_whole_run_without_the_distributed_optimizer_is_refused_on_dp(capsys, tmp_path):
    refused(capsys, tmp_path, RUN.replace(" --use-distributed-optimizer", "") + "\n",
            ["without the distributed optimizer"], "s.txt", LLAMA, "--capacity", "80GiB", "--seq", "4096",
            "--dp", "2")
    mf = ("parallel_config: {pipeline_stage: 4, micro_batch_num: 16, model_parallel: 8, data_parallel: 2}\n"
          "model: {model_config: {num_layers: 32, offset: [0, 0, 0, 0]}}\n%s")
    refused(capsys, tmp_path, mf % "", ["without the distributed optimizer"], "s.yaml", LLAMA, "--capacity", "80GiB",
            "--seq", "4096")
    refused(capsys, tmp_path, mf % "parallel: {enable_parallel_optimizer: 'false'}\n",
            ["enable_parallel_optimizer", "true or false"], "t.yaml", LLAMA, "--capacity", "80GiB", "--seq", "4096")


def test_encoder_seq_length_and_mcore_virtual_stages_are_read(capsys, tmp_path):
    refused(capsys, tmp_path, RUN + " --sequence-parallel --encoder-seq-length 8192\n", ["seq = 8192", "--seq 4096"],
            "s.txt", LLAMA, "--capacity", "80GiB", "--seq", "4096")
    base = ("use_legacy: False\nparallel: {pipeline_config: {pipeline_interleave: True}}\n"
            "parallel_config: {pipeline_stage: 2, micro_batch_num: 32}\n"
            "model: {model_config: {num_layers: 96, offset: 0, %s: 2}}\n")
    a = read_settings(_write(tmp_path, "a.yaml", base % "pp_interleave_num"))
    b = read_settings(_write(tmp_path, "b.yaml", base % "virtual_pipeline_model_parallel_size"))
    assert a.chunks == b.chunks == 2 and a.decoders == b.decoders
    refused(capsys, tmp_path, base.replace("offset: 0,", "offset: 0, pp_interleave_num: 2,")
            % "virtual_pipeline_model_parallel_size", ["pp_interleave_num and virtual_pipeline_model_parallel_size"],
            "c.yaml")


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


SCRIPT_RUN = ("--num-layers 32 --pipeline-model-parallel-size 4 --pipeline-model-parallel-layout 'Et*8|t*8|t*8|t*8L'"
              " --tensor-model-parallel-size 8 --sequence-parallel --micro-batch-size 2 --global-batch-size 32"
              " --use-distributed-optimizer --bf16")


@pytest.mark.parametrize("script", [
    # flags in a string variable, passed unquoted
    'RECOMPUTE="--recompute-granularity full --recompute-method block --recompute-num-layers 5"\n'
    "torchrun pretrain_gpt.py \\\n  " + SCRIPT_RUN + " \\\n  $RECOMPUTE\n",
    # the same string over several lines (quotes inside it would reach Megatron: none here)
    'GPT_ARGS="\n  ' + SCRIPT_RUN.replace("'", "") + ' \\\n  --recompute-granularity full --recompute-method block\n'
    '  --recompute-num-layers 5\n"\ntorchrun pretrain_gpt.py $GPT_ARGS\n',
    # one-line bash arrays
    "A=(" + SCRIPT_RUN + ")\nR=(--recompute-granularity full --recompute-method block --recompute-num-layers 5)\n"
    'torchrun pretrain_gpt.py "${A[@]}" "${R[@]}"\n',
])
def test_launch_scripts_pass_the_flags_bash_passes(tmp_path, script):
    """Each script passes Megatron full recompute of the first 5 layers of every stage (checked by
    hand against bash's word splitting): read as the plain arguments file saying so."""
    want = read_settings(_write(tmp_path, "want.txt", SCRIPT_RUN + " --recompute-granularity full "
                                "--recompute-method block --recompute-num-layers 5\n"))
    got = read_settings(_write(tmp_path, "run.sh", script))
    assert got == want and got.run == want.run and got.flags()


def test_modules_of_a_one_line_array_end_with_it(tmp_path):
    got = read_settings(_write(tmp_path, "run.sh", "A=(" + SCRIPT_RUN + ")\n"
                               "R=(--recompute-granularity selective --recompute-modules core_attn)\n"
                               'torchrun pretrain_gpt.py "${A[@]}" "${R[@]}"\n'))
    assert got.modules == {"core_attn"}


def test_a_comment_inside_a_continued_command_ends_it(capsys, tmp_path):
    script = ("torchrun pretrain_gpt.py \\\n  " + SCRIPT_RUN + " \\\n#  --use-flash-attn\n"
              "  --recompute-granularity full --recompute-method block --recompute-num-layers 5\n")
    refused(capsys, tmp_path, script, ["line 3", "ends the command continued from line 1", "line 4"], "run.sh")


def test_mtp_layers_of_the_settings_and_the_config_must_agree(capsys, tmp_path):
    """The config's MTP layers are costed on the last stage: settings running another number are
    refused; settings running MTP layers a config does not have say they are not costed."""
    import json
    plain = os.path.join(EXAMPLES, "deepseek_v3_small_config.json")
    data = json.load(open(plain))
    with_mtp = _write(tmp_path, "mtp_config.json", json.dumps({**data, "num_nextn_predict_layers": 1}))
    layers = data["num_hidden_layers"]
    script = (f"--num-layers {layers} --pipeline-model-parallel-size 2 --mtp-num-layers {{m}}\n"
              f"--pipeline-model-parallel-layout 'Et*{layers // 2}|t*{layers - layers // 2}{{ms}}L'\n")
    extra = ("--capacity", "80GiB", "--seq", "1024", "--micro-batches", "8")
    refused(capsys, tmp_path, script.format(m=2, ms="mm"), ["run 2 MTP layer(s)", "has 1"], "s.txt", with_mtp,
            *extra)
    rc, out, err, _ = rank(capsys, tmp_path, script.format(m=1, ms="m"), *extra, name="d.txt", spec=with_mtp)
    assert rc in (0, 1) and "MTP" not in err, err  # agreeing: costed, nothing to say
    rc, out, err, _ = rank(capsys, tmp_path, script.format(m=1, ms="m"), *extra, name="e.txt", spec=plain)
    assert rc in (0, 1) and "does not cost them" in out + err


def test_a_null_recompute_config_recomputes_nothing(tmp_path):
    none = read_settings(_write(tmp_path, "a.yaml", MF + "recompute_config: null\n"))
    assert none == read_settings(_write(tmp_path, "b.yaml", MF)) and not any(none.recompute)


RECOMPUTE = "--recompute-granularity full --recompute-method block --recompute-num-layers 5"


@pytest.mark.parametrize("script, recomputes", [
    (f'R="{RECOMPUTE}"\ntorchrun x.py \\\n  {SCRIPT_RUN}\n', False),  # set, never used
    (f'R="{RECOMPUTE}"\ntorchrun x.py \\\n  {SCRIPT_RUN} # $R\n', False),  # used in a comment only
    (f'R="{RECOMPUTE}"\nR=""\ntorchrun x.py \\\n  {SCRIPT_RUN} $R\n', False),  # reset before use
    (f'M="the run leaves out {RECOMPUTE}"\necho "$M"\ntorchrun x.py {SCRIPT_RUN}\n', False),  # printed
    (f'A=({SCRIPT_RUN})\nR="{RECOMPUTE}"\nR="$R"\ntorchrun x.py "${{A[@]}}" $R\n', True),  # used, reassigned
    (f'A=({SCRIPT_RUN})\nB=("${{A[@]}}" {RECOMPUTE})\ntorchrun x.py "${{B[@]}}"\n', True),  # an array of arrays
])
def test_variables_pass_their_flags_where_the_shell_uses_them(tmp_path, script, recomputes):
    got = read_settings(_write(tmp_path, "run.sh", script))
    assert (got.granularity == "full") == recomputes and got.run.get("sequence_parallel") is True


def test_a_variable_set_inside_an_if_is_refused_where_used(capsys, tmp_path):
    script = (f'if [ "$AC" = full ]; then\n  R="{RECOMPUTE}"\nelse\n  R=""\nfi\n'
              f"torchrun x.py {SCRIPT_RUN} $R\n")
    refused(capsys, tmp_path, script, ["line 6", "$R is set inside an if or case block", "line 4"], "run.sh")


def test_modules_over_the_lines_of_an_array_are_all_passed(tmp_path):
    """argparse's nargs="+" takes every word up to the next flag: in a bash array the names may sit
    on lines of their own (bash passes them all)."""
    one_line = read_settings(_write(tmp_path, "a.sh", "A=(" + SCRIPT_RUN + "\n  --moe-grouped-gemm --recompute-granularity selective\n"
                                    "  --recompute-modules core_attn moe_act\n)\ntorchrun pretrain_gpt.py \"${A[@]}\"\n"))
    split = read_settings(_write(tmp_path, "b.sh", "A=(" + SCRIPT_RUN + "\n  --moe-grouped-gemm --recompute-granularity selective\n"
                                 "  --recompute-modules core_attn\n      moe_act\n)\ntorchrun pretrain_gpt.py \"${A[@]}\"\n"))
    own = read_settings(_write(tmp_path, "c.sh", "A=(" + SCRIPT_RUN + "\n  --moe-grouped-gemm --recompute-granularity selective\n"
                               "  --recompute-modules\n  core_attn\n  moe_act\n)\ntorchrun pretrain_gpt.py \"${A[@]}\"\n"))
    assert one_line.modules == split.modules == own.modules == {"core_attn", "moe_act"}
    # a command's end still ends the names: the next command's words are not taken
    ends = read_settings(_write(tmp_path, "d.sh", "torchrun pretrain_gpt.py " + SCRIPT_RUN +
                                " --recompute-granularity selective --recompute-modules core_attn\necho done\n"))
    assert ends.modules == {"core_attn"}
    with pytest.raises(ValueError, match="'Core_Attn', not a name"):  # argparse passes it; Megatron refuses it
        read_settings(_write(tmp_path, "e.sh", SCRIPT_RUN + " --recompute-granularity selective "
                             "--recompute-modules core_attn Core_Attn\n"))


DSV3 = os.path.join(EXAMPLES, "deepseek_v3_small_config.json")


def test_mtp_runs_only_uniform_groups_of_one(capsys, tmp_path):
    """multi_token_prediction.py asserts recompute_num_layers == 1 under uniform recompute: settings
    with MTP layers and larger groups are refused, and the constrained search never writes them."""
    import json  # noqa: PLC0415

    from gpuknap.search._patterns import framework_rule  # noqa: PLC0415

    config = tmp_path / "mtp.json"
    config.write_text(json.dumps({**json.load(open(DSV3)), "num_nextn_predict_layers": 1}))
    base = ("--num-layers 16 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*8|t*8mL' "
            "--mtp-num-layers 1 --recompute-granularity full --recompute-method uniform --recompute-num-layers ")
    with pytest.raises(ValueError, match="MTP layer recomputes only groups of 1"):
        read_settings(_write(tmp_path, "u2.txt", base + "2\n"))
    assert read_settings(_write(tmp_path, "u1.txt", base + "1\n")).num == 1
    kwargs = dict(micro_batches=8, seq=4096, tensor_parallel=2, expert_parallel=4, expert_tensor_parallel=1,
                  data_parallel=2, stages=2)
    with_mtp = load_spec(str(config), capacity="80GiB", **kwargs).model
    without = load_spec(DSV3, capacity="80GiB", **kwargs).model
    methods = {p.setting[:2] for p in framework_rule(with_mtp, "megatron").patterns}
    assert ("uniform", 1) in methods and not [m for m in methods if m[0] == "uniform" and m[1] > 1]
    assert ("uniform", 2) in {p.setting[:2] for p in framework_rule(without, "megatron").patterns}


def test_megatron_moe_with_tp_needs_sequence_parallelism(capsys, tmp_path):
    """MoELayer.forward raises when training with TP > 1 and no sequence parallelism."""
    mixtral = os.path.join(EXAMPLES, "mixtral_small_config.json")
    script = ("--num-layers 16 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*8|t*8L' "
              "--tensor-model-parallel-size 2 --expert-model-parallel-size 2 --expert-tensor-parallel-size 1 "
              "--micro-batch-size 1 --global-batch-size 16 --seq-length 4096 --use-distributed-optimizer "
              "--moe-grouped-gemm --moe-token-dispatcher-type alltoall --bf16 --num-experts 8 --moe-router-topk 2\n")
    refused(capsys, tmp_path, script, ["MoE layers refuse tensor parallelism without --sequence-parallel"],
            "run.sh", mixtral, "--dp", "2", "--capacity", "80GiB")
    assert rank(capsys, tmp_path, script.replace("--moe-grouped-gemm", "--moe-grouped-gemm --sequence-parallel"),
                "--dp", "2", "--capacity", "80GiB", name="run.sh", spec=mixtral)[0] == 0
    spec = load_spec(mixtral, capacity="80GiB", micro_batches=8, seq=4096, tensor_parallel=2, data_parallel=2,
                     stages=2, sequence_parallel=False)
    names = [spec.model.fronts[kind][0].name for kind in spec.model.kinds]
    plan = framework.framework_plan(spec.model, [9, 9], names, 1, "mixtral")
    with pytest.raises(ValueError, match="sequence_parallel: Megatron's MoE layers"):
        megatron.dump(plan)


def test_mindformers_one_stage_accumulates_gradients_and_splits_the_vocabulary(capsys, tmp_path):
    """base_trainer.py resets micro_batch_num to 1 at one stage and runs gradient_accumulation_steps
    micro-batches; core/parallel_config.py leaves vocab_emb_dp true (the embedding whole) there."""
    run = ["--micro-batches", "4", "--seq", "4096", "--tp", "4", "--dp", "2", "--quiet"]
    assert main(["best", LLAMA, "--stages", "1", "--emit", "mindformers", *run]) == 0
    text = capsys.readouterr().out
    assert "  micro_batch_num: 1\n" in text and "  gradient_accumulation_steps: 4\n" in text
    assert "  vocab_emb_dp: False\n" in text
    path = _write(tmp_path, "mf.yaml", text)
    assert main(["rank", LLAMA, "--from", path, "--json", "--quiet"]) == 0
    import json  # noqa: PLC0415
    assert json.loads(capsys.readouterr().out)["micro_batches"] == 4
    whole = text.replace("  vocab_emb_dp: False\n", "")
    refused(capsys, tmp_path, whole, ["vocab_emb_dp", "whole on every model-parallel rank"], "mf.yaml", LLAMA)
    assert main(["best", LLAMA, "--stages", "2", "--emit", "mindformers", *run]) == 0
    text = capsys.readouterr().out
    assert "  micro_batch_num: 4\n" in text and "gradient_accumulation_steps" not in text


def test_mindformers_base_config_is_refused(capsys, tmp_path):
    _write(tmp_path, "base.yaml", "recompute_config: {recompute: True}\n")
    refused(capsys, tmp_path, "base_config: ['base.yaml']\n" + MF, ["base_config", "merge"], "run.yaml")


def test_mindformers_moe_is_written_only_where_it_runs_as_costed(capsys):
    mixtral = os.path.join(EXAMPLES, "mixtral_small_config.json")
    run = ["--micro-batches", "8", "--seq", "4096", "--stages", "2", "--quiet", "--emit", "mindformers"]
    # MindFormers runs ETP 1 (moe_config.expert_model_parallel: 1, and every mcore model) or ETP = TP
    assert main(["best", mixtral, "--tp", "2", "--ep", "2", "--etp", "1", "--dp", "2", *run]) == 0
    assert "expert_model_parallel: 1" in capsys.readouterr().out
    assert main(["best", mixtral, "--tp", "2", "--ep", "2", "--dp", "2", *run]) == 0
    capsys.readouterr()
    assert main(["best", mixtral, "--tp", "4", "--ep", "2", "--etp", "2", "--dp", "2", *run]) == 2
    assert "expert_tensor_parallel" in capsys.readouterr().err


def test_a2a_p2p_needs_hierarchical_context_parallel_sizes(tmp_path):
    run = ("--num-layers 32 --pipeline-model-parallel-size 1 --pipeline-model-parallel-layout 'Et*32L' "
           "--context-parallel-size 2 --cp-comm-type a2a+p2p")
    with pytest.raises(ValueError, match="needs --hierarchical-context-parallel-sizes"):
        read_settings(_write(tmp_path, "a.txt", run + "\n"))
    assert read_settings(_write(tmp_path, "b.txt", run + " --hierarchical-context-parallel-sizes 2 1\n"))
    with pytest.raises(ValueError, match=r"product \(4\) to be the context-parallel size \(2\)"):
        read_settings(_write(tmp_path, "c.txt", run + " --hierarchical-context-parallel-sizes 2 2\n"))


def test_an_interleaved_simulated_search_with_nothing_fitting_says_so(capsys):
    argv = ["best", LLAMA, "--micro-batches", "6", "--seq", "4096", "--micro-batch-size", "2", "--capacity", "20GiB",
            "--tp", "2", "--stages", "3", "--interleave", "2", "--quiet", "--score"]
    assert main(argv + ["simulated"]) == 1
    simulated = capsys.readouterr().out
    assert main(argv + ["1f1b"]) == 1
    assert "no feasible split" in simulated and simulated == capsys.readouterr().out


def test_mtp_placed_on_another_stage_is_noted(tmp_path):
    """Megatron lets the MTP layers sit in the last virtual stage of any rank; gpuknap costs them on
    the last stage and says so when the layout puts them elsewhere."""
    base = "--num-layers 16 --pipeline-model-parallel-size 2 --mtp-num-layers 1 --pipeline-model-parallel-layout "
    other = read_settings(_write(tmp_path, "a.txt", base + "'Et*5|t*5|t*6m|L'\n"))
    assert [n for n in other.notes if "MTP layers on pipeline stage 0" in n]
    last = read_settings(_write(tmp_path, "b.txt", base + "'Et*5|t*5|t*6|mL'\n"))
    assert not [n for n in last.notes if "MTP" in n]
