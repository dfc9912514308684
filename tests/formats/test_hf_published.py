"""Published Hugging Face configs a red team found refused or misread (2026-12-02), and the
explicit nulls transformers refuses: each test fails on the reader as it was.

Parameter counts are by hand from the published shapes (Qwen2.5-7B 7.62B, SmolLM2-135M 0.135B).
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from test_hf_defaults import total_params as params
from test_hf_defaults import without

from gpuknap.formats import hf

#: Qwen2.5-7B's published config.json (its sizing fields, and ``use_mrope: false`` as published).
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
             "intermediate_size": 18944, "max_window_layers": 28, "num_attention_heads": 28, "num_hidden_layers": 28,
             "num_key_value_heads": 4, "sliding_window": 131072, "use_sliding_window": False, "vocab_size": 152064,
             "tie_word_embeddings": False, "use_mrope": False}
#: SmolLM2-135M's published config.json (nanotron's export of a Llama).
SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "head_dim": 64,
           "hidden_size": 576, "intermediate_size": 1536, "is_llama_config": True, "mlp_bias": False,
           "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3, "rope_interleaved": False,
           "rope_scaling": None, "tie_word_embeddings": True, "vocab_size": 49152}
QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
             "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
             "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24, "vocab_size": 151936}
DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 256,
            "num_hidden_layers": 6, "num_attention_heads": 8, "n_routed_experts": 8, "num_experts_per_tok": 2,
            "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 128, "q_lora_rank": 256,
            "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "vocab_size": 1000}


def test_qwen25_with_use_mrope_false_is_read():
    h, f, a, g, d, layers, v = 3584, 18944, 28, 4, 128, 28, 152064
    layer = 2 * h * a * d + 2 * h * g * d + (a + 2 * g) * d + 3 * h * f + 2 * h  # Q, O; K, V; QKV biases; MLP; norms
    assert params(QWEN25_7B) == layers * layer + 2 * v * h + h == pytest.approx(7.62e9, rel=0.002)
    assert params(QWEN25_7B) == params(without(QWEN25_7B, "use_mrope"))
    with pytest.raises(ValueError, match="use_mrope: true is Qwen2-VL"):
        params(dict(QWEN25_7B, use_mrope=True))


def test_smollm2_inert_fields_are_accepted():
    h, f, a, g, d, layers, v = 576, 1536, 9, 3, 64, 30, 49152
    assert params(SMOLLM2) == layers * (2 * h * a * d + 2 * h * g * d + 3 * h * f + 2 * h) + v * h + h
    assert params(SMOLLM2) == pytest.approx(134.5e6, rel=0.002)
    assert params(SMOLLM2) == params(without(SMOLLM2, "is_llama_config", "rope_interleaved"))


@pytest.mark.parametrize("value", [["llama"], {"name": "llama"}, 3, True])
def test_model_type_must_be_a_string(value):
    with pytest.raises(ValueError, match="model_type: expected a string"):
        hf.architecture(dict(SMOLLM2, model_type=value), "x")


@pytest.mark.parametrize("data, key", [
    (QWEN2_MOE, "shared_expert_intermediate_size"), (QWEN2_MOE, "decoder_sparse_step"),
    (dict(QWEN25_7B, use_sliding_window=True), "max_window_layers"),
    (DEEPSEEK, "first_k_dense_replace"), (DEEPSEEK, "moe_layer_freq"),
    ({**QWEN25_7B, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 128}, "head_dim"),
    ({**QWEN2_MOE, "model_type": "qwen3_moe", "head_dim": 128}, "head_dim"),
])
def test_nulls_transformers_refuses_are_refused(data, key):
    """A null where the model's class gives it no meaning is refused, not read as the default."""
    data = without(data, "use_mrope") if data.get("model_type") != "qwen2" else data
    if data["model_type"] == "qwen3_moe":
        data = without(data, "shared_expert_intermediate_size")
    params(data)  # the field given, or absent: read
    with pytest.raises(ValueError, match=f"{key}: .*null"):
        params(dict(data, **{key: None}))


def test_deepseek_configs_saved_by_transformers_are_read():
    """transformers writes qk_head_dim (nope + rope) and output_router_logits when it saves a
    DeepSeek config, and keeps num_nextn_predict_layers: null (no MTP layers)."""
    for family in ("deepseek_v2", "deepseek_v3"):
        data = dict(DEEPSEEK, model_type=family)
        saved = dict(data, qk_head_dim=64 + 32, output_router_logits=False)
        assert params(saved) == params(data)
        with pytest.raises(ValueError, match="qk_head_dim: 128 is not qk_nope_head_dim"):
            params(dict(saved, qk_head_dim=128))
    mtp = dict(DEEPSEEK, num_nextn_predict_layers=1)
    assert params(dict(mtp, num_nextn_predict_layers=None)) == params(without(mtp, "num_nextn_predict_layers"))
    assert params(mtp) > params(without(mtp, "num_nextn_predict_layers"))


def test_nulls_with_a_meaning_are_read():
    assert params(dict(SMOLLM2, head_dim=None)) == params(without(SMOLLM2, "head_dim"))  # hidden / heads = 64
    assert params(dict(DEEPSEEK, n_shared_experts=None)) == params(dict(DEEPSEEK, n_shared_experts=0))
    with pytest.raises(ValueError, match="num_key_value_heads: null, which qwen2_moe"):
        params(dict(QWEN2_MOE, num_key_value_heads=None))


def test_refusals_say_what_to_do(tmp_path):
    kimi = dict(DEEPSEEK, model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"])
    with pytest.raises(ValueError, match="set model_type to 'deepseek_v3'"):
        params(kimi)
    with pytest.raises(ValueError) as long_key:
        params(dict(SMOLLM2, **{"x" * 100_000: 1}))
    assert len(str(long_key.value)) < 300 and "characters) for model_type" in str(long_key.value)
    bare = tmp_path / "config.json"
    bare.write_text('{"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152}')
    p = subprocess.run([sys.executable, "-m", "gpuknap", "best", str(bare), "--seq", "4096"], capture_output=True,
                       text=True)
    assert p.returncode == 2 and "not a Hugging Face config (no 'model_type'" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


#: Qwen3-Coder-480B-A35B-Instruct's published config.json, its sizing fields and the three that
#: only state what Qwen3-MoE builds (no QKV bias, no shared expert, a per-head QK norm).
QWEN3_CODER = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "decoder_sparse_step": 1,
               "head_dim": 128, "hidden_size": 6144, "intermediate_size": 8192, "max_window_layers": 62,
               "mlp_only_layers": [], "moe_intermediate_size": 2560, "norm_topk_prob": True,
               "num_attention_heads": 96, "num_experts": 160, "num_experts_per_tok": 8, "num_hidden_layers": 62,
               "num_key_value_heads": 8, "qkv_bias": False, "shared_expert_intermediate_size": 0,
               "sliding_window": None, "tie_word_embeddings": False, "use_qk_norm": True,
               "use_sliding_window": False, "vocab_size": 151936}


def test_fields_that_state_what_qwen3_moe_builds_are_read_and_contrary_ones_refused():
    h, a, g, d, e, f, layers, v = 6144, 96, 8, 128, 160, 2560, 62, 151936
    layer = 2 * h * a * d + 2 * h * g * d + 2 * d + e * 3 * h * f + h * e + 2 * h  # Q, O; K, V; QK norms; experts; router
    assert params(QWEN3_CODER) == layers * layer + 2 * v * h + h == pytest.approx(480.155e9, rel=1e-5)
    bare = without(QWEN3_CODER, "qkv_bias", "shared_expert_intermediate_size", "use_qk_norm")
    assert params(bare) == params(QWEN3_CODER)
    for key, value in (("qkv_bias", True), ("shared_expert_intermediate_size", 2560), ("use_qk_norm", False),
                       ("qkv_bias", 0), ("shared_expert_intermediate_size", False)):
        with pytest.raises(ValueError, match=f"{key}: .* always builds {key}="):
            params(dict(QWEN3_CODER, **{key: value}))


def test_every_unknown_field_is_named_at_once():
    """A config with several fields a family lacks names them all in one line (fixed in one
    edit, not one run per field); another family's field says so rather than guessing a typo."""
    data = dict(QWEN25_7B, mystery=1, qkv_bias=False, num_experts=8)
    with pytest.raises(ValueError) as info:
        params(data)
    message = str(info.value)
    assert "unknown fields 'mystery', 'qkv_bias' (a field of qwen2_moe configs), 'num_experts' (a field of" in message
    assert "\n" not in message
