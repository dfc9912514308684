"""Sliding-window attention: a query attends to at most ``sliding_window`` keys, so beyond the window
the attention's score and context products (and the model FLOPs) grow with the window, not the
sequence.  Checked against the products counted by hand; when only some layers slide (Qwen's
``max_window_layers``, ``layer_types``) the config is refused where the window matters."""
from __future__ import annotations

import pytest

from gpuknap.formats import hf

#: Mistral-7B-v0.1's published shape (its config's window is 4096, transformers' default too).
MISTRAL = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000}
QWEN2 = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
         "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064}


def layer_flops(data: dict, seq: int) -> float:
    return hf.model_of(data, "x", 2**50, 1, seq=seq).costs.flops["dense"]


def core_flops(seq: int, keys: int, heads: int, head_dim: int) -> float:
    """Q K^T and scores x V of one layer, forward and backward (x 3), micro-batch 1, by hand."""
    return 3 * 2 * seq * keys * heads * (head_dim + head_dim)


@pytest.mark.parametrize("seq", [2048, 4096, 32768])
def test_a_window_bounds_the_keys_each_query_attends_to(seq):
    full = layer_flops({**MISTRAL, "sliding_window": None}, seq)
    windowed = layer_flops(MISTRAL, seq)  # absent: transformers' 4096
    assert windowed == layer_flops({**MISTRAL, "sliding_window": 4096}, seq)
    want = core_flops(seq, seq, 32, 128) - core_flops(seq, min(seq, 4096), 32, 128)
    assert full - windowed == pytest.approx(want, rel=1e-12)
    assert (full > windowed) == (seq > 4096)


def test_qwen_windows_only_with_use_sliding_window_and_on_every_layer():
    seq = 32768
    base = layer_flops(QWEN2, seq)
    assert layer_flops({**QWEN2, "sliding_window": 4096}, seq) == base  # not used without the switch
    every = {**QWEN2, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 0}
    assert base - layer_flops(every, seq) == pytest.approx(
        core_flops(seq, seq, 28, 128) - core_flops(seq, 4096, 28, 128), rel=1e-12)
    typed = {**QWEN2, "use_sliding_window": True, "sliding_window": 4096,
             "layer_types": ["sliding_attention"] * 28}
    assert layer_flops(typed, seq) == layer_flops(every, seq)


@pytest.mark.parametrize("some", [{"max_window_layers": 14},
                                  {"layer_types": ["full_attention"] * 14 + ["sliding_attention"] * 14}])
def test_windows_on_some_layers_are_refused_where_they_matter(some):
    data = {**QWEN2, "use_sliding_window": True, "sliding_window": 4096, **some}
    with pytest.raises(ValueError, match="sliding_window: only some layers"):
        layer_flops(data, 8192)
    assert layer_flops(data, 4096) == layer_flops(QWEN2, 4096)  # within the window: the same model


@pytest.mark.parametrize("bad, field", [({"sliding_window": 0}, "sliding_window"),
                                        ({"use_sliding_window": "yes"}, "use_sliding_window"),
                                        ({"use_sliding_window": True, "layer_types": ["full"] * 28}, "layer_types")])
def test_bad_window_fields_are_refused_by_name(bad, field):
    with pytest.raises(ValueError, match=field):
        layer_flops({**QWEN2, "use_sliding_window": True, **bad}, 4096)


@pytest.mark.parametrize("kind", ["qwen2_moe", "qwen3_moe"])
def test_qwen_moe_windows_are_refused_where_transformers_versions_disagree(kind):
    """transformers 4.51 slides these families' layers from max_window_layers on, 5.x every layer
    (Qwen3-MoE) or alternate layers below it (Qwen2-MoE): refused where the window matters."""
    data = {"model_type": kind, "hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 512,
            "num_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 16, "num_key_value_heads": 4,
            "num_hidden_layers": 8, "vocab_size": 1000, "use_sliding_window": True, "sliding_window": 4096}
    short = hf.model_of(data, "x", 2**50, 1, seq=4096)
    assert short.costs.window is None
    assert short.costs.flops == hf.model_of({**data, "use_sliding_window": False}, "x", 2**50, 1, seq=4096).costs.flops
    with pytest.raises(ValueError, match="differs between transformers versions"):
        hf.model_of(data, "x", 2**50, 1, seq=8192)
    assert hf.model_of({**data, "use_sliding_window": False}, "x", 2**50, 1, seq=8192).costs.window is None


def test_qwen3_moe_sliding_from_layer_zero_is_every_layer_in_both_versions():
    data = {"model_type": "qwen3_moe", "hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 512,
            "num_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 16, "num_key_value_heads": 4,
            "num_hidden_layers": 8, "vocab_size": 1000, "use_sliding_window": True, "sliding_window": 4096,
            "max_window_layers": 0}
    assert hf.model_of(data, "x", 2**50, 1, seq=8192).costs.window == 4096
