"""MindFormers configurations read as MindFormers reads them (red team rt13, findings 1, 5 and 8):
``moe_config``'s keys (MoEConfig takes no other, ``modules/transformer/moe.py``), the optimizer
shard size (MindSpore's ``parallel_optimizer_config.optimizer_weight_shard_size``) and
``context_parallel_algo`` (``ContextParallelAlgo``, ``modules/transformer/transformer.py``).  The
inputs are MindFormers' own published files (tests/formats/data), minimally edited."""
from __future__ import annotations

import json
import os

import pytest
from paths import EXAMPLES

from gpuknap.formats import read_settings
from gpuknap.formats._mindformers_checks import MOE_CONFIG
from test_mindformers_redteam import _rank, _refused, _scored

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
MIXTRAL_FILE = os.path.join(DATA, "mindformers_r130_mixtral_8x7b_pretrain.yaml")
DSV3_FILE = os.path.join(DATA, "mindformers_r150_deepseek3_671b_pretrain.yaml")
MIXTRAL = os.path.join(EXAMPLES, "mixtral_8x7b_config.json")
DSV3 = os.path.join(EXAMPLES, "deepseek_v3_config.json")
MIRROR = "/work/.mirror/mindspore-lab+mindformers/repo"


def _edit(tmp_path, source, old, new, name="mf.yaml"):
    text = open(source).read()
    assert old in text, old
    path = tmp_path / name
    path.write_text(text.replace(old, new, 1))
    return str(path)


# 1: moe_config keys

@pytest.mark.parametrize("old,new,near", [
    ("  expert_model_parallel: 1\n", "  expert_model_paralel: 1\n", "expert_model_parallel"),
])
def test_a_misspelt_moe_config_key_of_a_real_file_is_refused(capsys, tmp_path, old, new, near):
    """MindFormers r1.5.0's DeepSeek-V3 671B file with expert_model_parallel misspelt: refused, not ETP 4."""
    assert _rank(capsys, DSV3_FILE, DSV3)[0] in (0, 1)
    path = _edit(tmp_path, DSV3_FILE, old, new)
    _refused(capsys, path, DSV3, [f"moe_config: unknown field '{new.split(':')[0].strip()}'", f"did you mean '{near}'",
                                  "MoEConfig"])


@pytest.mark.parametrize("old,new,near", [
    ("  expert_num: 8\n", "  expert_nums: 8\n", "expert_num"),
    ("  num_experts_chosen: 2\n", "  num_expert_chosen: 2\n", "num_experts_chosen"),
])
def test_misspelt_expert_counts_are_refused(capsys, tmp_path, old, new, near):
    assert _rank(capsys, MIXTRAL_FILE, MIXTRAL)[0] in (0, 1)
    _refused(capsys, _edit(tmp_path, MIXTRAL_FILE, old, new), MIXTRAL, [f"did you mean '{near}'"])


def test_mcore_files_do_not_read_moe_config(tmp_path):
    """template.py skips moe_config for use_legacy: False: a note, no refusal."""
    path = _edit(tmp_path, MIXTRAL_FILE, "# moe\n", "use_legacy: False\n")
    notes = " ".join(read_settings(path).notes)
    assert "moe_config is not read by mcore models" in notes


@pytest.mark.skipif(not os.path.isdir(MIRROR), reason="no MindFormers mirror here")
def test_moe_config_keys_are_moeconfigs_arguments_in_every_release():
    import ast
    import subprocess
    names = set()
    for ref in ("v1.3.0", "v1.5.0", "v1.7.0", "HEAD"):
        text = subprocess.run(["git", "--git-dir", MIRROR, "show", f"{ref}:mindformers/modules/transformer/moe.py"],
                              capture_output=True, text=True, check=True).stdout
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name == "MoEConfig":
                init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
                assert init.args.kwarg is None  # no **kwargs: an unknown key is a TypeError
                names |= {a.arg for a in init.args.args[1:]}
    assert names <= set(MOE_CONFIG)


# 5: parallel_optimizer_config.optimizer_weight_shard_size

def test_an_optimizer_shard_group_smaller_than_dp_is_refused(capsys, tmp_path):
    """MindSpore shards the optimizer over groups of optimizer_weight_shard_size data-parallel ranks; gpuknap
    costs it over every one (-1, the default)."""
    at = "  parallel_optimizer_config:\n"
    base = _scored(capsys, MIXTRAL_FILE, MIXTRAL)
    two = _edit(tmp_path, MIXTRAL_FILE, at, at + "    optimizer_weight_shard_size: 2\n")
    _refused(capsys, two, MIXTRAL, ["optimizer_weight_shard_size: 2", "not modelled", "8 data- and context-parallel"])
    for size in (-1, 8, 16):
        same = _edit(tmp_path, MIXTRAL_FILE, at, at + f"    optimizer_weight_shard_size: {size}\n", f"s{size}.yaml")
        assert _scored(capsys, same, MIXTRAL)["best"] == base["best"], size
    off = _edit(tmp_path, two, "  enable_parallel_optimizer: True\n", "  enable_parallel_optimizer: False\n", "o.yaml")
    _refused(capsys, off, MIXTRAL, ["without the distributed optimizer"])  # the key then shards nothing


# 8: context_parallel_algo

@pytest.mark.parametrize("algo,says", [
    ("context_parallel_algo: ulysses_cp", ["ulysses_cp", "not modelled"]),
    ("context_parallel_algo: hybrid_cp\n  ulysses_degree_in_cp: 2", ["hybrid_cp", "ulysses_degree_in_cp 2"]),
    ("context_parallel_algo: bogus_cp", ["'bogus_cp' is not one of MindFormers'", "ContextParallelAlgo"]),
])
def test_context_parallel_algorithms_other_than_the_ring_are_refused(capsys, tmp_path, algo, says):
    cp = _edit(tmp_path, MIXTRAL_FILE, "  data_parallel: 8\n", "  data_parallel: 4\n  context_parallel: 2\n", "cp.yaml")
    ring = _scored(capsys, cp, MIXTRAL)
    for same in ("context_parallel_algo: colossalai_cp", "context_parallel_algo: hybrid_cp\n  ulysses_degree_in_cp: 1"):
        path = _edit(tmp_path, cp, "  context_parallel: 2\n", f"  context_parallel: 2\n  {same}\n", "same.yaml")
        assert _scored(capsys, path, MIXTRAL)["best"] == ring["best"], same
    _refused(capsys, _edit(tmp_path, cp, "  context_parallel: 2\n", f"  context_parallel: 2\n  {algo}\n"), MIXTRAL,
             ["parallel_config.context_parallel_algo", *says])
    if "bogus" not in algo:  # without context parallelism the algorithm takes no effect (transformer.py)
        one = _edit(tmp_path, MIXTRAL_FILE, "  data_parallel: 8\n", f"  data_parallel: 8\n  {algo}\n", "one.yaml")
        assert _scored(capsys, one, MIXTRAL)["best"] == _scored(capsys, MIXTRAL_FILE, MIXTRAL)["best"]


# 4: use_flash_attention, whose legacy default is False

def test_attention_without_flash_is_costed_as_the_file_runs_it(capsys, tmp_path):
    """Legacy models default ``use_flash_attention`` to False (``llama_config.py``), mcore models to
    True; without it the attention scores and softmax are kept for the backward (a red team found the
    key never read, and a file leaving it out costed with flash attention).  The same run with the key
    False or left out costs more activation memory than with it True, as the cost model's own
    Architecture(flash_attention=False) does."""
    from gpuknap.formats import hf

    flash = _scored(capsys, MIXTRAL_FILE, MIXTRAL)
    off = _edit(tmp_path, MIXTRAL_FILE, "    use_flash_attention: True\n", "    use_flash_attention: False\n")
    gone = _edit(tmp_path, MIXTRAL_FILE, "    use_flash_attention: True\n", "", name="gone.yaml")
    results = []
    for path in (off, gone):
        rc, out, err = _rank(capsys, path, MIXTRAL)
        assert rc in (0, 1) and "use_flash_attention is false" in err, err
        payload = json.loads(out)
        payload.pop("from")
        results.append(payload)
    assert results[0]["best"] == results[1]["best"] != flash["best"]
    with open(MIXTRAL) as f:
        data = json.load(f)
    seq = 4096
    a, b = (hf.model_of(data, "m", 80 * 2**30, 2, seq=seq, flash_attention=v, tensor_parallel=1, data_parallel=1)
            for v in (True, False))
    assert b.fronts["moe"][0].memory(1) > a.fronts["moe"][0].memory(1)  # the scores kept
    assert read_settings(gone).run["flash_attention"] is False  # a legacy file (use_legacy defaults to True)
    mcore = tmp_path / "mcore.yaml"
    mcore.write_text(open(gone).read() + "use_legacy: False\n")
    assert read_settings(str(mcore)).run["flash_attention"] is True  # MFModelConfig's default
    from gpuknap.formats import load_spec
    with pytest.raises(ValueError, match="flash_attention: attention without flash attention is costed on a Hugging"):
        load_spec(os.path.join(EXAMPLES, "llama2_70b.json"), flash_attention=False)


def test_yaml_that_cannot_be_read_says_so_and_megatron_test_configs_are_named(tmp_path):
    """A review's findings: a MindFormers file YAML cannot parse was called neither Megatron's nor
    MindFormers' (it has their sections); a Megatron functional test's MODEL_ARGS mapping met shell
    errors about pipes."""
    tab = tmp_path / "tab.yaml"
    tab.write_text("parallel_config:\n\tpipeline_stage: 2\nmodel:\n  model_config: {num_layers: 4}\n")
    with pytest.raises(ValueError) as err:
        read_settings(str(tab))
    assert "not valid YAML at line 2" in str(err.value) and "neither" not in str(err.value)
    test = tmp_path / "model_config.yaml"
    test.write_text("ENV_VARS:\n  CUDA_DEVICE_MAX_CONNECTIONS: 1\nMODEL_ARGS:\n  --num-layers: 4\n"
                    "  --pipeline-model-parallel-layout: Et*2|t*2L\n")
    with pytest.raises(ValueError, match="MODEL_ARGS: a Megatron functional test's model_config.yaml"):
        read_settings(str(test))
