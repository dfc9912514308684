"""Costs: each layer's recompute options (time and memory) from a model's shape, how it is trained
and the device it runs on.

Owns the devices and their presets (peak FLOP/s, HBM, links, with sources in docs/costs.md),
the training run's parallel sizes and where their groups sit on the cluster, the
communication formulas (TP, CP, EP collectives, pipeline sends, data-parallel gradients),
the module-by-module activation and FLOP model of every layer type (dense MHA/GQA, gated or
not; MoE with shared experts; MLA), and the models built from them
(:func:`build`, :class:`TransformerConfig` for spec files), each carrying
:class:`ModelCosts` for MFU and the per-stage time breakdown.  Reading a model's description
from a file is the formats' job; this package only computes.
"""
from ._arch import Architecture, Experts, LatentAttention
from ._build import RECOMPUTE, ModelCosts, build, check_run, fixed, options, parallel_problems, static_bytes
from ._comm import (DISPATCHERS, Links, Training, all_gather, all_reduce, all_to_all, all_to_all_across, flex_dispatch,
                    links, nodes_reached, placement, send)
from ._dense import HOPPER_BF16_PEAK, INTEGER_FIELDS, LIMITS, MAX_SIZE, PRESETS, TransformerConfig, gpt, transformer_model
from ._estimate import COMPONENTS, Estimate, estimate, pipeline_send, run_of
from ._devices import DEFAULT_DEVICE, DEFAULT_EFFICIENCY, DEVICES, LEAST_EFFICIENCY, Device, device
from ._layers import ACT, FP32, LayerCost, layer_cost

__all__ = [
    "Architecture", "Experts", "LatentAttention", "RECOMPUTE", "ModelCosts", "build", "check_run", "fixed", "options", "parallel_problems",
    "static_bytes", "DISPATCHERS", "Links", "Training", "all_gather", "all_reduce", "all_to_all", "all_to_all_across",
    "flex_dispatch", "links", "nodes_reached", "placement", "send",
    "HOPPER_BF16_PEAK", "INTEGER_FIELDS", "LIMITS", "MAX_SIZE", "PRESETS", "TransformerConfig", "gpt",
    "transformer_model", "DEFAULT_DEVICE", "DEFAULT_EFFICIENCY", "DEVICES", "LEAST_EFFICIENCY", "Device", "device",
    "ACT", "FP32", "LayerCost", "layer_cost", "COMPONENTS", "Estimate", "estimate", "pipeline_send", "run_of",
]
