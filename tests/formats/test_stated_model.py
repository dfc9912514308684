"""What a framework's settings state of the model's shape and experts is checked against the model
costed (red team rt13, finding 6): a mismatch is refused naming both values and the config's field;
what the cost model does not model (capacity factors, per-expert GEMMs) is refused by name.
Megatron's sources: ``megatron/training/arguments.py`` (--num-experts None is dense, moe_freq_type),
``argument_utils.py`` (--num-query-groups only with --group-query-attention),
``transformer_config.py`` (moe_router_topk 2, moe_grouped_gemm False, a negative capacity factor
is None) and ``models/gpt/gpt_layer_specs.py`` (layer i is MoE when i % freq == 0)."""
from __future__ import annotations

import os

import pytest
from paths import EXAMPLES

from gpuknap.cli import main
from gpuknap.formats import megatron, megatron_model_flags
from gpuknap.formats._stated_shape import layer_pattern

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
MIXTRAL = os.path.join(EXAMPLES, "mixtral_8x7b_config.json")
LLAMA = os.path.join(EXAMPLES, "llama2_7b_config.json")
DEEPSEEK = os.path.join(EXAMPLES, "deepseek_v3_config.json")
#: Megatron's own Mixtral example (examples/mixtral/train_mixtral_8x7b_distributed.sh) with a layout.
EXAMPLE = os.path.join(DATA, "megatron_head_mixtral_8x7b_layout.sh")
RUN = ["--dp", "8", "--quiet"]
BASE = ("python pretrain_gpt.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --num-layers 32 "
        "--pipeline-model-parallel-layout 'Et*8|t*8|t*8|t*8L' --micro-batch-size 1 --global-batch-size 64 "
        "--seq-length 4096 --use-distributed-optimizer --bf16 --expert-model-parallel-size 8 "
        "--moe-token-dispatcher-type alltoall ")
MOE = BASE + "--num-experts 8 --moe-router-topk 2 --moe-grouped-gemm "


def rank(capsys, tmp_path, text, spec=MIXTRAL, *extra):
    path = tmp_path / "run.sh"
    path.write_text(text + "\n")
    rc = main(["rank", spec, "--from", str(path), *RUN, *extra])
    return rc, capsys.readouterr().err.strip()


def refused(capsys, tmp_path, text, says, spec=MIXTRAL):
    rc, err = rank(capsys, tmp_path, text, spec)
    assert rc == 2 and len(err.splitlines()) == 1, err
    for part in says:
        assert part in err, (part, err)


def test_megatrons_mixtral_example_reads_and_a_changed_shape_is_refused(capsys, tmp_path):
    text = open(EXAMPLE).read()
    assert rank(capsys, tmp_path, text)[0] in (0, 1)
    for old, new, says in (
            ("--num-experts 8", "--num-experts 16", "--num-experts 16: the model config has 8 experts (num_local_experts)"),
            ("--moe-router-topk 2", "--moe-router-topk 4", "--moe-router-topk 4: the model config has 2 experts per "
                                                           "token (num_experts_per_tok)"),
            ("--hidden-size 4096", "--hidden-size 8192", "--hidden-size 8192: the model config has hidden size 4096 "
                                                         "(hidden_size)"),
            # every Mixtral layer is a MoE layer: --ffn-hidden-size is the experts' width
            ("--ffn-hidden-size 14336", "--ffn-hidden-size 28672", "an expert width of 14336 (intermediate_size)"),
            ("--num-attention-heads 32", "--num-attention-heads 64", "64: the model config has 32 attention heads"),
            ("--num-query-groups 8", "--num-query-groups 4", "--num-query-groups 4: the model config has 8 key/value "
                                                             "heads (num_key_value_heads)"),
            ("--group-query-attention", "", "without --group-query-attention (Megatron then runs one key/value head "
                                            "per attention head): the model config has 8 key/value heads"),
            ("--num-experts 8", "", "no --num-experts (Megatron then builds a dense model): the model config has 8 "
                                    "experts (num_local_experts); add --num-experts 8"),
            ("--moe-grouped-gemm", "", "without --moe-grouped-gemm"),
            ("--moe-router-topk 2", "", "no --moe-router-topk (Megatron's default, 2"),  # 2 is Mixtral's: read
    ):
        if old == "--moe-router-topk 2" and not new:
            assert rank(capsys, tmp_path, text.replace(old, new))[0] in (0, 1)
            continue
        assert old in text
        refused(capsys, tmp_path, text.replace(old, new), [says])


def test_the_real_mixtral_shape_variant_of_the_red_team_is_refused(capsys, tmp_path):
    text = open(EXAMPLE).read()
    for old, new in (("--hidden-size 4096", "--hidden-size 8192"), ("--ffn-hidden-size 14336", "--ffn-hidden-size 28672"),
                     ("--num-experts 8", "--num-experts 16"), ("--moe-router-topk 2", "--moe-router-topk 4")):
        text = text.replace(old, new)
    refused(capsys, tmp_path, text, ["--hidden-size 8192", "hidden size 4096"])


def test_a_dense_config_refuses_experts_and_a_dense_run_on_a_moe_config_is_refused(capsys, tmp_path):
    refused(capsys, tmp_path, MOE.replace(" --expert-model-parallel-size 8", ""),
            ["--num-experts 8: the model config has no experts (a dense model)"], spec=LLAMA)
    refused(capsys, tmp_path, BASE + "--moe-grouped-gemm", ["no --num-experts", "add --num-experts 8"])
    refused(capsys, tmp_path, BASE + "--moe-grouped-gemm --num-experts 0", ["--num-experts 0 (Megatron: no experts)"])
    assert rank(capsys, tmp_path, MOE)[0] in (0, 1)


def test_capacity_factors_and_padding_are_refused_as_not_modelled(capsys, tmp_path):
    refused(capsys, tmp_path, MOE + "--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity",
            ["--moe-expert-capacity-factor: 1.0:", "dropped (--moe-token-drop-policy probs) padded to capacity",
             "not model"])
    refused(capsys, tmp_path, MOE + "--moe-expert-capacity-factor 1.25 --moe-token-drop-policy position",
            ["--moe-token-drop-policy position", "dropless"])
    refused(capsys, tmp_path, MOE + "--moe-pad-expert-input-to-capacity", ["without a capacity factor"])
    assert rank(capsys, tmp_path, MOE + "--moe-expert-capacity-factor -1")[0] in (0, 1)  # None: dropless
    refused(capsys, tmp_path, MOE + "--moe-expert-capacity-factor x", ["expected a number"])


@pytest.mark.parametrize("text, want", [
    ("1", 1), ("4", 4), ("([1]*3+[0]*1)*2", [1, 1, 1, 0] * 2), ("[0]+[1]*23", [0] + [1] * 23),
    ("([0]*3+[1]*58)", [0] * 3 + [1] * 58), ("[1,0,1]", [1, 0, 1]), ("2*[1,0]", [1, 0, 1, 0])])
def test_moe_layer_freq_is_read_as_megatrons_moe_freq_type(text, want):
    assert layer_pattern(text, "f") == want


@pytest.mark.parametrize("text", ["[1]**3", "[1]*9999999", "__import__('os')", "[1]+1", "[[1]]", "[2,1]", "([1]",
                                  "[1]*[2]", "", "1.5"])
def test_a_layer_pattern_megatron_would_not_read_as_a_list_of_layers_is_refused(text):
    with pytest.raises(ValueError, match="^f: "):
        layer_pattern(text, "f")


def test_moe_layer_freq_is_checked_against_the_config_layers(capsys, tmp_path):
    refused(capsys, tmp_path, MOE + "--moe-layer-freq 2", ["--moe-layer-freq 2: the model config has MoE layers "
                                                          "([1]*32) (every layer of a mixtral model)"])
    refused(capsys, tmp_path, MOE + "--moe-layer-freq '[1]*30'", ["30 layers in the pattern", "the model has 32"])
    assert rank(capsys, tmp_path, MOE + "--moe-layer-freq '([1]*16)*2'")[0] in (0, 1)
    assert rank(capsys, tmp_path, MOE + "--moe-layer-freq 1")[0] in (0, 1)


def test_emitted_blocks_state_the_experts_and_read_back(capsys, tmp_path):
    """A whole run without --num-experts is dense: the emitted block writes the model's experts."""
    flags = megatron_model_flags(DEEPSEEK)
    assert flags[:3] == ["--num-experts 256", "--moe-router-topk 8", "--moe-ffn-hidden-size 2048"]
    assert "--moe-shared-expert-intermediate-size 2048" in flags
    assert '--moe-layer-freq "([0]*3+[1]*58)"' in flags
    assert megatron_model_flags(LLAMA) == []
    config = os.path.join(EXAMPLES, "mixtral_small_config.json")
    args = ["--seq", "4096", "--micro-batches", "8", "--ep", "2", "--dp", "2", "--quiet"]
    assert main(["best", config, "--stages", "2", *args, "--emit", "megatron"]) == 0
    block = capsys.readouterr().out
    assert "--num-experts 8" in block and "--moe-router-topk 2" in block
    (tmp_path / "run.sh").write_text(block)
    assert main(["rank", config, "--from", str(tmp_path / "run.sh"), *args[:4], "--dp", "2", "--quiet"]) in (0, 1)
    stated = megatron.load(tmp_path / "run.sh").shape
    assert stated["experts"][0] == 8 and stated["top_k"][0] == 2


def test_mindformers_shape_and_experts_are_checked(capsys, tmp_path):
    path = os.path.join(DATA, "mindformers_r130_mixtral_8x7b_pretrain.yaml")
    text = open(path).read()
    args = ["--quiet"]

    def run(content):
        (tmp_path / "mf.yaml").write_text(content)
        rc = main(["rank", MIXTRAL, "--from", str(tmp_path / "mf.yaml"), *args])
        return rc, capsys.readouterr().err.strip()

    assert run(text)[0] in (0, 1)
    for old, new, says in (("expert_num: 8", "expert_num: 16", "moe_config.expert_num: 16: the model config has 8 "
                                                               "experts (num_local_experts)"),
                           ("num_experts_chosen: 2", "num_experts_chosen: 4", "2 experts per token"),
                           ("hidden_size: 4096", "hidden_size: 8192", "model.model_config.hidden_size: 8192"),
                           ("n_kv_heads: 8", "n_kv_heads: 4", "8 key/value heads"),
                           ("intermediate_size: 14336", "intermediate_size: 1000", "an expert width of 14336")):
        assert old in text, old
        rc, err = run(text.replace(old, new, 1))
        assert rc == 2 and says in err and len(err.splitlines()) == 1, err


def test_mcore_mindformers_names_one_setting_once_and_refuses_a_capacity_factor(capsys, tmp_path):
    base = ("use_legacy: False\nparallel:\n  enable_parallel_optimizer: True\nparallel_config:\n  data_parallel: 8\n  pipeline_stage: 2\n  micro_batch_num: 4\n"
            "  expert_parallel: 8\nmodel:\n  model_config:\n    num_layers: 32\n    seq_length: 4096\n"
            "    hidden_size: 4096\n    num_experts: 8\n    num_experts_per_tok: 2\n")

    def run(content):
        (tmp_path / "mf.yaml").write_text(content)
        rc = main(["rank", MIXTRAL, "--from", str(tmp_path / "mf.yaml"), "--quiet"])
        return rc, capsys.readouterr().err.strip()

    assert run(base)[0] in (0, 1)
    rc, err = run(base + "    num_moe_experts: 8\n")
    assert rc == 2 and "num_experts and num_moe_experts name one setting" in err
    rc, err = run(base + "    moe_router_topk: 4\n")
    assert rc == 2 and "name one setting" in err
    rc, err = run(base + "    moe_expert_capacity_factor: 1.5\n")
    assert rc == 2 and "dropless" in err
    assert run(base + "    moe_expert_capacity_factor: -1\n")[0] in (0, 1)
    rc, err = run(base.replace("num_experts: 8", "num_experts: 4"))
    assert rc == 2 and "model.model_config.num_experts: 4: the model config has 8 experts" in err
