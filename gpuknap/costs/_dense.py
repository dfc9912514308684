"""Analytic transformer options from a spec's ``transformer`` section, for users without a profiler.

:class:`TransformerConfig` is the section's fields: a dense transformer (multi-head or
grouped-query attention, an MLP of any width, gated or not) and how it is trained.  It
maps onto the one cost model of :mod:`._layers` (docs/costs.md): the same module-by-module
activations and FLOPs as Hugging Face models, the device's peak, memory bandwidth and
links, tensor-parallel communication.  GPT-style models (``ffn = 4h``, no gating, dropout,
LayerNorm, vocabulary 51200, as in Korthikanti et al. 2022) are the ``gpt`` presets.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from ..search import PipelineModel
from ._arch import Architecture
from ._build import build
from ._comm import Training
from ._devices import Device, device, plain_fields

#: Dense BF16 peak of an H100/H200 SXM (FLOP/s), the analytic models' device before presets existed.
HOPPER_BF16_PEAK = 989e12

#: Fields that count things (must be integers).
INTEGER_FIELDS = frozenset({"layers", "hidden", "heads", "ffn", "seq", "kv_heads", "vocab", "micro_batch",
                            "tensor_parallel", "data_parallel", "context_parallel", "pipeline_parallel",
                            "gpus_per_node"})
#: Upper bounds that keep every formula finite; sizes not listed are bounded by MAX_SIZE.
MAX_SIZE = 10**7
LIMITS = {"layers": 100_000, "peak_flops": 1e21, "param_bytes": 64.0, "optimizer_bytes": 64.0}


@dataclass(frozen=True)
class TransformerConfig:
    """A dense transformer and how it is trained.  ``device``: a preset name (docs/costs.md); None
    for the default (H100); ``peak_flops``, ``efficiency`` and ``gpus_per_node`` override the
    device's.  ``dropout`` keeps dropout masks (GPT-style training), ``layernorm`` LayerNorm
    rather than RMSNorm."""

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
    peak_flops: float | None = None
    efficiency: float | None = None
    device: str | None = None
    gpus_per_node: int | None = None
    context_parallel: int = 1
    pipeline_parallel: int = 1
    dropout: bool = False
    layernorm: bool = False
    tp_comm_overlap: bool = False

    def __post_init__(self):
        plain_fields(self)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("bool",):
                if not isinstance(value, bool):
                    raise ValueError(f"transformer.{f.name} must be true or false, got {value!r}")
                continue
            if value is None:
                continue
            if f.name == "device":
                if not isinstance(value, str):
                    raise ValueError(f"transformer.device must be a preset name, got {value!r}")
                device(value)  # an unknown name is refused here, by name
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
        if self.efficiency is not None and self.efficiency > 1:
            raise ValueError(f"transformer.efficiency must be in (0, 1], got {self.efficiency!r}")
        if self.heads % (self.kv_heads or self.heads):
            raise ValueError("transformer.kv_heads must divide heads")
        if self.hidden % self.heads:
            raise ValueError(f"transformer.hidden: {self.hidden} is not divisible by heads={self.heads}")
        t, kv = self.tensor_parallel, self.kv_heads or self.heads
        if self.heads % t:
            raise ValueError(f"transformer.tensor_parallel: {t} does not divide heads={self.heads}")
        if kv % t and t % kv:
            raise ValueError(f"transformer.tensor_parallel: {kv} KV heads cannot be split or replicated evenly "
                             f"over {t} ranks")
        if self.seq % self.context_parallel:
            raise ValueError(f"transformer.context_parallel: {self.context_parallel} does not divide seq={self.seq}")
        rule = self.training().sequence_rule()
        if rule:
            raise ValueError(f"transformer.seq: {rule}")

    def architecture(self) -> Architecture:
        return Architecture(layers=self.layers, hidden=self.hidden, heads=self.heads, vocab=self.vocab,
                            ffn=self.ffn, kv_heads=self.kv_heads, gated=self.gated_ffn, dropout=self.dropout,
                            flash_attention=self.flash_attention, layernorm=self.layernorm)

    def training(self) -> Training:
        return Training(seq=self.seq, micro_batch=self.micro_batch, tensor_parallel=self.tensor_parallel,
                        context_parallel=self.context_parallel, data_parallel=self.data_parallel,
                        pipeline_parallel=self.pipeline_parallel, sequence_parallel=self.sequence_parallel,
                        distributed_optimizer=self.shard_optimizer, param_bytes=self.param_bytes,
                        optimizer_bytes=self.optimizer_bytes, tp_comm_overlap=self.tp_comm_overlap)

    def device_of(self) -> Device:
        return device(self.device, peak_flops=self.peak_flops, efficiency=self.efficiency,
                      gpus_per_node=self.gpus_per_node)


def transformer_model(c: TransformerConfig, capacity: float, micro_batches: int, reserved: float = 0.0,
                      dev: Device | None = None) -> PipelineModel:
    """A :class:`PipelineModel` of the transformer (embedding HEAD and output TAIL with a vocabulary);
    ``dev`` (a Device or a preset name) replaces the config's device."""
    if not isinstance(c, TransformerConfig):
        raise ValueError(f"c must be a gpuknap.costs.TransformerConfig, got {type(c).__name__}")
    return build(c.architecture(), c.training(), device(dev) if dev is not None else c.device_of(), capacity,
                 micro_batches, reserved)


PRESETS: Mapping[str, TransformerConfig] = {
    "llama2-70b": TransformerConfig(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, gated_ffn=True,
                                    vocab=32000, seq=4096, micro_batch=1, tensor_parallel=8,
                                    sequence_parallel=True, flash_attention=True, data_parallel=8),
    "gpt3-175b": TransformerConfig(layers=96, hidden=12288, heads=96, ffn=49152, vocab=51200, seq=2048,
                                   micro_batch=1, tensor_parallel=8, sequence_parallel=True,
                                   flash_attention=False, data_parallel=8, dropout=True, layernorm=True),
}


def gpt(layers: int, hidden: int, heads: int, **training) -> TransformerConfig:
    """A GPT-style model as Korthikanti et al. 2022 and Narayanan et al. 2021 train it: ``ffn = 4h``,
    no gating, vocabulary 51200, sequence 2048, dropout, LayerNorm, no flash attention."""
    base = dict(ffn=4 * hidden, vocab=51200, seq=2048, gated_ffn=False, flash_attention=False, dropout=True,
                layernorm=True)
    base.update(training)
    return TransformerConfig(layers=layers, hidden=hidden, heads=heads, **base)
