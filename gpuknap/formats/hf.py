"""Hugging Face ``config.json`` files: dense (Llama, Mistral, Qwen2) and MoE (Mixtral,
Qwen2-MoE, Qwen3-MoE, DeepSeek-V3) decoder models.

A config gives the model's shape; how it is trained (sequence length,
micro-batch size, tensor- and data-parallel sizes) comes from the caller.
The layers then get the analytic options of :mod:`gpuknap.costs`
(Korthikanti et al.): an embedding HEAD, ``num_hidden_layers`` decoder
layers with a gated MLP and grouped-query attention, and an output TAIL.

Only the fields below are read; a config carries many others (rope, norm,
token ids, dtype) that do not change memory or time at this level, and those
are left alone.  A missing or malformed field, or a size the parallel sizes
do not divide, is a ``ValueError`` naming the file and the field.  MoE
families get dense and MoE layer kinds in model order, with the options of
:mod:`gpuknap.costs`.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from ..costs import (
    MoEShape,
    TransformerConfig,
    gqa_attention,
    mla_attention,
    moe_model,
    transformer_model,
)
from ..engine import MEGABYTE
from ..search import PipelineModel
from ._documents import read_document
from ._fields import Spec, check_arguments

#: ``model_type`` values read as dense decoders with a gated (SwiGLU) MLP.
DENSE_TYPES = ("llama", "mistral", "qwen2")
#: ``model_type`` values read as mixture-of-experts models (:mod:`gpuknap.costs`).
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
    if kind not in DENSE_TYPES:
        raise ValueError(f"{where}: model_type: {kind!r} is not a family gpuknap reads "
                         f"(dense: {', '.join(DENSE_TYPES)}; MoE: {', '.join(MOE_TYPES)})")
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


def _moe_layout(data: Mapping, kind: str, layers: int, where: str) -> list[bool]:
    """Which decoder layers are MoE layers, per family."""
    if kind == "mixtral":
        return [True] * layers
    if kind == "deepseek_v3":
        first = data.get("first_k_dense_replace", 0)
        freq = data.get("moe_layer_freq", 1)
        for key, value in (("first_k_dense_replace", first), ("moe_layer_freq", freq)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "moe_layer_freq" else 0):
                raise ValueError(f"{where}: {key}: expected an integer, got {value!r}")
        return [i >= first and (i - first) % freq == 0 for i in range(layers)]
    step = data.get("decoder_sparse_step", 1)
    only = data.get("mlp_only_layers", [])
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"{where}: decoder_sparse_step: expected an integer >= 1, got {step!r}")
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        raise ValueError(f"{where}: mlp_only_layers: expected a list of layer indices, got {only!r}")
    return [i not in only and (i + 1) % step == 0 for i in range(layers)]


def moe_shape(data: Mapping, where: str, *, seq: int, micro_batch: int = 1, tensor_parallel: int = 1,
              expert_parallel: int = 1, sequence_parallel: bool = True, data_parallel: int = 1) -> tuple:
    """``(MoEShape, moe_layers)`` of a Mixtral, Qwen2-MoE, Qwen3-MoE or DeepSeek-V3 config."""
    kind = data["model_type"]
    if not sequence_parallel:
        raise ValueError(f"{where}: MoE options are modelled with sequence parallelism only")
    hidden = _count(data, "hidden_size", where)
    heads = _count(data, "num_attention_heads", where)
    layers = _count(data, "num_hidden_layers", where)
    vocab = _count(data, "vocab_size", where)
    top_k = _count(data, "num_experts_per_tok", where)
    _divides(tensor_parallel, "tensor-parallel (--tp)", heads, "num_attention_heads", where)
    if kind == "deepseek_v3":
        experts_key, ffn_key = "n_routed_experts", "moe_intermediate_size"
        q_lora = data.get("q_lora_rank")
        if q_lora is not None:
            q_lora = _count(data, "q_lora_rank", where)
        attention = mla_attention(hidden, heads, q_lora, _count(data, "kv_lora_rank", where),
                                  _count(data, "qk_nope_head_dim", where), _count(data, "qk_rope_head_dim", where),
                                  _count(data, "v_head_dim", where))
        shared = data.get("n_shared_experts", 0) or 0
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            raise ValueError(f"{where}: n_shared_experts: expected an integer >= 0, got {shared!r}")
        shared_ffn = shared * _count(data, ffn_key, where)
    else:
        kv_heads = _count(data, "num_key_value_heads", where, heads)
        head_dim = _count(data, "head_dim", where, hidden // heads)
        if heads % kv_heads:
            raise ValueError(f"{where}: num_key_value_heads: {kv_heads} does not divide num_attention_heads={heads}")
        attention = gqa_attention(hidden, heads, kv_heads, head_dim)
        if kind == "mixtral":
            experts_key, ffn_key, shared_ffn = "num_local_experts", "intermediate_size", 0
        else:
            experts_key, ffn_key = "num_experts", "moe_intermediate_size"
            shared_ffn = data.get("shared_expert_intermediate_size", 0) or 0
            if isinstance(shared_ffn, bool) or not isinstance(shared_ffn, int) or shared_ffn < 0:
                raise ValueError(f"{where}: shared_expert_intermediate_size: expected an integer >= 0, "
                                 f"got {shared_ffn!r}")
    experts = _count(data, experts_key, where)
    if top_k > experts:
        raise ValueError(f"{where}: num_experts_per_tok: {top_k} is more than the {experts} experts ({experts_key})")
    _divides(expert_parallel, "expert-parallel (--ep)", experts, experts_key, where)
    moe_layers = _moe_layout(data, kind, layers, where)
    dense_ffn = _count(data, "intermediate_size", where) if not all(moe_layers) else 0
    if dense_ffn:
        _divides(tensor_parallel, "tensor-parallel (--tp)", dense_ffn, "intermediate_size", where)
    shape = MoEShape(hidden=hidden, attention=attention, dense_ffn=dense_ffn, experts=experts, top_k=top_k,
                     expert_ffn=_count(data, ffn_key, where), shared_ffn=shared_ffn, vocab=vocab, seq=seq,
                     micro_batch=micro_batch, tensor_parallel=tensor_parallel, expert_parallel=expert_parallel,
                     data_parallel=data_parallel)
    return shape, moe_layers


def model_of(data: Any, where: str, capacity: float, micro_batches: int, reserved: float = 0.0,
             **training: Any) -> PipelineModel:
    """A :class:`PipelineModel` of a parsed config; ``training`` as for :func:`transformer_config`."""
    if is_config(data) and data.get("model_type") in MOE_TYPES:
        shape, moe_layers = moe_shape(data, where, **training)
        return moe_model(shape, moe_layers, capacity, micro_batches, reserved)
    return transformer_model(transformer_config(data, where, **training), capacity, micro_batches, reserved)


def spec_of(data: Mapping, path: str, capacity: Any, micro_batches: Any, stages: Any, bucket: Any,
            reserved: Any, training: dict) -> Spec:
    """The :class:`Spec` of a parsed config, the keyword arguments checked already."""
    for name, value, flag in (("capacity", capacity, "--capacity"), ("micro_batches", micro_batches,
                                                                     "--micro-batches"),
                              ("seq", training.get("seq"), "--seq")):
        if value is None:
            raise ValueError(f"{path}: a Hugging Face config needs {name} ({flag}): it describes the model, "
                             "not the device or the training run")
    reserved = 0.0 if reserved is None else reserved
    if reserved >= capacity:
        raise ValueError(f"reserved: {reserved:,.0f} bytes reserved leave nothing of the {capacity:,.0f}-byte capacity")
    model = model_of(data, path, capacity, micro_batches, reserved, **training)
    arch = data.get("architectures")
    name = next((n for n in (data.get("_name_or_path"), arch[0] if isinstance(arch, list) and arch else None)
                 if isinstance(n, str) and n), os.path.basename(path))
    return Spec(model, stages, 1, None, MEGABYTE if bucket is None else bucket, path, name[:80])


def load(path: str | os.PathLike, *, capacity: Any, micro_batches: int, stages: int | None = None, seq: int,
         micro_batch: int = 1, tensor_parallel: int = 1, expert_parallel: int = 1, sequence_parallel: bool = True,
         data_parallel: int = 1, reserved: Any = None, bucket: Any = None) -> Spec:
    """The :class:`gpuknap.formats.Spec` of a ``config.json`` (``.model`` is a PipelineModel).

    ``capacity`` (bytes or a string with a unit), ``micro_batches`` and ``seq``
    are required: a config says nothing about the device or the training run.
    """
    training = dict(seq=seq, micro_batch=micro_batch, tensor_parallel=tensor_parallel,
                    expert_parallel=expert_parallel, sequence_parallel=sequence_parallel, data_parallel=data_parallel)
    capacity, micro_batches, stages, bucket, reserved, training = check_arguments(
        capacity, micro_batches, stages, bucket, reserved, training)
    path = os.fspath(path)
    data = read_document(path)
    if not is_config(data):
        raise ValueError(f"{path}: not a Hugging Face config (no 'model_type' or 'architectures')")
    return spec_of(data, path, capacity, micro_batches, stages, bucket, reserved, training)
