"""Analytic options of mixture-of-experts models: dense and MoE decoder layers.

The formulas (docs/analytic.md, "Mixture-of-experts layers") extend the dense
ones of :mod:`._dense` (Korthikanti et al.) to a layer whose MLP is
a router, ``experts`` routed expert MLPs of ``expert_ffn`` of which each token
uses ``top_k``, and optionally always-on shared experts of ``shared_ffn``.
Per micro-batch a rank's experts see ``seq * micro_batch * top_k /
expert_parallel`` routed tokens; its static memory holds
``experts / expert_parallel`` local experts.  Every MLP is gated (SwiGLU);
16-bit activations, flash attention, sequence parallelism.

Options of a MoE layer: ``NONE``; ``SLCT`` (the attention core recomputed);
``MOEACT`` (the routed experts' activation function recomputed, as
Megatron's ``--recompute-modules moe_act``: the activation output is not
kept); ``SLCT+MOEACT``; ``FULL`` (the whole layer recomputed, its input
kept).  Dense layers of the same model get NONE, SLCT and FULL.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..engine import LayerOption
from ..search import PipelineModel
from ._dense import HOPPER_BF16_PEAK

#: Bytes of one 16-bit activation value.
ACT = 2


@dataclass(frozen=True)
class Attention:
    """Per-layer attention: parameters, projection and core FLOPs per token (forward, full size)."""

    params: float
    flops_per_token: float       # projections: 2 x parameters touched per token
    core_flops_per_token_per_seq: float  # attention core: multiplied by the sequence length


def gqa_attention(hidden: int, heads: int, kv_heads: int, head_dim: int) -> Attention:
    """Multi-head or grouped-query attention with ``head_dim`` per head."""
    q, kv = heads * head_dim, kv_heads * head_dim
    params = hidden * (q + 2 * kv) + q * hidden
    return Attention(params, 2 * params, 4 * q)


def mla_attention(hidden: int, heads: int, q_lora: int | None, kv_lora: int, nope: int, rope: int,
                  v_dim: int) -> Attention:
    """DeepSeek's multi-head latent attention (low-rank query and key-value projections)."""
    qk = nope + rope
    q_params = hidden * heads * qk if not q_lora else hidden * q_lora + q_lora * heads * qk
    params = q_params + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v_dim) + heads * v_dim * hidden
    return Attention(params, 2 * params, 2 * heads * qk + 2 * heads * v_dim)


@dataclass(frozen=True)
class MoEShape:
    """A model with dense and MoE decoder layers, and how it is trained."""

    hidden: int
    attention: Attention
    dense_ffn: int
    experts: int
    top_k: int
    expert_ffn: int
    shared_ffn: int
    vocab: int
    seq: int
    micro_batch: int = 1
    tensor_parallel: int = 1
    expert_parallel: int = 1
    data_parallel: int = 1
    param_bytes: float = 6.0
    optimizer_bytes: float = 12.0
    peak_flops: float = HOPPER_BF16_PEAK
    efficiency: float = 0.5

    @property
    def tokens(self) -> float:
        """Tokens of one micro-batch."""
        return self.seq * self.micro_batch

    @property
    def routed_tokens(self) -> float:
        """Routed tokens one rank's experts process per micro-batch."""
        return self.tokens * self.top_k / self.expert_parallel

    def ms(self, flops: float) -> float:
        return flops / (self.peak_flops * self.efficiency) * 1e3

    def static_bytes(self, sharded_params: float, local_params: float = 0.0) -> float:
        """Bytes of parameters split over tensor-parallel ranks plus parameters held whole."""
        per_param = self.param_bytes + self.optimizer_bytes / self.data_parallel
        return (sharded_params / self.tensor_parallel + local_params) * per_param

    def _attention(self) -> tuple[float, float, float, float]:
        """Per rank: activation bytes kept by attention and norms, forward ms of projections and core,
        static parameters (sharded)."""
        s, b, h, t = self.seq, self.micro_batch, self.hidden, self.tensor_parallel
        memory = 15 * s * b * h / t  # bytes; Korthikanti: 11sbh attention (flash: no score matrix) + 4sbh norms
        proj = self.ms(self.tokens * self.attention.flops_per_token / t)
        core = self.ms(self.tokens * s * self.attention.core_flops_per_token_per_seq / t)
        return memory, proj, core, self.attention.params + 2 * h

    def _mlp(self, ffn: float, tokens: float, split: int) -> tuple[float, float, float]:
        """A gated MLP over ``tokens`` split ``split`` ways: bytes kept, bytes of its activation
        output, forward ms (matmuls plus the activation function)."""
        h = self.hidden
        kept = ACT * tokens * (h + 3 * ffn) / split  # input, gate and up outputs, activation output
        act_out = ACT * tokens * ffn / split
        return kept, act_out, self.ms(tokens * (6 * h * ffn + 4 * ffn) / split)

    def dense_options(self) -> tuple[list[LayerOption], float]:
        """Options and static bytes of a dense decoder layer."""
        att_mem, proj, core, att_params = self._attention()
        mlp_mem, _, mlp_ms = self._mlp(self.dense_ffn, self.tokens, self.tensor_parallel)
        fwd = proj + core + mlp_ms
        layer_input = ACT * self.tokens * self.hidden / self.tensor_parallel
        options = [LayerOption("NONE", att_mem + mlp_mem, fwd, 2 * fwd),
                   LayerOption("SLCT", att_mem + mlp_mem, fwd, 2 * fwd + core),
                   LayerOption("FULL", layer_input, fwd, 3 * fwd)]
        return options, self.static_bytes(att_params + 3 * self.hidden * self.dense_ffn)

    def moe_options(self) -> tuple[list[LayerOption], float]:
        """Options and static bytes of a MoE decoder layer."""
        h, t = self.hidden, self.tensor_parallel
        att_mem, proj, core, att_params = self._attention()
        routed_mem, routed_act, routed_ms = self._mlp(self.expert_ffn, self.routed_tokens, 1)
        shared_mem, _, shared_ms = (self._mlp(self.shared_ffn, self.tokens, t) if self.shared_ffn
                                    else (0.0, 0.0, 0.0))
        router_mem = 4 * self.tokens * self.experts / t  # fp32 router logits
        router_ms = self.ms(2 * self.tokens * h * self.experts / t)
        fwd = proj + core + router_ms + routed_ms + shared_ms
        act_ms = self.ms(4 * self.routed_tokens * self.expert_ffn)  # recomputing the activation function
        kept = att_mem + router_mem + routed_mem + shared_mem
        layer_input = ACT * self.tokens * h / t
        options = [LayerOption("NONE", kept, fwd, 2 * fwd),
                   LayerOption("SLCT", kept, fwd, 2 * fwd + core),
                   LayerOption("MOEACT", kept - routed_act, fwd, 2 * fwd + act_ms),
                   LayerOption("SLCT+MOEACT", kept - routed_act, fwd, 2 * fwd + core + act_ms),
                   LayerOption("FULL", layer_input, fwd, 3 * fwd)]
        local_experts = self.experts // self.expert_parallel * 3 * h * self.expert_ffn
        sharded = att_params + 3 * h * self.shared_ffn + h * self.experts
        return options, self.static_bytes(sharded, local_experts)


def moe_model(shape: MoEShape, moe_layers: list[bool], capacity: float, micro_batches: int,
              reserved: float = 0.0) -> PipelineModel:
    """Embedding HEAD, the decoder layers (``moe_layers[i]``: layer i is MoE, else dense) and an
    output TAIL, as a :class:`PipelineModel` with kinds ``embedding``, ``dense``, ``moe``, ``output``."""
    fronts, static = {}, {}
    if not all(moe_layers):
        fronts["dense"], static["dense"] = shape.dense_options()
    if any(moe_layers):
        fronts["moe"], static["moe"] = shape.moe_options()
    out_fwd = shape.ms(2 * shape.tokens * shape.hidden * shape.vocab / shape.tensor_parallel)
    fronts["embedding"] = [LayerOption("HEAD", 0.0, 0.0, 0.0)]
    fronts["output"] = [LayerOption("TAIL", 0.0, out_fwd, 2 * out_fwd)]
    static["embedding"] = static["output"] = shape.static_bytes(shape.vocab * shape.hidden)
    kinds = ["embedding"] + ["moe" if m else "dense" for m in moe_layers] + ["output"]
    return PipelineModel(kinds, fronts, static, capacity, micro_batches, reserved)
