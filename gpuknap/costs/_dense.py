"""Analytic transformer options, for users without a profiler.

Activation memory per layer and micro-batch follows Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models" (2022),
with s = sequence length, b = micro-batch size, h = hidden size, a = heads,
t = tensor-parallel size (bytes, 16-bit activations):

* no recompute, no sequence parallelism: ``s*b*h*(10 + 24/t + 5*a*s/(h*t))``  (their eq. 2 / t)
* no recompute, sequence parallelism:    ``s*b*h*(34/t + 5*a*s/(h*t))``      (their eq. 4)
* selective recompute drops the attention term ``5*a*s/(h*t)``                  (their eq. 6)
* full recompute keeps only the layer input: ``2*s*b*h`` (``/t`` with sequence parallelism)
* flash attention stores no attention matrix: the ``5*a*s/(h*t)`` term is dropped for every option.

Time comes from FLOPs divided by ``t`` and by the achieved FLOP/s (peak x
efficiency).  Forward FLOPs of a layer: QKV ``2bsh(h + 2*h_kv)`` with
``h_kv = h * kv_heads / heads`` (GQA), output projection ``2bsh^2``, MLP
``4bsh*ffn`` (``6bsh*ffn`` when gated), attention core ``4bs^2h``; for the
standard layer (ffn = 4h, no GQA) this is the paper's ``24bsh^2 + 4bs^2h``.
Backward is twice the forward; selective recompute adds the attention core's
forward again, full recompute adds one whole forward (Korthikanti et al. §5).

Static bytes per layer: its parameters ``/t`` times (weights + gradients bytes
per parameter + optimizer bytes per parameter, the latter divided by the
data-parallel size when the optimizer is sharded).  With a vocabulary, an
embedding HEAD and an output TAIL layer are added (parameters ``vocab*h/t``;
the output layer's forward ``2bsh*vocab`` FLOPs; their activations are not
modelled).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from ..engine import LayerOption
from ..search import PipelineModel

#: Dense BF16 peak of an H100/H200 SXM (FLOP/s).
HOPPER_BF16_PEAK = 989e12


#: Fields that count things (must be integers).
INTEGER_FIELDS = frozenset({"layers", "hidden", "heads", "ffn", "seq", "kv_heads", "vocab", "micro_batch",
                            "tensor_parallel", "data_parallel"})
#: Upper bounds that keep every formula finite; sizes not listed are bounded by MAX_SIZE.
MAX_SIZE = 10**7
LIMITS = {"layers": 100_000, "peak_flops": 1e21, "param_bytes": 64.0, "optimizer_bytes": 64.0}


@dataclass(frozen=True)
class TransformerConfig:
    """A transformer and how it is parallelised (see the module docstring for the formulas)."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    seq: int
    kv_heads: int | None = None
    gated_ffn: bool = False
    vocab: int = 0
    micro_batch: int = 1
    tensor_parallel: int = 1
    sequence_parallel: bool = True
    flash_attention: bool = True
    param_bytes: float = 6.0       # bf16 weights + fp32 gradients
    optimizer_bytes: float = 12.0  # fp32 master weights + Adam moments
    data_parallel: int = 1
    shard_optimizer: bool = True
    peak_flops: float = HOPPER_BF16_PEAK
    efficiency: float = 0.5

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("bool",):
                if not isinstance(value, bool):
                    raise ValueError(f"transformer.{f.name} must be true or false, got {value!r}")
                continue
            if value is None:
                continue
            if f.name in INTEGER_FIELDS:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"transformer.{f.name} must be an integer, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"transformer.{f.name} must be a number, got {value!r}")
            if not value <= LIMITS.get(f.name, MAX_SIZE):
                raise ValueError(f"transformer.{f.name} must be at most {LIMITS.get(f.name, MAX_SIZE):g}, got {value!r}")
            if f.name == "vocab":
                if value < 0:
                    raise ValueError(f"transformer.vocab must be >= 0, got {value!r}")
            elif value <= 0:
                raise ValueError(f"transformer.{f.name} must be > 0, got {value!r}")
        if self.efficiency > 1:
            raise ValueError(f"transformer.efficiency must be in (0, 1], got {self.efficiency!r}")
        if self.heads % (self.kv_heads or self.heads):
            raise ValueError("transformer.kv_heads must divide heads")

    @property
    def kv_hidden(self) -> float:
        return self.hidden * (self.kv_heads or self.heads) / self.heads

    def layer_params(self) -> float:
        h, f = self.hidden, self.ffn
        return h * (h + 2 * self.kv_hidden) + h * h + (3 if self.gated_ffn else 2) * h * f + 2 * h

    def static_bytes(self, params: float) -> float:
        opt = self.optimizer_bytes / (self.data_parallel if self.shard_optimizer else 1)
        return params / self.tensor_parallel * (self.param_bytes + opt)

    def seconds(self, flops: float) -> float:
        return flops / self.tensor_parallel / (self.peak_flops * self.efficiency)


def activation_bytes(c: TransformerConfig) -> dict[str, float]:
    """Bytes per layer and micro-batch in flight, per option (Korthikanti et al.)."""
    s, b, h, a, t = c.seq, c.micro_batch, c.hidden, c.heads, c.tensor_parallel
    attention = 0.0 if c.flash_attention else 5 * a * s / (h * t)
    linear = 34 / t if c.sequence_parallel else 10 + 24 / t
    return {
        "NONE": s * b * h * (linear + attention),
        "SELECTIVE": s * b * h * linear,
        "FULL": 2 * s * b * h / (t if c.sequence_parallel else 1),
    }


def layer_options(c: TransformerConfig) -> list[LayerOption]:
    """NONE, SELECTIVE and FULL for one transformer layer (times in ms)."""
    s, b, h = c.seq, c.micro_batch, c.hidden
    core = 4 * b * s * s * h
    forward = 2 * b * s * h * (h + 2 * c.kv_hidden) + 2 * b * s * h * h \
        + (6 if c.gated_ffn else 4) * b * s * h * c.ffn + core
    ms = 1e3
    fwd = c.seconds(forward) * ms
    bwd = 2 * fwd
    mem = activation_bytes(c)
    return [
        LayerOption("NONE", mem["NONE"], fwd, bwd),
        LayerOption("SELECTIVE", mem["SELECTIVE"], fwd, bwd + c.seconds(core) * ms),
        LayerOption("FULL", mem["FULL"], fwd, bwd + fwd),
    ]


def transformer_model(c: TransformerConfig, capacity: float, micro_batches: int, reserved: float = 0.0) -> PipelineModel:
    """A :class:`PipelineModel` of the transformer (embedding HEAD and output TAIL with a vocabulary)."""
    kinds = ["layer"] * c.layers
    fronts = {"layer": layer_options(c)}
    static = {"layer": c.static_bytes(c.layer_params())}
    if c.vocab:
        emb = c.static_bytes(c.vocab * c.hidden)
        out_fwd = c.seconds(2 * c.micro_batch * c.seq * c.hidden * c.vocab) * 1e3
        fronts["embedding"] = [LayerOption("HEAD", 0.0, 0.0, 0.0)]
        fronts["output"] = [LayerOption("TAIL", 0.0, out_fwd, 2 * out_fwd)]
        static.update(embedding=emb, output=emb)
        kinds = ["embedding"] + kinds + ["output"]
    return PipelineModel(kinds, fronts, static, capacity, micro_batches, reserved)


PRESETS: Mapping[str, TransformerConfig] = {
    "llama2-70b": TransformerConfig(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, gated_ffn=True,
                                    vocab=32000, seq=4096, micro_batch=1, tensor_parallel=8,
                                    sequence_parallel=True, flash_attention=True, data_parallel=8),
    "gpt3-175b": TransformerConfig(layers=96, hidden=12288, heads=96, ffn=49152, vocab=51200, seq=2048,
                                   micro_batch=1, tensor_parallel=8, sequence_parallel=True,
                                   flash_attention=False, data_parallel=8),
}
