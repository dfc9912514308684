"""MindFormers configurations read as MindFormers runs them (red-team findings F1, F2, F4, F5, F6,
F10, F11): the experts' tensor-parallel size, sequence pipelining and schedulers, the defaults of a
file that states its run, interleaved micro-batches, LlamaConfig's ``pipeline_stage``, YAML merge
keys and errors that name the file's key.  MindFormers sources are cited from its repository
(``mindformers/...``); each case either reads the file as MindFormers runs it or exits 2 with one
line naming the file and the key."""
from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from paths import EXAMPLES

from gpuknap.cli import main
from gpuknap.formats import read_settings
from gpuknap.formats._documents import read_document

LLAMA = os.path.join(EXAMPLES, "llama2_7b_config.json")  # embedding, 32 dense layers, output
MIXTRAL = os.path.join(EXAMPLES, "mixtral_small_config.json")  # 16 MoE layers, 8 experts
#: A whole legacy llama run on 8 ranks: TP 8, two stages.
WHOLE = ("parallel_config: {data_parallel: 1, model_parallel: 8, pipeline_stage: 2, micro_batch_num: 8}\n"
         "parallel: {enable_parallel_optimizer: True}\n"
         "runner_config: {batch_size: 1}\n"
         "model: {model_config: {type: LlamaConfig, num_layers: 32, offset: 0, seq_length: 4096}}\n")
#: A legacy MoE run: DP 2, TP 2, EP 2 (moe_config is read by legacy models only: template.py).
MOE = ("parallel_config: {data_parallel: 2, model_parallel: 2, expert_parallel: 2, pipeline_stage: 2, "
       "micro_batch_num: 4, use_seq_parallel: True}\n"
       "parallel: {enable_parallel_optimizer: True}\n"
       "runner_config: {batch_size: 1}\n"
       "model: {model_config: {num_layers: 16, offset: 0, seq_length: 4096}}\n"
       "moe_config: {expert_num: 8%s}\n")


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _rank(capsys, path, spec, *extra):
    rc = main(["rank", spec, "--from", path, "--quiet", "--json", *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _scored(capsys, path, spec, *extra):
    """The scored split and settings of ``rank --json`` (without the file's name)."""
    rc, out, err = _rank(capsys, path, spec, *extra)
    assert rc in (0, 1), err
    payload = json.loads(out)
    payload.pop("from")
    return payload


def _refused(capsys, path, spec, words, *extra):
    rc, _, err = _rank(capsys, path, spec, *extra)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    for w in [path, *words]:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# F1: moe_config.expert_model_parallel is the experts' tensor-parallel size.  llama_layer.py
# (LlamaFeedForward, the legacy MoE models' experts): None means model_parallel, other values than 1
# and model_parallel raise; moe.py MoEV2: the experts' data parallelism grows by mp / mp_moe.

def test_expert_model_parallel_is_the_expert_tensor_parallel_size(capsys, tmp_path):
    one = _write(tmp_path, "one.yaml", MOE % ", expert_model_parallel: 1")
    unset = _write(tmp_path, "unset.yaml", MOE % "")
    assert read_settings(one).run["etp"] == 1
    assert read_settings(unset).run["etp"] == 2  # None: model_parallel (llama_layer.py)
    bare = _write(tmp_path, "bare.yaml", (MOE % "").replace("moe_config: {expert_num: 8}\n", ""))
    assert "etp" not in read_settings(bare).run  # no moe_config: the command line's --etp
    as_one = _scored(capsys, one, MIXTRAL, "--capacity", "80GiB")
    assert as_one == _scored(capsys, bare, MIXTRAL, "--capacity", "80GiB", "--etp", "1")
    assert as_one != _scored(capsys, unset, MIXTRAL, "--capacity", "80GiB")  # ETP 2 costs otherwise
    same_as_tp = _write(tmp_path, "tp.yaml", MOE % ", expert_model_parallel: 2")
    assert _scored(capsys, same_as_tp, MIXTRAL, "--capacity", "80GiB") == _scored(capsys, unset, MIXTRAL,
                                                                                    "--capacity", "80GiB")
    _refused(capsys, one, MIXTRAL, ["etp = 1", "--etp 2"], "--etp", "2")
    # MindFormers' default (ETP = model_parallel), not the flag's
    _refused(capsys, unset, MIXTRAL, ["etp = 2", "expert_model_parallel not given", "--etp 1"], "--etp", "1")


def test_expert_model_parallel_values_mindformers_refuses_are_refused(capsys, tmp_path):
    four = _write(tmp_path, "four.yaml", MOE.replace("model_parallel: 2", "model_parallel: 4")
                  % ", expert_model_parallel: 2")
    _refused(capsys, four, MIXTRAL, ["moe_config.expert_model_parallel", "1 or model_parallel (4)",
                                     "llama_layer.py"])
    text = _write(tmp_path, "str.yaml", MOE % ", expert_model_parallel: '1'")
    _refused(capsys, text, MIXTRAL, ["moe_config.expert_model_parallel", "expected an integer"])
    fragment = ("parallel_config: {pipeline_stage: 2, micro_batch_num: 4}\n"
                "model: {model_config: {num_layers: 16, offset: 0}}\nmoe_config: {expert_num: 8, "
                "expert_model_parallel: 2}\n")
    _refused(capsys, _write(tmp_path, "frag.yaml", fragment), MIXTRAL,
             ["moe_config.expert_model_parallel", "does not give"])


def test_expert_model_parallel_is_not_read_where_mindformers_does_not_read_it(tmp_path):
    # a dense legacy model (expert_num 1: models/utils.py tests expert_num > 1) and mcore models
    # (template.py skips moe_config for use_legacy: False)
    dense = _write(tmp_path, "dense.yaml", (MOE % ", expert_model_parallel: 1").replace("expert_num: 8",
                                                                                         "expert_num: 1"))
    mcore = _write(tmp_path, "mcore.yaml", "use_legacy: False\n" + MOE % ", expert_model_parallel: 2")
    assert "etp" not in read_settings(dense).run and "etp" not in read_settings(mcore).run


@pytest.mark.parametrize("key", ["num_moe_experts", "n_routed_experts", "num_experts"])
def test_mcore_experts_run_without_tensor_parallelism(capsys, tmp_path, key):
    """moe/ffn.py (FFNGroupedGEMM.shard, mcore's only experts): the experts split over expert_parallel
    only, never over model_parallel: ETP 1 whatever TP, and a flag that says otherwise is refused."""
    text = "use_legacy: False\n" + (MOE % "").replace("seq_length: 4096}", f"seq_length: 4096, {key}: 8}}")
    path = _write(tmp_path, "mcore_moe.yaml", text)
    assert read_settings(path).run["etp"] == 1
    assert _scored(capsys, path, MIXTRAL) == _scored(capsys, path, MIXTRAL, "--etp", "1")
    _refused(capsys, path, MIXTRAL, ["etp = 1", "FFNGroupedGEMM", "--etp 2"], "--etp", "2")


def test_the_shipped_deepseek3_file_runs_experts_without_tensor_parallelism(tmp_path):
    """research/deepseek3/deepseek3_671b/pretrain_deepseek3_671b.yaml: model_parallel 4,
    expert_model_parallel 1 (the MoE keys as there, the rest cut)."""
    text = ("parallel_config: {data_parallel: 16, model_parallel: 4, pipeline_stage: 16, expert_parallel: 8, "
            "micro_batch_num: 32, use_seq_parallel: True}\nmicro_batch_interleave_num: 1\n"
            "model: {model_config: {num_layers: 61, mtp_depth: 1, offset: [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
            "1, 1, -1]}}\nmoe_config: {expert_num: 256, first_k_dense_replace: 3, expert_model_parallel: 1}\n")
    run = read_settings(_write(tmp_path, "ds3.yaml", text)).run
    assert (run["tp"], run["etp"], run["ep"]) == (4, 1, 8)


# F2: sequence pipelining (parallel_config.seq_split_num, models/llama/llama.py seq_pipe) and
# schedulers other than MindSpore's default 1f1b (parallel.pipeline_config.pipeline_scheduler,
# handed to MindSpore by core/context/parallel.py; check_rules.py pairs seqvpp with seq_split_num).

def _scheduler(settings):
    return ("enable_parallel_optimizer: True}",
            "enable_parallel_optimizer: True, pipeline_config: {" + settings + "}}")


@pytest.mark.parametrize("change, words", [
    (("micro_batch_num: 8}", "micro_batch_num: 8, seq_split_num: 8}"), ["parallel_config.seq_split_num", "8"]),
    (("micro_batch_num: 8}", "micro_batch_num: 8, seq_split_num: True}"), ["parallel_config.seq_split_num"]),
    (_scheduler("pipeline_interleave: True, pipeline_scheduler: seqpipe"),
     ["parallel.pipeline_config.pipeline_scheduler", "'seqpipe'"]),
    (_scheduler("pipeline_scheduler: gpipe"), ["parallel.pipeline_config.pipeline_scheduler", "'gpipe'"]),
    (_scheduler("pipeline_interleave: True, pipeline_scheduler: seqvpp"), ["pipeline_scheduler", "'seqvpp'"]),
    (_scheduler("pipeline_scheduler: zero_bubble_v"), ["pipeline_scheduler", "'zero_bubble_v'"]),
    (_scheduler("pipeline_scheduler: null"), ["pipeline_scheduler", "null is not a scheduler"]),
])
def test_sequence_pipelining_and_other_schedulers_are_refused(capsys, tmp_path, change, words):
    _refused(capsys, _write(tmp_path, "s.yaml", WHOLE.replace(*change)), LLAMA, words, "--capacity", "80GiB")


def test_the_default_scheduler_and_split_are_read(capsys, tmp_path):
    plain = _scored(capsys, _write(tmp_path, "a.yaml", WHOLE), LLAMA, "--capacity", "80GiB")
    said = WHOLE.replace("micro_batch_num: 8}", "micro_batch_num: 8, seq_split_num: 1}").replace(
        "enable_parallel_optimizer: True}", "enable_parallel_optimizer: True, pipeline_config: "
        "{pipeline_interleave: False, pipeline_scheduler: 1f1b}}")
    assert _scored(capsys, _write(tmp_path, "b.yaml", said), LLAMA, "--capacity", "80GiB") == plain


# F4: a file that states its run (data_parallel or model_parallel given) leaves the rest at
# MindFormers' defaults: ParallelConfig model_parallel = 1 and micro_batch_num = 1, RunnerConfig
# batch_size = 1 (tools/register/template.py), not the spec's or the command line's.

def test_a_whole_file_without_model_parallel_runs_tp_1(capsys, tmp_path):
    path = _write(tmp_path, "nomp.yaml", WHOLE.replace("model_parallel: 8, ", ""))
    assert read_settings(path).run["tp"] == 1
    _refused(capsys, path, LLAMA, ["tp = 1", "no parallel_config.model_parallel", "--tp 8"], "--tp", "8",
             "--capacity", "80GiB")
    plain = _scored(capsys, path, LLAMA, "--capacity", "80GiB")
    assert plain == _scored(capsys, path, LLAMA, "--capacity", "80GiB", "--tp", "1")


def test_a_whole_file_without_micro_batch_num_runs_one_micro_batch(capsys, tmp_path):
    path = _write(tmp_path, "nombn.yaml", WHOLE.replace(", micro_batch_num: 8", ""))
    assert read_settings(path).run["micro_batches"] == 1
    got = _scored(capsys, path, LLAMA, "--capacity", "80GiB")
    assert got["micro_batches"] == 1 and any("no parallel_config.micro_batch_num" in n for n in got["notes"])
    _refused(capsys, path, LLAMA, ["micro_batches = 1", "no parallel_config.micro_batch_num", "--micro-batches 64"],
             "--micro-batches", "64",
             "--capacity", "80GiB")
    without_batch = _write(tmp_path, "nobs.yaml", WHOLE.replace("runner_config: {batch_size: 1}\n", ""))
    assert read_settings(without_batch).run["micro_batch"] == 1


def test_a_fragment_leaves_the_sizes_to_the_command_line(tmp_path):
    fragment = ("parallel_config: {pipeline_stage: 2, micro_batch_num: 8}\n"
                "model: {model_config: {num_layers: 32, offset: 0}}\n")
    run = read_settings(_write(tmp_path, "f.yaml", fragment)).run
    assert run == {"micro_batches": 8}


# F5: trainer/base_trainer.py: a micro-batch holds batch_size x micro_batch_interleave_num samples.

def test_interleaved_micro_batches_hold_batch_size_times_the_slices(capsys, tmp_path):
    """MicroBatchInterleaved runs a micro-batch of batch_size x N samples as N slices: costed as one
    micro-batch of them all, the same as batch_size x N without interleaving."""
    two = _scored(capsys, _write(tmp_path, "mbi.yaml", WHOLE + "micro_batch_interleave_num: 2\n"), LLAMA,
                  "--capacity", "80GiB")
    doubled = WHOLE.replace("batch_size: 1}", "batch_size: 2}")
    assert doubled != WHOLE
    plain = _scored(capsys, _write(tmp_path, "bs2.yaml", doubled), LLAMA, "--capacity", "80GiB")
    assert two["best"] == plain["best"] and any("micro_batch_interleave_num 2" in n for n in two["notes"])
    _refused(capsys, _write(tmp_path, "mbi0.yaml", WHOLE + "micro_batch_interleave_num: 0\n"), LLAMA,
             ["micro_batch_interleave_num", "from 1"], "--capacity", "80GiB")
    _refused(capsys, _write(tmp_path, "typo.yaml", WHOLE + "micro_batch_interleave_nm: 2\n"), LLAMA,
             ["micro_batch_interleave_nm", "did you mean 'micro_batch_interleave_num'"], "--capacity", "80GiB")
    one = _write(tmp_path, "one.yaml", WHOLE + "micro_batch_interleave_num: 1\n")
    assert _scored(capsys, one, LLAMA, "--capacity", "80GiB") == _scored(
        capsys, _write(tmp_path, "plain.yaml", WHOLE), LLAMA, "--capacity", "80GiB")


# F6: models/llama/llama_config.py: pipeline_stage {start_stage, stage_num, offset} replaces offset
# and the stage count when start_stage + stage_num <= parallel_config.pipeline_stage, else is unused;
# models/utils.py LayerSetting: stage_num 0 means parallel_config.pipeline_stage stages.

def _stage(offset, start, count, kind="LlamaConfig", legacy=""):
    return (legacy + "parallel_config: {pipeline_stage: 4, micro_batch_num: 8}\n"
            f"model: {{model_config: {{type: {kind}, num_layers: 32, offset: 0, pipeline_stage: "
            f"{{start_stage: {start}, stage_num: {count}, offset: {offset}}}}}}}\n")


def test_llama_pipeline_stage_replaces_the_offsets(tmp_path):
    st = read_settings(_write(tmp_path, "a.yaml", _stage("[2, 0, -1, -1]", 0, 4)))
    assert list(st.decoders) == [10, 8, 7, 7]
    st = read_settings(_write(tmp_path, "b.yaml", _stage("[1, 0, 0, -1]", 0, 0)))
    assert list(st.decoders) == [9, 8, 8, 7]
    unused = read_settings(_write(tmp_path, "c.yaml", _stage("[2, 0, -1, -1]", 2, 4)))
    assert list(unused.decoders) == [8, 8, 8, 8] and [n for n in unused.notes if "pipeline_stage is not used" in n]


@pytest.mark.parametrize("text, words", [
    (_stage("[1, -1]", 1, 2), ["model.model_config.pipeline_stage", "2 of the 4 stages"]),
    (_stage("[2, 0, -1, -1]", 0, 4, kind="DeepseekV3Config"), ["model.model_config.pipeline_stage",
                                                               "'DeepseekV3Config'"]),
    (_stage("[2, 0, -1, -1]", 0, 4, legacy="use_legacy: False\n"), ["model.model_config.pipeline_stage", "mcore"]),
    (_stage("[2, 0, -1, -1]", "'0'", 4), ["model.model_config.pipeline_stage.start_stage"]),
    (_stage("[2, 0, -1, -2]", 0, 4), ["model.model_config.pipeline_stage.offset", "sums to -1"]),
    (_stage("[2, 0, -1, -1]", 0, 4).replace("start_stage: 0, ", ""), ["model.model_config.pipeline_stage",
                                                                      "start_stage, stage_num and offset"]),
])
def test_pipeline_stage_mindformers_would_run_otherwise_is_refused(capsys, tmp_path, text, words):
    _refused(capsys, _write(tmp_path, "s.yaml", text), LLAMA, words, "--capacity", "80GiB", "--tp", "8", "--seq",
             "4096")


# F10: YAML merge keys, which yaml.safe_load (and so MindFormers' reader) resolves.

def test_yaml_merge_keys_are_read_as_yaml_reads_them(capsys, tmp_path):
    merged = WHOLE.replace("parallel_config: {data_parallel: 1, model_parallel: 8,",
                           "base: &pc {data_parallel: 1, model_parallel: 4}\nparallel_config: {<<: *pc, "
                           "model_parallel: 8,")
    path = _write(tmp_path, "m.yaml", merged)
    assert read_document(path)["parallel_config"]["model_parallel"] == 8  # the mapping's own value wins
    assert _scored(capsys, path, LLAMA, "--capacity", "80GiB") == _scored(
        capsys, _write(tmp_path, "plain.yaml", WHOLE), LLAMA, "--capacity", "80GiB")
    block = "base: &pc\n  data_parallel: 1\nparallel_config:\n  <<: *pc\n  pipeline_stage: 2\n  pipeline_stage: 4\n"
    with pytest.raises(ValueError, match=r"'pipeline_stage' is given twice \(lines 5 and 6\)"):
        read_document(_write(tmp_path, "d.yaml", block))
    with pytest.raises(ValueError, match="'data_parallel' is given twice"):
        read_document(_write(tmp_path, "e.yaml", "base: &pc {data_parallel: 1, data_parallel: 2}\n"
                                                 "parallel_config: {<<: *pc}\n"))


def test_json_documents_are_unaffected_by_merge_keys(tmp_path):
    assert read_document(_write(tmp_path, "a.json", '{"<<": {"a": 1}, "b": 2}')) == {"<<": {"a": 1}, "b": 2}
    with pytest.raises(ValueError, match="given twice"):
        read_document(_write(tmp_path, "b.json", '{"b": 1, "b": 2}'))


# F11: type errors name the file's key, not gpuknap's internal run field.

@pytest.mark.parametrize("change, key", [
    (("seq_length: 4096", "seq_length: '4096'"), "model.model_config.seq_length"),
    (("batch_size: 1", "batch_size: '1'"), "runner_config.batch_size"),
    (("micro_batch_num: 8", "micro_batch_num: 8.0"), "parallel_config.micro_batch_num"),
    (("data_parallel: 1", "data_parallel: 0"), "parallel_config.data_parallel"),
    (("model_parallel: 8", "model_parallel: True"), "parallel_config.model_parallel"),
    (("data_parallel: 1,", "data_parallel: 1, context_parallel: '2',"), "parallel_config.context_parallel"),
    (("data_parallel: 1,", "data_parallel: 1, use_seq_parallel: 'yes',"), "parallel_config.use_seq_parallel"),
])
def test_type_errors_name_the_files_key(capsys, tmp_path, change, key):
    line = _refused(capsys, _write(tmp_path, "t.yaml", WHOLE.replace(*change)), LLAMA, [key], "--capacity", "80GiB")
    assert not any(f": {name}:" in line for name in ("seq", "micro_batch", "micro_batches", "dp", "tp", "cp"))


def test_one_stage_gradient_accumulation_type_error_names_its_key(capsys, tmp_path):
    text = WHOLE.replace("pipeline_stage: 2", "pipeline_stage: 1").replace(
        "micro_batch_num: 8}", "micro_batch_num: 1, vocab_emb_dp: False}").replace(
        "batch_size: 1}", "batch_size: 1, gradient_accumulation_steps: 2.5}")
    _refused(capsys, _write(tmp_path, "g.yaml", text), LLAMA, ["runner_config.gradient_accumulation_steps"],
             "--capacity", "80GiB")


def test_moe_blocks_state_the_experts_tensor_parallelism(capsys, tmp_path):
    """best --emit mindformers: a plan with ETP 1 writes moe_config.expert_model_parallel: 1 (legacy
    models read it; mcore ones run ETP 1 anyway) and reads back to the same score; a plan with ETP = TP
    says mcore models run ETP 1; another ETP is refused (llama_layer.py takes only 1 or TP)."""
    run = ["--capacity", "12GiB", "--stages", "4", "--micro-batches", "32", "--seq", "8192", "--micro-batch-size", "4",
           "--tp", "8", "--dp", "2"]

    def emitted(*extra):
        rc = main(["best", MIXTRAL, *run, *extra, "--emit", "mindformers", "--quiet"])
        out = capsys.readouterr()
        return rc, out.out, out.err

    rc, block, _ = emitted("--etp", "1")
    assert rc == 0 and yaml.safe_load(block)["moe_config"] == {"expert_model_parallel": 1}
    planned = re.search(r"slowest ([\d.]+)", block).group(1)
    path = _write(tmp_path, "mf.yaml", block)
    assert read_settings(path).run["etp"] == 1
    assert f"{_scored(capsys, path, MIXTRAL, '--capacity', '12GiB')['best']['score']:.6g}" == planned
    rc, block, _ = emitted()
    assert rc == 0 and "moe_config" not in yaml.safe_load(block) and "mcore models (use_legacy: False)" in block
    rc, _, err = emitted("--etp", "2", "--ep", "2")
    assert rc == 2 and "--etp 1 or --etp equal to --tp" in err
