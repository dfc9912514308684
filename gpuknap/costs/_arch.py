"""A decoder-only transformer's shape: attention (multi-head, grouped-query or multi-head latent),
dense MLPs (gated or not, any width) and mixture-of-experts MLPs (routed and shared experts).

Only the shape lives here; how it is trained is :class:`gpuknap.costs.Training`, and
what a layer costs on a device is :mod:`._layers`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ._devices import plain_fields

#: Largest size of any dimension (keeps every formula finite).
MAX_SIZE = 10**7


def _check_sizes(obj: object, where: str, optional: tuple = ()) -> None:
    plain_fields(obj)
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.name in ("latent", "experts", "moe_layers"):
            continue
        if f.type in ("bool",) or isinstance(value, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{where}.{f.name} must be true or false, got {value!r}")
            continue
        if value is None and f.name in optional:
            continue
        low = 0 if f.name in optional else 1
        if not isinstance(value, int) or not low <= value <= MAX_SIZE:
            raise ValueError(f"{where}.{f.name} must be an integer from {low} to {MAX_SIZE:,}, got {value!r}")


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek's multi-head latent attention: queries and keys/values through low-rank latents
    (``q_lora`` 0: queries projected directly), ``nope``/``rope`` query-key head dims, ``v_dim``."""

    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    v_dim: int

    def __post_init__(self):
        _check_sizes(self, "attention", optional=("q_lora",))


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts MLP: ``experts`` routed experts of width ``ffn`` of which each token uses
    ``top_k``, plus always-on shared experts of total width ``shared_ffn`` (0: none);
    ``shared_gate`` a learned sigmoid gate (``h`` weights) on the shared experts' output (Qwen2-MoE)."""

    experts: int
    top_k: int
    ffn: int
    shared_ffn: int = 0
    shared_gate: bool = False

    def __post_init__(self):
        _check_sizes(self, "experts", optional=("shared_ffn",))
        if self.top_k > self.experts:
            raise ValueError(f"experts.top_k: {self.top_k} is more than the {self.experts} experts")


@dataclass(frozen=True)
class Architecture:
    """The shape of a decoder-only transformer.

    ``heads`` query heads of ``head_dim`` (default ``hidden // heads``), ``kv_heads`` key/value
    heads (grouped-query attention; default ``heads``), or ``latent`` (MLA) instead; ``ffn`` the
    dense MLP width, ``gated`` for SwiGLU-style MLPs (three matrices) rather than two;
    ``experts`` and ``moe_layers`` (which decoder layers are MoE) for mixture-of-experts models;
    ``dropout`` whether dropout masks are kept (GPT-style training; modern LLMs train without);
    ``flash_attention`` whether the attention scores are never stored; ``layernorm`` LayerNorm
    (weight and bias) rather than RMSNorm; ``vocab`` 0 for no embedding and output layers;
    ``tied`` the embedding and output layers share one matrix (Hugging Face's ``tie_word_embeddings``);
    ``mtp`` multi-token-prediction depths after the output layer (DeepSeek-V3's ``num_nextn_predict_layers``);
    ``window`` sliding-window attention on every layer: each query attends to at most this many keys
    (None: the whole sequence); ``qkv_bias`` biases on the query, key and value projections (with
    ``latent``: on the down-projections), ``o_bias`` on the output projection, ``mlp_bias`` on the
    MLP's matrices, ``qk_norm`` an RMSNorm over each query and key head (Qwen3).
    """

    layers: int
    hidden: int
    heads: int
    vocab: int = 0
    ffn: int = 0
    head_dim: int | None = None
    kv_heads: int | None = None
    gated: bool = True
    latent: LatentAttention | None = None
    experts: Experts | None = None
    moe_layers: tuple = ()
    dropout: bool = False
    flash_attention: bool = True
    layernorm: bool = False
    tied: bool = False
    mtp: int = 0
    window: int | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    def __post_init__(self):
        _check_sizes(self, "architecture", optional=("vocab", "ffn", "head_dim", "kv_heads", "mtp", "window"))
        if self.mtp and not self.vocab:
            raise ValueError("architecture.mtp: multi-token prediction needs the output layer (a vocabulary)")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"architecture.hidden: {self.hidden} is not divisible by heads={self.heads}")
        if self.heads % self.kv:
            raise ValueError(f"architecture.kv_heads: {self.kv} does not divide heads={self.heads}")
        moe = tuple(bool(m) for m in self.moe_layers) if self.moe_layers else ()
        object.__setattr__(self, "moe_layers", moe)
        if moe and len(moe) != self.layers:
            raise ValueError(f"architecture.moe_layers: {len(moe)} entries for {self.layers} layers")
        if any(moe) and self.experts is None:
            raise ValueError("architecture.moe_layers marks MoE layers but no experts are given")
        if not all(moe or [False]) and not self.ffn:
            raise ValueError("architecture.ffn: dense layers need an MLP width")

    @property
    def d(self) -> int:
        """Query/key/value head dimension (GQA)."""
        return self.head_dim or self.hidden // self.heads

    @property
    def kv(self) -> int:
        """Key/value heads (GQA)."""
        return self.kv_heads or self.heads

    def is_moe(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]
