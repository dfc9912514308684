"""DeepSeek-V3's multi-token-prediction block (num_nextn_predict_layers) costed on the last stage,
where the Megatron settings gpuknap emits put it (--mtp-num-layers)."""
from __future__ import annotations

import json
import os

import pytest
from paths import EXAMPLES

from gpuknap.formats import hf

DEEPSEEK = os.path.join(EXAMPLES, "deepseek_v3_config.json")


def model(mtp: int, stages: int = 1, **training):
    data = dict(json.load(open(DEEPSEEK)), num_nextn_predict_layers=mtp)
    return hf.model_of(data, "x", 2**50, 8, seq=4096, pipeline_parallel=stages, **training)


def test_deepseek_v3_with_its_mtp_module_is_685b():
    """The Hub's DeepSeek-V3 is 685B parameters: 671B main model and 14B MTP module, which carries its
    own copy of the output head; Megatron-Core's MTP shares the last stage's output layer, so that
    copy (V x h) is not held again."""
    m = model(1, stages=16)
    total = sum(m.costs.params[k] + m.costs.expert_params.get(k, 0.0) for k in m.kinds)
    assert total == pytest.approx(685e9 - 129280 * 7168, rel=0.003)


@pytest.mark.parametrize("stages", [1, 4])
def test_mtp_block_by_hand(stages):
    """Per depth (Megatron-Core's MultiTokenPredictionLayer): one MoE layer (DeepSeek-V3's last
    layer kind), eh_proj 2h x h, enorm, hnorm and the final norm; with P > 1 the last stage holds
    a copy of the embedding; its logits (fp32) are kept with the main ones."""
    h, v = 7168, 129280
    without, with_mtp = model(0, stages), model(1, stages)
    extra = 18 * (2 * h * h + 3 * h + (v * h if stages > 1 else 0))  # bf16 weights, fp32 grads, Adam: 18 bytes
    assert with_mtp.static["output"] - without.static["output"] == pytest.approx(
        with_mtp.static["moe"] + extra, rel=1e-9)
    tail0, tail1 = without.fronts["output"][0], with_mtp.fronts["output"][0]
    moe = with_mtp.fronts["moe"][0]  # NONE: every activation kept
    assert tail1.held_once == pytest.approx(2 * tail0.held_once, rel=1e-12)
    assert tail1.per_micro_batch > tail0.per_micro_batch + moe.per_micro_batch
    assert tail1.forward_time > tail0.forward_time * 2 + moe.forward_time
    s = 4096
    logits_flops = 3 * 2 * s * h * v
    added = with_mtp.costs.flops["output"] - without.costs.flops["output"]
    assert added == pytest.approx(with_mtp.costs.flops["moe"] + 3 * 2 * s * 2 * h * h + logits_flops, rel=1e-12)
    assert model(2, stages).fronts["output"][0].held_once == pytest.approx(3 * tail0.held_once, rel=1e-12)


def test_mtp_must_be_a_count():
    with pytest.raises(ValueError, match="num_nextn_predict_layers"):
        model(-1)
