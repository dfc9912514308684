"""Hugging Face config.json files of dense models: the analytic model they give, end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from paths import EXAMPLES

from gpuknap import best_splits
from gpuknap.costs import TransformerConfig, transformer_model
from gpuknap.formats import hf, load_spec
from gpuknap.formats._fields import default_reserved

LLAMA7B = os.path.join(EXAMPLES, "llama2_7b_config.json")
#: Published shapes of two more families (Mistral-7B-v0.1, Qwen2-7B), GQA included.
FAMILIES = {
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
                "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                "num_hidden_layers": 32, "vocab_size": 32000, "sliding_window": 4096},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
              "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
              "num_hidden_layers": 28, "vocab_size": 152064, "tie_word_embeddings": False},
}


def test_llama_config_gives_the_analytic_model():
    """A dense config is the same model as the spec's transformer section with its fields (the same
    cost model), on the default device with the default reserved bytes."""
    spec = hf.load(LLAMA7B, capacity="80 GiB", micro_batches=16, stages=4, seq=4096, tensor_parallel=2,
                   data_parallel=4)
    want = transformer_model(TransformerConfig(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008,
                                               gated_ffn=True, vocab=32000, seq=4096, tensor_parallel=2,
                                               data_parallel=4, pipeline_parallel=4), 80 * 2**30, 16,
                             default_reserved(80 * 2**30))
    assert spec.model == want and spec.model.costs == want.costs and spec.stages == 4 and spec.name == "LlamaForCausalLM"
    assert spec.model.kinds[0] == "embedding" and spec.model.kinds[-1] == "output" and spec.model.layers == 34


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gqa_families_load_and_solve(family, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(FAMILIES[family]))
    spec = load_spec(path, capacity="80 GiB", micro_batches=32, stages=4, seq=4096, tensor_parallel=4)
    data = FAMILIES[family]
    layer = spec.model.fronts["dense"][0]
    want = transformer_model(TransformerConfig(
        layers=data["num_hidden_layers"], hidden=data["hidden_size"], heads=data["num_attention_heads"],
        kv_heads=data["num_key_value_heads"], ffn=data["intermediate_size"], gated_ffn=True,
        vocab=data["vocab_size"], seq=4096, tensor_parallel=4, pipeline_parallel=4), 80 * 2**30, 32).fronts["dense"][0]
    assert layer == want
    found = best_splits(spec.model, 4, backend="numpy")
    assert found and sum(found[0][0]) == data["num_hidden_layers"] + 2


def test_cli_runs_a_config_end_to_end():
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy"}
    p = subprocess.run([sys.executable, "-m", "gpuknap", "best", LLAMA7B, "--capacity", "80GiB", "--stages", "8",
                        "--micro-batches", "32", "--seq", "4096", "--tp", "8", "--json"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    spec = hf.load(LLAMA7B, capacity="80GiB", micro_batches=32, stages=8, seq=4096, tensor_parallel=8)
    want = best_splits(spec.model, 8, backend="numpy")
    assert out["results"][0]["counts"] == list(want[0][0])


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.pop("hidden_size"), "hidden_size: missing"),
    (lambda d: d.update(num_hidden_layers=0), "num_hidden_layers"),
    (lambda d: d.update(num_key_value_heads=5), "num_key_value_heads"),
    (lambda d: d.update(model_type="gpt2"), "model_type"),
    (lambda d: d.update(model_type="mixtral", architectures=["MixtralForCausalLM"]), "num_experts_per_tok: missing"),
    (lambda d: d.update(model_type="mixtral"), "contradicts model_type"),
    (lambda d: d.update(intermediate_size="big"), "intermediate_size"),
])
def test_bad_configs_name_the_field(tmp_path, edit, words):
    data = json.load(open(LLAMA7B))
    edit(data)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=words) as err:
        hf.load(path, capacity="80GiB", micro_batches=8, seq=2048)
    assert str(path) in str(err.value)


def test_training_sizes_are_checked():
    with pytest.raises(ValueError, match="tensor-parallel"):
        hf.load(LLAMA7B, capacity="80GiB", micro_batches=8, seq=2048, tensor_parallel=3)
    with pytest.raises(ValueError, match="--ep"):
        hf.load(LLAMA7B, capacity="80GiB", micro_batches=8, seq=2048, expert_parallel=2)
    with pytest.raises(ValueError, match="--seq"):
        hf.load(LLAMA7B, capacity="80GiB", micro_batches=8, seq=0)
    with pytest.raises(ValueError, match="applies to analytic models"):
        load_spec(os.path.join(EXAMPLES, "demo.json"), seq=4096)


DEEPSEEK = os.path.join(EXAMPLES, "deepseek_v3_config.json")
MIXTRAL = os.path.join(EXAMPLES, "mixtral_8x7b_config.json")


def test_deepseek_v3_layers_in_model_order():
    spec = hf.load(DEEPSEEK, capacity="80GiB", micro_batches=32, seq=4096, tensor_parallel=4, expert_parallel=64,
                   expert_tensor_parallel=1, data_parallel=16)
    kinds = spec.model.kinds
    assert kinds == ("embedding",) + ("dense",) * 3 + ("moe",) * 58 + ("output",)
    assert [o.name for o in spec.model.fronts["moe"]] == ["NONE", "SLCT", "MOEACT", "SLCT+MOEACT", "FULL"]


def test_moe_formulas_by_hand():
    """The MoE layer's memory and static bytes from the documented formulas (docs/costs.md),
    computed apart: GQA attention with flash attention, the router's input and logits, the routed experts' share
    of the tokens, expert weights over EP x ETP with their optimizer over the expert DP group."""
    s, b, h, t, ep, dp = 2048, 2, 4096, 4, 4, 4
    heads, kv, f, E, k = 32, 8, 14336, 8, 2
    data = {"model_type": "mixtral", "hidden_size": h, "intermediate_size": f, "num_attention_heads": heads,
            "num_key_value_heads": kv, "num_hidden_layers": 4, "num_local_experts": E, "num_experts_per_tok": k,
            "vocab_size": 1000}
    model = hf.model_of(data, "x", 80 * 2**30, 8, seq=s, micro_batch=b, tensor_parallel=t, expert_parallel=ep,
                        expert_tensor_parallel=1, data_parallel=dp)
    opts = {o.name: o for o in model.fronts["moe"]}
    d = h // heads
    n_sp = s * b / t
    attention = 2 * n_sp * h * 2 + 2 * s * b * (heads / t * d * 2 + 2 * (kv / t) * d) + 4 * s * b * heads / t
    routed = s * b * k / t  # the token-assignments whose expert work one rank does
    moe = 2 * n_sp * h * 2 + 4 * n_sp * E + 2 * routed * (1 * h + 3 * f)  # the norm's input and output (router's)
    assert opts["NONE"].memory(1) == pytest.approx(attention + moe, rel=1e-12)
    assert opts["MOEACT"].memory(3) == pytest.approx(3 * (attention + moe - 2 * routed * f), rel=1e-12)
    assert opts["FULL"].memory(2) == pytest.approx(2 * 2 * s * b * h / t, rel=1e-12)
    assert opts["FULL"].backward_time > opts["NONE"].backward_time + 0.99 * opts["NONE"].forward_time
    att_params = 2 * h * (heads / t) * d + 2 * h * (kv / t) * d + h  # Q, O, K, V per rank; the norm whole
    moe_params = h + h * E  # the norm and the router, whole
    experts = E * 3 * h * f / (ep * 1)
    static = (att_params + moe_params) * (6 + 12 / dp) + experts * (6 + 12 / (t * dp // ep))
    assert model.static["moe"] == pytest.approx(static, rel=1e-12)


def test_qwen_moe_sparse_step_and_mlp_only_layers():
    data = {"model_type": "qwen2_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 6, "vocab_size": 100,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [3]}
    model = hf.model_of(data, "x", 2**30, 4, seq=128)
    assert model.kinds[1:-1] == ("dense", "moe", "dense", "dense", "dense", "moe")


@pytest.mark.parametrize("edit, kwargs, words", [
    (lambda d: d.update(num_experts_per_tok=9), {}, "num_experts_per_tok"),
    (lambda d: None, {"expert_parallel": 3}, "num_local_experts"),
    (lambda d: d.pop("num_local_experts"), {}, "num_local_experts: missing"),
    (lambda d: d.update(num_key_value_heads=7), {}, "num_key_value_heads"),
])
def test_bad_moe_configs_name_the_field(tmp_path, edit, kwargs, words):
    data = json.load(open(MIXTRAL))
    edit(data)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=words):
        hf.load(path, capacity="80GiB", micro_batches=8, seq=2048, **kwargs)


@pytest.mark.parametrize("config, args", [
    (MIXTRAL, ["--tp", "4", "--ep", "8", "--etp", "1", "--dp", "2", "--stages", "4"]),
    (DEEPSEEK, ["--tp", "4", "--ep", "64", "--etp", "1", "--dp", "16", "--stages", "16", "--micro-batches", "64"]),
    (os.path.join(EXAMPLES, "deepseek_v2_lite_config.json"), ["--tp", "1", "--ep", "8", "--dp", "8", "--stages", "4"]),
])
def test_moe_examples_end_to_end(config, args):
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy"}
    argv = ["best", config, "--capacity", "80GiB", "--micro-batches", "32", "--seq", "4096", "--json", *args]
    p = subprocess.run([sys.executable, "-m", "gpuknap", *argv], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)["results"][0]
    names = {name for st in out["stages"] for name in st["options"]}
    if "deepseek" in config:  # both decoder kinds are in the plan
        assert any(n.startswith("dense/") for n in names) and any(n.startswith("moe/") for n in names)


def test_emitted_megatron_settings_of_an_ep_run_rank_back_with_dp(tmp_path):
    """Megatron takes DP from the world size, so the settings gpuknap writes do not carry it: read
    back without --dp, an EP run is refused naming --dp; with it, the same plan scores the same."""
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy"}
    lite = os.path.join(EXAMPLES, "deepseek_v2_lite_config.json")
    run = ["--capacity", "80GiB", "--seq", "4096", "--tp", "1", "--ep", "8"]

    def gpuknap(*argv):
        return subprocess.run([sys.executable, "-m", "gpuknap", *argv], capture_output=True, text=True, env=env,
                              cwd=tmp_path)
    made = gpuknap("best", lite, *run, "--dp", "8", "--stages", "4", "--micro-batches", "32", "--emit", "megatron")
    assert made.returncode == 0, made.stderr
    (tmp_path / "run.sh").write_text(made.stdout)
    refused = gpuknap("rank", lite, "--capacity", "80GiB", "--from", "run.sh")
    assert refused.returncode == 2 and "give the data-parallel size, --dp" in refused.stderr
    best = json.loads(gpuknap("best", lite, *run, "--dp", "8", "--stages", "4", "--micro-batches", "32",
                              "--json").stdout)["results"][0]
    back = gpuknap("rank", lite, "--capacity", "80GiB", "--from", "run.sh", "--dp", "8", "--json")
    assert back.returncode == 0, back.stderr
    back = json.loads(back.stdout)["best"]
    assert back["counts"] == best["counts"] and back["score"] == best["score"]
    assert back["iteration_time_s"] == best["iteration_time_s"]
