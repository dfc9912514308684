"""Projection biases and Qwen3's query/key norms, as transformers' modeling code builds each
family (``modeling_<family>.py``): Qwen2 always has Q/K/V biases, Qwen2-MoE unless ``qkv_bias``
is false, Llama/Qwen3/DeepSeek-V3 with ``attention_bias``, Llama's MLP with ``mlp_bias``, Qwen3 a
per-head RMSNorm on queries and keys.  Totals are counted here by hand from the shapes and checked
against published sizes; differences between a config and the same config with a switch turned
are counted by hand too."""
from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
from paths import EXAMPLES

from gpuknap.costs import ACT, Architecture, Training, device, layer_cost
from gpuknap.formats import hf

#: Qwen2-7B's (and Qwen2.5-7B's) published shape.
QWEN2_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
            "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
            "num_hidden_layers": 28, "vocab_size": 152064, "tie_word_embeddings": False}
LLAMA = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 32,
         "num_key_value_heads": 4, "num_hidden_layers": 22, "vocab_size": 32000}
QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
             "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
             "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24, "vocab_size": 151936}


def total_params(data: dict) -> float:
    """Every parameter on one rank (TP = EP = 1, one stage), from the cost model."""
    model = hf.model_of(data, "x", 2**50, 1, seq=4096)
    return sum(model.costs.params[k] + model.costs.expert_params.get(k, 0.0) for k in model.kinds)


def test_qwen2_7b_is_read_at_its_exact_size():
    h, f, a, g, d, layers, v = 3584, 18944, 28, 4, 128, 28, 152064
    layer = (h * a * d + a * d) + 2 * (h * g * d + g * d) + a * d * h + 3 * h * f + 2 * h  # Q, K, V with biases
    by_hand = layers * layer + 2 * v * h + h
    assert total_params(QWEN2_7B) == by_hand
    # Qwen2.5-7B's model card: 7.61B parameters, 6.53B of them outside the embeddings
    assert by_hand == pytest.approx(7.61e9, rel=1e-3) and layers * layer == pytest.approx(6.53e9, rel=1e-3)


def test_llama_attention_and_mlp_biases():
    h, f, a, g, d, layers = 2048, 5632, 32, 4, 64, 22
    base = total_params(LLAMA)
    assert total_params({**LLAMA, "attention_bias": False, "mlp_bias": False}) == base
    assert total_params({**LLAMA, "attention_bias": True}) - base == layers * ((a + 2 * g) * d + h)
    assert total_params({**LLAMA, "mlp_bias": True}) - base == layers * (2 * f + h)


def test_qwen2_moe_qkv_bias_defaults_on():
    a, d, layers = 16, 128, 24
    assert total_params(QWEN2_MOE) - total_params({**QWEN2_MOE, "qkv_bias": False}) == layers * 3 * a * d
    assert total_params({**QWEN2_MOE, "qkv_bias": True}) == total_params(QWEN2_MOE)


def test_deepseek_attention_bias_on_the_down_projections_and_output():
    with open(os.path.join(EXAMPLES, "deepseek_v3_small_config.json")) as fh:
        data = json.load(fh)
    m = hf.architecture(data, "x")
    per_layer = m.latent.q_lora + m.latent.kv_lora + m.latent.rope + m.hidden
    diff = total_params({**data, "attention_bias": True}) - total_params({**data, "attention_bias": False})
    assert diff == (m.layers + m.mtp) * per_layer  # the MTP block's layer has them too


def test_mistral_and_mixtral_have_no_biases_whatever_the_config_says():
    mistral = {"model_type": "mistral", "hidden_size": 1024, "intermediate_size": 3584, "num_attention_heads": 16,
               "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 32000}
    assert total_params({**mistral, "attention_bias": True}) == total_params(mistral)


@pytest.mark.parametrize("tp, sp", [(1, True), (4, True), (4, False)])
def test_qk_norm_weights_and_kept_inputs(tp, sp):
    arch = hf.architecture({"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
                            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                            "num_hidden_layers": 36, "vocab_size": 151936}, "x")
    assert arch.qk_norm and not arch.qkv_bias
    tr = Training(seq=4096, micro_batch=2, tensor_parallel=tp, sequence_parallel=sp)
    with_norm = layer_cost(arch, tr, device("h100"), False)
    plain = layer_cost(replace(arch, qk_norm=False), tr, device("h100"), False)
    n, d = 4096 * 2, 128
    assert with_norm.params - plain.params == 2 * d
    assert with_norm.activations - plain.activations == pytest.approx(ACT * n * (32 + 8) / tp * d, rel=1e-12)
    assert with_norm.matmul == plain.matmul and with_norm.model_flops == plain.model_flops


def test_bias_switches_must_be_booleans():
    with pytest.raises(ValueError, match="attention_bias: expected true or false"):
        hf.architecture({**LLAMA, "attention_bias": "yes"}, "x")
    with pytest.raises(ValueError, match="qkv_bias: expected true or false"):
        hf.architecture({**QWEN2_MOE, "qkv_bias": 1}, "x")
    assert Architecture(layers=1, hidden=64, heads=4, ffn=128).qkv_bias is False


def test_qwen2_moe_counts_its_shared_experts_gate():
    """Qwen2-MoE builds ``shared_expert_gate`` (h -> 1, no bias) in every MoE layer, even with no
    shared experts; Qwen3-MoE has none.  Qwen1.5-MoE-A2.7B's total is 14.3B (its model card)."""
    h, layers = 2048, 24
    arch = hf.architecture(QWEN2_MOE, "x")
    assert arch.experts.shared_gate and not hf.architecture(
        {k: v for k, v in QWEN2_MOE.items() if k != "shared_expert_intermediate_size"} | {"model_type": "qwen3_moe"},
        "x").experts.shared_gate
    plain = replace(arch, experts=replace(arch.experts, shared_gate=False))
    tr = Training(seq=4096)
    diff = layer_cost(arch, tr, device("h100"), True).params - layer_cost(plain, tr, device("h100"), True).params
    assert diff == h
    # by hand: attention with Q/K/V biases, router, 60 experts and the shared expert (gated MLPs), the gate, norms
    a, d, e, fe, fs, v = 16, 128, 60, 1408, 5632, 151936
    layer = 4 * h * a * d + 3 * a * d + h * e + e * 3 * h * fe + 3 * h * fs + h + 2 * h
    assert total_params(QWEN2_MOE) == layers * layer + 2 * v * h + h
    assert total_params(QWEN2_MOE) == pytest.approx(14.3e9, rel=0.01)
