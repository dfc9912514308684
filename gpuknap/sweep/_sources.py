"""Where a sweep's models come from: a spec with a ``transformer`` section or a Hugging
Face ``config.json``, rebuilt for each configuration's tensor-parallel size,
micro-batch size, data-parallel size and micro-batches.

The builders are small picklable objects, so a Dask worker can rebuild every
model of its shard itself.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from ..costs import TransformerConfig, transformer_model
from ..engine import MEGABYTE
from ..formats import config_from, hf, load_spec, read_document
from ..search import PipelineModel


class TransformerBuilder:
    """Models of a spec's ``transformer`` section, one per configuration."""

    def __init__(self, base: TransformerConfig, capacity: float, reserved: float, device: Any):
        self.base, self.capacity, self.reserved, self.device = base, capacity, reserved, device
        self.layers = base.layers + (2 if base.vocab else 0)

    def __call__(self, config: dict) -> PipelineModel:
        c = replace(self.base, tensor_parallel=config["tensor_parallel"], micro_batch=config["micro_batch_size"],
                    data_parallel=config["data_parallel"], pipeline_parallel=config["stages"])
        return transformer_model(c, self.capacity, config["micro_batches"], self.reserved, self.device)


class HuggingFaceBuilder:
    """Models of a Hugging Face ``config.json``, one per configuration; ``training``: the keywords
    every configuration shares (expert and context parallel sizes, ...)."""

    layers = None

    def __init__(self, data: Any, path: str, capacity: float, reserved: float, seq: int, device: Any,
                 training: dict):
        self.data, self.path, self.capacity, self.reserved, self.seq = data, path, capacity, reserved, seq
        self.device, self.training = device, training

    def __call__(self, config: dict) -> PipelineModel:
        return hf.model_of(self.data, self.path, self.capacity, config["micro_batches"], self.reserved,
                           device=self.device, seq=self.seq, micro_batch=config["micro_batch_size"],
                           tensor_parallel=config["tensor_parallel"], data_parallel=config["data_parallel"],
                           pipeline_parallel=config["stages"], **self.training)


#: Keywords a sweep passes on to every configuration's model (the grid sets the others).
SHARED = ("expert_parallel", "expert_tensor_parallel", "context_parallel")


def builder_of(source: Any, capacity: Any, reserved: Any, seq: Any, bucket: Any, training: dict | None = None) -> tuple:
    """``(builder, name, bucket, tokens per sample)`` of a spec or config path; ``training``: device
    keywords (``device``, ``gpus_per_node``, ``efficiency``, ``device_fields``) and :data:`SHARED`."""
    training = {k: v for k, v in (training or {}).items() if v is not None}
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(f"source must be a spec path, a config.json path or a callable, got {type(source).__name__}")
    path = os.fspath(source)
    data = read_document(path)
    device = {k: v for k, v in training.items() if k not in SHARED}  # the rest is checked per configuration
    if hf.is_config(data):
        spec = load_spec(path, capacity=capacity, micro_batches=1, bucket=bucket, reserved=reserved, seq=seq,
                         **device)
        shared = {k: v for k, v in training.items() if k in SHARED}
        return (HuggingFaceBuilder(data, path, spec.model.capacity, spec.model.reserved, int(seq),
                                   spec.model.costs.device, shared), spec.name, spec.bucket, int(seq))
    if seq is not None:
        raise ValueError(f"seq (--seq): applies to Hugging Face config.json files only; {path} sets its own")
    if not isinstance(data, dict) or "transformer" not in data:
        raise ValueError(f"{path}: a sweep rebuilds the model for each tensor-parallel and micro-batch size, so it "
                         "needs a spec with a 'transformer' section or a Hugging Face config.json "
                         "(or, from Python, a callable returning a PipelineModel)")
    for key in ("expert_parallel", "expert_tensor_parallel"):
        if training.get(key, 1) != 1:
            raise ValueError(f"{key}: {path}'s transformer section is a dense model; expert parallelism applies to "
                             "MoE models (a Hugging Face config.json)")
    spec = load_spec(path, capacity=capacity, micro_batches=1, bucket=bucket, reserved=reserved, **device)
    base = config_from(data["transformer"])
    if training.get("context_parallel"):
        base = replace(base, context_parallel=training["context_parallel"])
    return (TransformerBuilder(base, spec.model.capacity, spec.model.reserved, spec.model.costs.device), spec.name,
            MEGABYTE if spec.bucket is None else spec.bucket, base.seq)
