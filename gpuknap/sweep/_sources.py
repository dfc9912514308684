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

    def __init__(self, base: TransformerConfig, capacity: float, reserved: float):
        self.base, self.capacity, self.reserved = base, capacity, reserved
        self.layers = base.layers + (2 if base.vocab else 0)

    def __call__(self, config: dict) -> PipelineModel:
        c = replace(self.base, tensor_parallel=config["tensor_parallel"], micro_batch=config["micro_batch_size"],
                    data_parallel=config["data_parallel"])
        return transformer_model(c, self.capacity, config["micro_batches"], self.reserved)


class HuggingFaceBuilder:
    """Models of a Hugging Face ``config.json``, one per configuration."""

    layers = None

    def __init__(self, data: Any, path: str, capacity: float, reserved: float, seq: int):
        self.data, self.path, self.capacity, self.reserved, self.seq = data, path, capacity, reserved, seq

    def __call__(self, config: dict) -> PipelineModel:
        return hf.model_of(self.data, self.path, self.capacity, config["micro_batches"], self.reserved,
                           seq=self.seq, micro_batch=config["micro_batch_size"],
                           tensor_parallel=config["tensor_parallel"], data_parallel=config["data_parallel"])


def builder_of(source: Any, capacity: Any, reserved: Any, seq: Any, bucket: Any) -> tuple:
    """``(builder, name, bucket, tokens per sample)`` of a spec or config path."""
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(f"source must be a spec path, a config.json path or a callable, got {type(source).__name__}")
    path = os.fspath(source)
    data = read_document(path)
    if hf.is_config(data):
        spec = load_spec(path, capacity=capacity, micro_batches=1, bucket=bucket, reserved=reserved, seq=seq)
        return (HuggingFaceBuilder(data, path, spec.model.capacity, spec.model.reserved, int(seq)), spec.name,
                spec.bucket, int(seq))
    if seq is not None:
        raise ValueError(f"seq (--seq): applies to Hugging Face config.json files only; {path} sets its own")
    if not isinstance(data, dict) or "transformer" not in data:
        raise ValueError(f"{path}: a sweep rebuilds the model for each tensor-parallel and micro-batch size, so it "
                         "needs a spec with a 'transformer' section or a Hugging Face config.json "
                         "(or, from Python, a callable returning a PipelineModel)")
    spec = load_spec(path, capacity=capacity, micro_batches=1, bucket=bucket, reserved=reserved)
    base = config_from(data["transformer"])
    return (TransformerBuilder(base, spec.model.capacity, spec.model.reserved), spec.name,
            MEGABYTE if spec.bucket is None else spec.bucket, base.seq)
