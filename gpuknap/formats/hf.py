"""Hugging Face ``config.json`` files of dense decoder models: Llama, Mistral, Qwen2.

A config gives the model's shape; how it is trained (sequence length,
micro-batch size, tensor- and data-parallel sizes) comes from the caller.
The layers then get the analytic options of :mod:`gpuknap.analytic`
(Korthikanti et al.): an embedding HEAD, ``num_hidden_layers`` decoder
layers with a gated MLP and grouped-query attention, and an output TAIL.

Only the fields below are read; a config carries many others (rope, norm,
token ids, dtype) that do not change memory or time at this level, and those
are left alone.  A missing or malformed field, or a size the parallel sizes
do not divide, is a ``ValueError`` naming the file and the field.  MoE
families (Mixtral, Qwen2-MoE/Qwen3-MoE, DeepSeek-V3) are recognised and
refused with a message: their options are not modelled yet.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from ..analytic import TransformerConfig, transformer_model
from ..model import PipelineModel

#: ``model_type`` values read as dense decoders with a gated (SwiGLU) MLP.
DENSE_TYPES = ("llama", "mistral", "qwen2")
#: ``model_type`` values recognised as mixture-of-experts models (not modelled yet).
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
#: Fields every dense config must give.
REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")


def is_config(data: Any) -> bool:
    """Whether a parsed document is a Hugging Face model config (by content)."""
    return isinstance(data, Mapping) and ("model_type" in data or "architectures" in data)


def _count(data: Mapping, key: str, where: str, default: Any = None) -> int:
    value = data.get(key, default)
    if value is None:
        raise ValueError(f"{where}: {key}: missing (a Hugging Face config of this family gives it)")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {key}: expected an integer >= 1, got {value!r}")
    return value


def _divides(size: int, flag: str, value: int, key: str, where: str) -> None:
    if value % size:
        raise ValueError(f"{where}: {key}: {value} is not divisible by the {flag} size {size}")


def transformer_config(data: Any, where: str, *, seq: int, micro_batch: int = 1, tensor_parallel: int = 1,
                       expert_parallel: int = 1, sequence_parallel: bool = True,
                       data_parallel: int = 1) -> TransformerConfig:
    """The :class:`TransformerConfig` of a dense config (``where`` names it in errors)."""
    if not is_config(data):
        raise ValueError(f"{where}: not a Hugging Face config (no 'model_type' or 'architectures')")
    kind = data.get("model_type")
    if kind in MOE_TYPES:
        raise ValueError(f"{where}: model_type: {kind!r} is a mixture-of-experts family; gpuknap reads dense "
                         f"configs ({', '.join(DENSE_TYPES)}) so far")
    if kind not in DENSE_TYPES:
        raise ValueError(f"{where}: model_type: {kind!r} is not a family gpuknap reads "
                         f"(dense: {', '.join(DENSE_TYPES)})")
    if expert_parallel != 1:
        raise ValueError(f"{where}: expert_parallel={expert_parallel} (--ep) applies to MoE models only")
    hidden = _count(data, "hidden_size", where)
    heads = _count(data, "num_attention_heads", where)
    kv_heads = _count(data, "num_key_value_heads", where, heads)
    ffn = _count(data, "intermediate_size", where)
    layers = _count(data, "num_hidden_layers", where)
    vocab = _count(data, "vocab_size", where)
    if hidden % heads:
        raise ValueError(f"{where}: hidden_size: {hidden} is not divisible by num_attention_heads={heads}")
    if heads % kv_heads:
        raise ValueError(f"{where}: num_key_value_heads: {kv_heads} does not divide num_attention_heads={heads}")
    _divides(tensor_parallel, "tensor-parallel (--tp)", heads, "num_attention_heads", where)
    if kv_heads % tensor_parallel and tensor_parallel % kv_heads:
        raise ValueError(f"{where}: num_key_value_heads: {kv_heads} KV heads cannot be split or replicated "
                         f"evenly over tensor-parallel size {tensor_parallel} (--tp)")
    _divides(tensor_parallel, "tensor-parallel (--tp)", ffn, "intermediate_size", where)
    try:
        return TransformerConfig(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn,
                                 gated_ffn=True, vocab=vocab, seq=seq, micro_batch=micro_batch,
                                 tensor_parallel=tensor_parallel, sequence_parallel=sequence_parallel,
                                 flash_attention=True, data_parallel=data_parallel)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def model_of(data: Any, where: str, capacity: float, micro_batches: int, reserved: float = 0.0,
             **training: Any) -> PipelineModel:
    """A :class:`PipelineModel` of a parsed config; ``training`` as for :func:`transformer_config`."""
    return transformer_model(transformer_config(data, where, **training), capacity, micro_batches, reserved)


def load(path: str | os.PathLike, *, capacity: Any, micro_batches: int, stages: int | None = None, seq: int,
         micro_batch: int = 1, tensor_parallel: int = 1, expert_parallel: int = 1, sequence_parallel: bool = True,
         data_parallel: int = 1, reserved: Any = None, bucket: Any = None):
    """The :class:`gpuknap.spec.Spec` of a ``config.json`` (``.model`` is a PipelineModel).

    ``capacity`` (bytes or a string with a unit), ``micro_batches`` and ``seq``
    are required: a config says nothing about the device or the training run.
    """
    from ..spec import load_spec  # the spec reader handles every input kind

    return load_spec(path, capacity=capacity, micro_batches=micro_batches, stages=stages, bucket=bucket,
                     reserved=reserved, seq=seq, micro_batch=micro_batch, tensor_parallel=tensor_parallel,
                     expert_parallel=expert_parallel, sequence_parallel=sequence_parallel,
                     data_parallel=data_parallel)
