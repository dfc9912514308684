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
from ..formats._fields import Fields, default_reserved, device_of
from ..formats.spec import spec_device
from ..search import PipelineModel


class TransformerBuilder:
    """Models of a spec's ``transformer`` section, one per configuration (its TP, CP, micro-batch
    size, DP, stages and device)."""

    #: A layer's times depend only on :data:`gpuknap.sweep._prune.TIME_KEYS` of a configuration.
    shares_layer_times = True

    def __init__(self, base: TransformerConfig, capacity: float | None, reserved: float | None, device: dict,
                 file_device: tuple | None = None):
        self.base, self.capacity, self.reserved, self.device = base, capacity, reserved, device
        #: ``(preset, fields, capacity)`` of the spec's own device, for configurations of no other device
        self.file_device = file_device
        self.layers = base.layers + (2 if base.vocab else 0)

    def __call__(self, config: dict) -> PipelineModel:
        for key in ("expert_parallel", "expert_tensor_parallel"):
            if config.get(key) not in (None, 1):
                raise ValueError(f"{key}: the spec's transformer section is a dense model; expert parallelism "
                                 "applies to MoE models (a Hugging Face config.json)")
        c = replace(self.base, tensor_parallel=config["tensor_parallel"], micro_batch=config["micro_batch_size"],
                    data_parallel=config["data_parallel"], pipeline_parallel=config["stages"],
                    context_parallel=config.get("context_parallel") or 1)
        keywords, capacity = self.device, self.capacity
        if self.file_device is not None and config.get("device") is None:  # the spec's device: all of it
            preset, fields_, own = self.file_device
            keywords = {**keywords, "device": preset,
                        "device_fields": {**fields_, **(keywords.get("device_fields") or {})}}
            capacity = own if capacity is None else capacity
        dev = device_for(keywords, config)
        capacity = dev.memory if capacity is None else capacity
        reserved = default_reserved(capacity) if self.reserved is None else self.reserved
        return transformer_model(c, capacity, config["micro_batches"], reserved, dev)


class HuggingFaceBuilder:
    """Models of a Hugging Face ``config.json``, one per configuration."""

    layers = None
    shares_layer_times = True

    def __init__(self, data: Any, path: str, capacity: float | None, reserved: float | None, seq: int, device: dict,
                 training: dict | None = None):
        self.data, self.path, self.capacity, self.reserved, self.seq = data, path, capacity, reserved, seq
        self.device, self.training = device, dict(training or {})

    def __call__(self, config: dict) -> PipelineModel:
        dev = device_for(self.device, config)
        capacity = dev.memory if self.capacity is None else self.capacity
        reserved = default_reserved(capacity) if self.reserved is None else self.reserved
        return hf.model_of(self.data, self.path, capacity, config["micro_batches"], reserved,
                           device=dev, seq=self.seq, micro_batch=config["micro_batch_size"],
                           tensor_parallel=config["tensor_parallel"], data_parallel=config["data_parallel"],
                           pipeline_parallel=config["stages"], context_parallel=config.get("context_parallel") or 1,
                           expert_parallel=config.get("expert_parallel") or 1,
                           expert_tensor_parallel=config.get("expert_tensor_parallel"), **self.training)


def device_for(keywords: dict, config: dict) -> Any:
    """A configuration's device: its grid's preset (else the source's), with the sweep's overrides."""
    chosen = dict(keywords)
    if config.get("device") is not None:
        chosen["device"] = config["device"]
    return device_of(chosen)


def builder_of(source: Any, capacity: Any, reserved: Any, seq: Any, bucket: Any, device: dict | None = None,
               training: dict | None = None) -> tuple:
    """``(builder, name, bucket, tokens per sample)`` of a spec or config path; ``device``: the device
    keywords (``device``, ``gpus_per_node``, ``efficiency``, ``device_fields``); ``training``: Boolean
    training keywords for every configuration (``tp_comm_overlap``).  Capacity and reserved bytes
    follow each configuration's device when not given."""
    training = dict(training or {})
    device = {k: v for k, v in (device or {}).items() if v is not None}
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(f"source must be a spec path, a config.json path or a callable, got {type(source).__name__}")
    path = os.fspath(source)
    data = read_document(path)
    if hf.is_config(data):
        spec = load_spec(path, capacity=capacity, micro_batches=1, bucket=bucket, reserved=reserved, seq=seq,
                         **device)
        return (HuggingFaceBuilder(data, path, None if capacity is None else spec.model.capacity,
                                   None if reserved is None else spec.model.reserved, int(seq), device, training),
                spec.name, spec.bucket, int(seq))
    if seq is not None:
        raise ValueError(f"seq (--seq): applies to Hugging Face config.json files only; {path} sets its own")
    if not isinstance(data, dict) or "transformer" not in data:
        raise ValueError(f"{path}: a sweep rebuilds the model for each tensor-parallel and micro-batch size, so it "
                         "needs a spec with a 'transformer' section or a Hugging Face config.json "
                         "(or, from Python, a callable returning a PipelineModel)")
    spec = load_spec(path, capacity=capacity, micro_batches=1, bucket=bucket, reserved=reserved, **device)
    base = replace(config_from(data["transformer"]), **training)
    section = data.get("device", {}) if isinstance(data.get("device"), dict) else {}
    own_reserved = reserved is not None or "reserved" in section
    file_device = None
    if "device" not in device:  # the spec's device, unless --device or the grid names another one
        preset, fields_ = spec_device(Fields(path), data)
        file_device = (preset, fields_, spec.model.capacity if "capacity" in section else None)
    return (TransformerBuilder(base, spec.model.capacity if capacity is not None else None,
                               spec.model.reserved if own_reserved else None, device, file_device), spec.name,
            MEGABYTE if spec.bucket is None else spec.bucket, base.seq)
