"""Hugging Face configs with fields left out: they mean what transformers makes of them.

Each default below is typed from transformers' configuration classes (the file and field are
cited in docs/analytic.md), not from gpuknap; totals are checked against the published sizes
of the models, counted here by hand from their published shapes.
"""
from __future__ import annotations

import json
import os

import pytest
from paths import EXAMPLES

from gpuknap.formats import hf

DEEPSEEK = os.path.join(EXAMPLES, "deepseek_v3_config.json")
#: Qwen3-8B's published config.json (the fields that size it).
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
            "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "num_hidden_layers": 36, "vocab_size": 151936, "tie_word_embeddings": False, "attention_bias": False,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": 36, "rms_norm_eps": 1e-6}
#: Qwen1.5-MoE-A2.7B's published config.json.
QWEN15_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
              "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
              "num_experts": 60, "num_experts_per_tok": 4, "num_attention_heads": 16, "num_key_value_heads": 16,
              "num_hidden_layers": 24, "vocab_size": 151936, "decoder_sparse_step": 1}
#: Mistral-7B-v0.1's and Mixtral-8x22B's published shapes.
MISTRAL = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 6144, "intermediate_size": 16384, "num_attention_heads": 48,
           "num_key_value_heads": 8, "num_hidden_layers": 56, "vocab_size": 32768, "num_local_experts": 8,
           "num_experts_per_tok": 2}


def total_params(data: dict) -> float:
    """Every parameter of the model on one rank (TP = EP = 1, one stage), from its cost model."""
    model = hf.model_of(data, "x", 2**50, 1, seq=4096)
    return sum(model.costs.params[k] + model.costs.expert_params.get(k, 0.0) for k in model.kinds)


def without(data: dict, *keys: str) -> dict:
    return {k: v for k, v in data.items() if k not in keys}


def test_qwen3_dense_is_read_at_its_published_size():
    """Qwen3-8B: 8.2B parameters, 6.95B of them outside the embeddings (Qwen3 technical report)."""
    h, f, a, g, d, layers, v = 4096, 12288, 32, 8, 128, 36, 151936
    layer = h * a * d * 2 + 2 * h * g * d + 3 * h * f + 2 * h + 2 * d  # Q, O; K, V; gated MLP; two RMSNorms;
    by_hand = layers * layer + 2 * v * h + h  # and the per-head query and key norms
    assert total_params(QWEN3_8B) == by_hand
    assert total_params(QWEN3_8B) == pytest.approx(8.19e9, rel=0.01)
    assert layers * layer == pytest.approx(6.95e9, rel=0.01)


@pytest.mark.parametrize("data, key, value", [
    (MISTRAL, "num_key_value_heads", 8),  # MistralConfig
    (MIXTRAL, "num_key_value_heads", 8),  # MixtralConfig
    (QWEN15_MOE, "num_key_value_heads", 16),  # Qwen2MoeConfig
    (QWEN15_MOE, "shared_expert_intermediate_size", 5632),  # Qwen2MoeConfig
    (QWEN3_8B, "head_dim", 128),  # Qwen3Config
    (dict(QWEN3_8B, num_attention_heads=32, num_key_value_heads=32), "num_key_value_heads", 32),  # Qwen3Config
])
def test_absent_fields_take_transformers_defaults(data, key, value):
    """A field left out is the same model as the field given with transformers' default, and not
    the same as another value (the test can fail)."""
    assert total_params(without(data, key)) == total_params(dict(data, **{key: value}))
    other = value // 2
    assert total_params(without(data, key)) != total_params(dict(data, **{key: other}))


@pytest.mark.parametrize("key", ["first_k_dense_replace", "n_shared_experts", "q_lora_rank", "moe_layer_freq"])
def test_deepseek_v3_without_its_optional_fields_is_still_671b(key):
    """DeepseekV3Config's defaults (first_k_dense_replace 3, n_shared_experts 1, q_lora_rank 1536)
    are DeepSeek-V3's own shape: 671B parameters with the MTP module's 14B left out (the
    DeepSeek-V3 technical report: 685B on the Hub, 671B main model)."""
    data = without(dict(json.load(open(DEEPSEEK)), num_nextn_predict_layers=0), key)
    assert total_params(data) == pytest.approx(671e9, rel=0.002)


def test_null_q_lora_rank_projects_queries_directly():
    """``q_lora_rank: null`` (DeepSeek-V2-Lite) is a direct query projection: h x heads x (nope + rope)
    instead of h x r + r + r x heads x (nope + rope) per layer."""
    data = dict(json.load(open(DEEPSEEK)), num_nextn_predict_layers=0)
    h, r, a, qk = 7168, 1536, 128, 128 + 64
    change = h * a * qk - (h * r + r + r * a * qk)
    assert total_params(dict(data, q_lora_rank=None)) - total_params(data) == pytest.approx(61 * change, rel=1e-9)


def test_moe_layer_freq_counts_from_layer_zero():
    """DeepSeek's modeling_deepseek.py: layer i is MoE when i >= first_k_dense_replace and
    i % moe_layer_freq == 0 (not counted from the first MoE layer)."""
    data = dict(json.load(open(DEEPSEEK)), num_hidden_layers=12, first_k_dense_replace=3, moe_layer_freq=2)
    model = hf.model_of(data, "x", 2**50, 1, seq=4096)
    assert model.kinds[1:-1] == tuple("moe" if i in (4, 6, 8, 10) else "dense" for i in range(12))
    with pytest.raises(ValueError, match="no layer is a MoE layer"):
        hf.model_of(dict(data, num_hidden_layers=5, first_k_dense_replace=3, moe_layer_freq=5), "x", 2**50, 1, seq=4096)


def test_null_kv_heads():
    """Mistral's class turns a null into the attention heads; Qwen2-MoE's does not (refused)."""
    assert total_params(dict(MISTRAL, num_key_value_heads=None)) == total_params(dict(MISTRAL, num_key_value_heads=32))
    with pytest.raises(ValueError, match="num_key_value_heads"):
        total_params(dict(QWEN15_MOE, num_key_value_heads=None))
    with pytest.raises(ValueError, match="absent: transformers' default"):
        total_params(without(dict(QWEN3_8B, num_attention_heads=28), "num_key_value_heads"))


#: Qwen2.5-0.5B's published config.json: tied embeddings.
QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
              "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2,
              "num_hidden_layers": 24, "vocab_size": 151936, "tie_word_embeddings": True}


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_tied_embeddings_count_once_on_one_stage(stages):
    """Qwen2.5-0.5B is 0.49B parameters (0.36B outside the embedding): on one stage its weights,
    gradients and Adam state (18 bytes a parameter) count the shared matrix once; with P > 1 the
    first and last stages each hold a copy, as Megatron does."""
    h, f, a, g, layers, v = 896, 4864, 14, 2, 24, 151936
    d = h // a
    body = layers * (2 * h * a * d + 2 * h * g * d + (a + 2 * g) * d + 3 * h * f + 2 * h)  # Q, O; K, V; Q/K/V
    assert body == pytest.approx(0.36e9, rel=0.01) and body + v * h == pytest.approx(0.49e9, rel=0.01)
    model = hf.model_of(QWEN25_05B, "x", 2**50, 8, seq=4096, pipeline_parallel=stages)
    static = sum(model.static[k] for k in model.kinds)
    copies = 1 if stages == 1 else 2
    assert static == pytest.approx(18 * (body + copies * v * h + h), rel=1e-9)
    untied = hf.model_of(dict(QWEN25_05B, tie_word_embeddings=False), "x", 2**50, 8, seq=4096,
                         pipeline_parallel=stages)
    assert sum(untied.static[k] for k in untied.kinds) == pytest.approx(18 * (body + 2 * v * h + h), rel=1e-9)


def test_tie_word_embeddings_must_be_a_boolean():
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        hf.model_of(dict(QWEN25_05B, tie_word_embeddings="yes"), "x", 2**50, 8, seq=4096)


DEEPSEEK_V2_LITE = os.path.join(EXAMPLES, "deepseek_v2_lite_config.json")
#: DeepSeek-V2's published shape (its config.json on the Hub), beside the shipped V2-Lite.
DEEPSEEK_V2 = dict(json.load(open(DEEPSEEK_V2_LITE)), hidden_size=5120, intermediate_size=12288,
                   moe_intermediate_size=1536, num_hidden_layers=60, num_attention_heads=128, num_key_value_heads=128,
                   n_routed_experts=160, q_lora_rank=1536, n_group=8, topk_group=3, topk_method="group_limited_greedy")


def test_deepseek_v2_is_read_at_its_published_sizes():
    """DeepSeek-V2 236B parameters (21B activated per token), DeepSeek-V2-Lite 15.7B (the
    DeepSeek-V2 paper, arXiv:2405.04434, and the models' cards); counted here by hand: MLA
    (with and without the query latent), one dense layer, the rest 2 shared and E routed experts."""
    def by_hand(h, f, fe, layers, a, e, q_lora, v=102400, kv_lora=512, nope=128, rope=64, vd=128):
        q = h * q_lora + q_lora + q_lora * a * (nope + rope) if q_lora else h * a * (nope + rope)
        att = q + h * (kv_lora + rope) + kv_lora + kv_lora * a * (nope + vd) + a * vd * h + h  # and its norm
        moe = h * e + (2 + e) * 3 * h * fe + h  # router, shared and routed experts, norm
        return layers * att + (3 * h * f + h) + (layers - 1) * moe + 2 * v * h + h
    lite = json.load(open(DEEPSEEK_V2_LITE))
    assert total_params(lite) == by_hand(2048, 10944, 1408, 27, 16, 64, 0)
    assert total_params(DEEPSEEK_V2) == by_hand(5120, 12288, 1536, 60, 128, 160, 1536)
    assert total_params(lite) == pytest.approx(15.7e9, rel=0.005)
    assert total_params(DEEPSEEK_V2) == pytest.approx(236e9, rel=0.005)
    idle = 59 * (160 - 6) * 3 * 5120 * 1536  # routed experts a token does not use
    assert total_params(DEEPSEEK_V2) - idle == pytest.approx(21e9, rel=0.03)


def test_deepseek_v2_defaults_and_refusals():
    """DeepseekV2Config's first_k_dense_replace is 0 (every layer MoE); its n_shared_experts is 2
    in transformers and none in DeepSeek's own class, so an absent one is refused; null is none
    (both families); mlp_bias true and V3's MTP field are refused."""
    lite = json.load(open(DEEPSEEK_V2_LITE))
    model = hf.model_of(without(lite, "first_k_dense_replace"), "x", 2**50, 1, seq=4096)
    assert set(model.kinds[1:-1]) == {"moe"}
    assert model.kinds == hf.model_of(dict(lite, first_k_dense_replace=0), "x", 2**50, 1, seq=4096).kinds
    with pytest.raises(ValueError, match="n_shared_experts: missing.*transformers.*2.*none"):
        total_params(without(lite, "n_shared_experts"))
    h, fe = 2048, 1408
    assert total_params(lite) - total_params(dict(lite, n_shared_experts=None)) == 26 * 2 * 3 * h * fe
    assert total_params(dict(lite, n_shared_experts=None)) == total_params(dict(lite, n_shared_experts=0))
    v3 = dict(json.load(open(DEEPSEEK)), num_nextn_predict_layers=0)
    assert total_params(v3) - total_params(dict(v3, n_shared_experts=None)) == 58 * 3 * 7168 * 2048
    assert total_params(without(v3, "n_shared_experts")) == total_params(v3)  # V3's class: 1
    with pytest.raises(ValueError, match="mlp_bias"):
        total_params(dict(lite, mlp_bias=True))
    assert total_params(dict(lite, mlp_bias=False)) == total_params(lite)
    with pytest.raises(ValueError, match="num_nextn_predict_layers.*deepseek_v3"):
        total_params(dict(lite, num_nextn_predict_layers=1))
