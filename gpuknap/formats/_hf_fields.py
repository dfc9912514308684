"""The fields of Hugging Face ``config.json`` files, per family, and the values a missing field
takes: transformers' own defaults (its ``configuration_<family>.py``), so that a config means
here what it means when transformers loads it (docs/analytic.md lists each default and its source).
"""
from __future__ import annotations

from typing import Any, Mapping

from ..engine import short
from ._documents import suggest

#: ``model_type`` values read as dense decoders with a gated (SwiGLU) MLP.
DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3")
#: ``model_type`` values read as mixture-of-experts models (:mod:`gpuknap.costs`).
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
#: ``model_type`` values with DeepSeek's multi-head latent attention and its MoE layout.
MLA_TYPES = ("deepseek_v2", "deepseek_v3")
#: Fields every config may carry whatever its family (transformers' PretrainedConfig and what the
#: Hub's files add): read or known not to change memory or time at this level.  Fields whose name
#: starts with an underscore (``_name_or_path``, ``_comment``) are always accepted.
COMMON = frozenset("""architectures model_type torch_dtype dtype transformers_version bos_token_id eos_token_id
pad_token_id sep_token_id decoder_start_token_id tie_word_embeddings use_cache return_dict output_hidden_states
output_attentions torchscript use_bfloat16 pruned_heads chunk_size_feed_forward is_encoder_decoder is_decoder
add_cross_attention cross_attention_hidden_size tie_encoder_decoder finetuning_task id2label label2id num_labels
tokenizer_class prefix task_specific_params problem_type auto_map quantization_config max_length min_length
do_sample early_stopping num_beams num_beam_groups diversity_penalty temperature top_k top_p typical_p
repetition_penalty length_penalty no_repeat_ngram_size encoder_no_repeat_ngram_size bad_words_ids
num_return_sequences output_scores return_dict_in_generate forced_bos_token_id forced_eos_token_id
remove_invalid_values exponential_decay_length_penalty suppress_tokens begin_suppress_tokens
hidden_act max_position_embeddings initializer_range rms_norm_eps rope_theta rope_scaling rope_parameters
attention_dropout attention_bias pretraining_tp""".split())
#: Per family: its architecture class and the fields its configs carry beyond :data:`COMMON`
#: (from transformers' configuration classes and the published files).
FAMILIES = {
    "llama": ("LlamaForCausalLM", """vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads
              num_key_value_heads head_dim mlp_bias is_llama_config rope_interleaved"""),
    "mistral": ("MistralForCausalLM", """vocab_size hidden_size intermediate_size num_hidden_layers
                num_attention_heads num_key_value_heads head_dim sliding_window"""),
    "qwen2": ("Qwen2ForCausalLM", """vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads
              num_key_value_heads use_sliding_window sliding_window max_window_layers layer_types use_mrope
              dual_chunk_attention_config"""),
    "qwen3": ("Qwen3ForCausalLM", """vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads
              num_key_value_heads head_dim use_sliding_window sliding_window max_window_layers layer_types
              dual_chunk_attention_config"""),
    "mixtral": ("MixtralForCausalLM", """vocab_size hidden_size intermediate_size num_hidden_layers
                num_attention_heads num_key_value_heads head_dim sliding_window num_experts_per_tok
                num_local_experts output_router_logits router_aux_loss_coef router_jitter_noise"""),
    "qwen2_moe": ("Qwen2MoeForCausalLM", """vocab_size hidden_size intermediate_size num_hidden_layers
                  num_attention_heads num_key_value_heads use_sliding_window sliding_window max_window_layers
                  decoder_sparse_step moe_intermediate_size shared_expert_intermediate_size num_experts_per_tok
                  num_experts norm_topk_prob output_router_logits router_aux_loss_coef mlp_only_layers qkv_bias
                  layer_types dual_chunk_attention_config"""),
    "qwen3_moe": ("Qwen3MoeForCausalLM", """vocab_size hidden_size intermediate_size num_hidden_layers
                  num_attention_heads num_key_value_heads head_dim use_sliding_window sliding_window
                  max_window_layers decoder_sparse_step moe_intermediate_size num_experts_per_tok num_experts
                  norm_topk_prob output_router_logits router_aux_loss_coef mlp_only_layers layer_types
                  dual_chunk_attention_config"""),
    "deepseek_v2": ("DeepseekV2ForCausalLM", """vocab_size hidden_size intermediate_size moe_intermediate_size
                    num_hidden_layers num_attention_heads num_key_value_heads n_shared_experts n_routed_experts
                    routed_scaling_factor kv_lora_rank q_lora_rank qk_rope_head_dim v_head_dim qk_nope_head_dim
                    n_group topk_group num_experts_per_tok first_k_dense_replace norm_topk_prob moe_layer_freq
                    scoring_func seq_aux topk_method aux_loss_alpha ep_size head_dim mlp_bias qk_head_dim
                    output_router_logits"""),
    "deepseek_v3": ("DeepseekV3ForCausalLM", """vocab_size hidden_size intermediate_size moe_intermediate_size
                    num_hidden_layers num_attention_heads num_key_value_heads n_shared_experts n_routed_experts
                    routed_scaling_factor kv_lora_rank q_lora_rank qk_rope_head_dim v_head_dim qk_nope_head_dim
                    n_group topk_group num_experts_per_tok first_k_dense_replace norm_topk_prob rope_interleave
                    moe_layer_freq num_nextn_predict_layers scoring_func seq_aux topk_method aux_loss_alpha
                    ep_size head_dim qk_head_dim output_router_logits"""),
}
#: Per MoE family: the config's fields of the expert count, the expert width and the shared width.
EXPERT_FIELDS = {"mixtral": ("num_local_experts", "intermediate_size", ""),
                 "qwen2_moe": ("num_experts", "moe_intermediate_size", "shared_expert_intermediate_size"),
                 "qwen3_moe": ("num_experts", "moe_intermediate_size", ""),
                 "deepseek_v2": ("n_routed_experts", "moe_intermediate_size", "n_shared_experts"),
                 "deepseek_v3": ("n_routed_experts", "moe_intermediate_size", "n_shared_experts")}
#: Per family, ``num_key_value_heads`` when the field is absent: transformers' default in
#: ``configuration_<family>.py`` (None: the attention heads).
KV_HEADS = {"llama": None, "mistral": 8, "mixtral": 8, "qwen2": 32, "qwen3": 32, "qwen2_moe": 16, "qwen3_moe": 4}
#: Families whose configuration class turns an explicit ``num_key_value_heads: null`` into the
#: attention heads (the two Qwen MoE classes do not: a null there is refused).
NULL_KV_IS_HEADS = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen3"})
#: Per family, ``head_dim`` when absent (None: hidden_size / num_attention_heads, as the modeling
#: code falls back to); Qwen3's configuration class defaults it to 128.
HEAD_DIM = {"qwen3": 128}
#: Optional integer fields and their values when absent (transformers' defaults; ``moe_layer_freq``
#: is DeepSeek's own configuration_deepseek.py's, which transformers' built-in class lacks).
#: DeepSeek-V2's ``n_shared_experts`` is not here: transformers' class defaults it to 2 and
#: DeepSeek's own to none, so an absent one is refused rather than guessed.
OPTIONAL = {
    "deepseek_v2": {"first_k_dense_replace": 0, "q_lora_rank": 1536, "moe_layer_freq": 1},
    "deepseek_v3": {"first_k_dense_replace": 3, "n_shared_experts": 1, "q_lora_rank": 1536, "moe_layer_freq": 1},
    "qwen2_moe": {"shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1},
    "qwen3_moe": {"decoder_sparse_step": 1},
}

#: Per family, fields some published configs carry that only state what the family builds anyway
#: (Qwen3-Coder-480B's config.json: no QKV bias, no shared expert, a per-head QK norm); read when
#: they say exactly that, refused when they ask for something the family's modeling code lacks.
STATED = {"qwen3_moe": {"qkv_bias": False, "shared_expert_intermediate_size": 0, "use_qk_norm": True}}


def _stated(data: Mapping, kind: str, key: str, where: str) -> bool:
    """Whether ``key`` is one of :data:`STATED`'s for the family (refused if it says otherwise)."""
    built = STATED.get(kind, {})
    if key not in built:
        return False
    value, want = data[key], built[key]
    if type(value) is not type(want) or value != want:
        raise ValueError(f"{where}: {key}: {short(value)}, but model_type {kind!r} always builds {key}="
                         f"{want!r} (transformers' modeling code has no switch for it); gpuknap reads it only as "
                         f"{want!r}")
    return True


def check_fields(data: Mapping, where: str) -> str:
    """The config's family, after checking that every field is one the family carries (a typo is
    refused with the nearest name) and that ``model_type`` and ``architectures`` agree."""
    kind: Any = data.get("model_type")
    if kind is not None and not isinstance(kind, str):
        raise ValueError(f"{where}: model_type: expected a string such as 'llama', got {type(kind).__name__}")
    arch = data.get("architectures")
    if arch is not None and (not isinstance(arch, list) or not all(isinstance(a, str) for a in arch)):
        raise ValueError(f"{where}: architectures: expected a list of class names, got {arch!r}"[:300])
    by_class = {cls: family for family, (cls, _) in FAMILIES.items()}
    if kind is None and arch:
        kind = by_class.get(arch[0])
    if kind not in FAMILIES:
        same = by_class.get(arch[0]) if arch else None  # e.g. Kimi-K2: kimi_k2, DeepseekV3ForCausalLM
        hint = (f"; its architectures says {arch[0]}: if the model is that class, set model_type to {same!r}"
                if same else "")
        raise ValueError(f"{where}: model_type: {short(kind)} is not a family gpuknap reads "
                         f"(dense: {', '.join(DENSE_TYPES)}; MoE: {', '.join(MOE_TYPES)}){hint}")
    if arch and arch[0] != FAMILIES[kind][0]:
        raise ValueError(f"{where}: architectures: {arch[0]!r} contradicts model_type {kind!r} "
                         f"(which is {FAMILIES[kind][0]!r})")
    known = COMMON | set(FAMILIES[kind][1].split())
    unknown = []
    for key in data:
        if not isinstance(key, str):
            raise ValueError(f"{where}: field names must be strings, got {key!r}")
        if key.startswith("_") or key in known or _stated(data, kind, key, where):
            continue
        other = [f for f, (_, fields) in FAMILIES.items() if key in fields.split()]
        hint = (f" (a field of {', '.join(other)} configs)" if other else
                suggest(key, known) if len(key) <= 100 else "")
        unknown.append(f"{short(key)}{hint}")
    if unknown:  # every one at once: a config is not fixed one run per field
        fields = f"field {unknown[0]}" if len(unknown) == 1 else f"fields {', '.join(unknown[:8])}"
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        raise ValueError(f"{where}: unknown {fields}{more} for model_type {kind!r}")
    chunked = data.get("dual_chunk_attention_config")
    if chunked is not None and not isinstance(chunked, Mapping):
        raise ValueError(f"{where}: dual_chunk_attention_config: expected a mapping such as "
                         f"{{'chunk_size': 262144, 'local_size': 8192}}, got {short(chunked)}")
    return kind


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def config_notes(data: Mapping, seq: int) -> tuple[str, ...]:
    """What a config says that the plan does not follow, for the user to read (not errors):
    a ``seq`` past the positions its RoPE reaches, weights published quantized, dual-chunk attention
    (an inference engine's), attention dropout."""
    notes = []
    positions = _number(data.get("max_position_embeddings"))
    if positions:
        scaling = data.get("rope_scaling") if isinstance(data.get("rope_scaling"), Mapping) else {}
        factor = _number(scaling.get("factor"))
        if factor and factor > 1:  # YaRN and its kin stretch the original window by the factor
            positions = max(positions, factor * (_number(scaling.get("original_max_position_embeddings"))
                                                 or positions))
        if seq > positions:
            notes.append(f"--seq {seq:,} is past the {positions:,.0f} positions the config's RoPE reaches "
                         "(max_position_embeddings, rope_scaling): planned as asked, though the model was not "
                         "trained that long")
    quant = data.get("quantization_config")
    if isinstance(quant, Mapping):
        method = quant.get("quant_method")
        plain = isinstance(method, str) and len(method) <= 20 and method.replace("_", "").replace("-", "").isalnum()
        what = f"{method}-quantized" if plain else "quantized"
        notes.append(f"quantization_config: the weights are published {what}; gpuknap plans bf16 training "
                     "(bf16 weights, fp32 gradients, master weights and Adam moments), not FP8 or 4-bit training")
    if isinstance(data.get("dual_chunk_attention_config"), Mapping):
        notes.append("dual_chunk_attention_config: inference engines (vLLM, SGLang) run dual-chunk attention on "
                     "long inputs; transformers' modeling code does not read the field, so training runs the full "
                     "causal attention planned here")
    dropout = _number(data.get("attention_dropout"))
    if dropout:
        notes.append(f"attention_dropout {dropout:g}: with flash attention (as planned) its mask is drawn again in "
                     "the backward, not kept, so memory is unchanged; its time is not counted")
    return tuple(notes)
