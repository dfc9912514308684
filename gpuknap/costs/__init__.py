"""Costs: each layer's recompute options (time and memory) from a model's shape and how it is trained.

Owns the analytic models: dense transformer layers (:class:`TransformerConfig`,
Korthikanti et al.'s activation formulas and FLOP counts) and mixture-of-experts
layers (:class:`MoEShape`, with grouped-query or multi-head latent attention),
each turned into a :class:`gpuknap.search.PipelineModel`.  Reading a model's
description from a file is the formats' job; this package only computes.
"""
from ._dense import (
                     HOPPER_BF16_PEAK,
                     INTEGER_FIELDS,
                     LIMITS,
                     MAX_SIZE,
                     PRESETS,
                     TransformerConfig,
                     activation_bytes,
                     layer_options,
                     transformer_model,
)
from ._moe import ACT, Attention, MoEShape, gqa_attention, mla_attention, moe_model

__all__ = [
    "HOPPER_BF16_PEAK", "INTEGER_FIELDS", "LIMITS", "MAX_SIZE", "PRESETS", "TransformerConfig",
    "activation_bytes", "layer_options", "transformer_model",
    "ACT", "Attention", "MoEShape", "gqa_attention", "mla_attention", "moe_model",
]
