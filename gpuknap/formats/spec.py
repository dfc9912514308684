"""Spec files (YAML or JSON, one schema; see docs/spec.md), and the one reader of every input kind.

A spec gives the model's layers as runs of a kind, each kind's options and
static memory (or an analytic ``transformer`` section), the device, the
pipeline and the bucket.  Quantities may carry units (``"852 MB"``,
``"80 GiB"``, ``"1.5 ms"``); bytes and milliseconds inside.  Every mapping
is closed (an unknown key is an error, with the nearest known key
suggested) and every error names the file and the field.  :func:`load_spec`
also reads SAPP-PPB profiles and Hugging Face ``config.json`` files (told by
their content), through :mod:`.sapp_ppb` and :mod:`.hf`.
"""
from __future__ import annotations

import os
from dataclasses import fields, replace
from typing import Any, Mapping

from ..costs import PRESETS, TransformerConfig, fixed, transformer_model
from ..costs import device as costs_device
from ..engine import MEGABYTE, LayerOption, plain
from ..search import MAX_IN_FLIGHT, MAX_LAYERS, PipelineModel
from . import hf, sapp_ppb
from ._documents import check_keys, read_document
from ._fields import TRAINING, Fields, Spec, check_arguments, default_reserved, device_of, short

TOP_LEVEL = ("name", "layers", "kinds", "transformer", "device", "pipeline", "bucket")
DEVICE = ("capacity", "reserved", "preset", "gpus_per_node", "efficiency", "peak_flops", "memory_bandwidth",
          "intra_bandwidth", "inter_bandwidth", "intra_latency", "inter_latency", "memory_efficiency",
          "link_efficiency")
#: Keyword -> flag of the device keywords.
DEVICE_FLAGS = {"device": "--device", "gpus_per_node": "--gpus-per-node", "efficiency": "--efficiency",
                "device_fields": "--device-field", "recompute": "--recompute"}
PIPELINE = ("stages", "micro_batches", "interleave", "in_flight")
LAYER_RUN = ("kind", "count")
KIND = ("static", "options")
OPTION = ("name", "memory", "held_once", "forward", "backward", "excess")


def _option(f: Fields, o: Any, ow: str, j: int) -> LayerOption:
    o = f.mapping(o, ow, OPTION)
    for req in ("memory", "forward", "backward"):
        if req not in o:
            raise f.fail(ow, f"missing '{req}'")
    memory = f.quantity(o["memory"], f"{ow}.memory", "bytes")
    held = f.quantity(o.get("held_once", 0), f"{ow}.held_once", "bytes")
    raw = o.get("excess", [])
    if not isinstance(raw, list):
        raise f.fail(f"{ow}.excess", "expected a list of [in_flight, bytes] pairs")
    excess = []
    for e, pair in enumerate(raw):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise f.fail(f"{ow}.excess[{e}]", "expected [in_flight, bytes]")
        k = f.integer(pair[0], f"{ow}.excess[{e}][0]", 1, MAX_IN_FLIGHT)
        nbytes = f.quantity(pair[1], f"{ow}.excess[{e}][1]", "bytes")
        if k * memory + held - nbytes < 0:
            raise f.fail(f"{ow}.excess[{e}]", f"leaves negative memory at {k} in flight "
                                              f"({k} x memory + held_once - excess < 0)")
        excess.append((k, nbytes))
    name = f.text(o["name"], f"{ow}.name") if "name" in o else f"option{j}"
    if not name:
        raise f.fail(f"{ow}.name", "an option's name must not be empty")
    return LayerOption(name, memory, f.quantity(o["forward"], f"{ow}.forward", "ms"),
                       f.quantity(o["backward"], f"{ow}.backward", "ms"), held, tuple(excess))


def _kinds(f: Fields, data: Any) -> tuple[dict, dict]:
    fronts, static = {}, {}
    for kind, spec in f.mapping(data, "kinds").items():
        where = f"kinds.{kind}"
        spec = f.mapping(spec, where, KIND)
        static[kind] = f.quantity(spec.get("static", 0), f"{where}.static", "bytes")
        options = spec.get("options")
        if not isinstance(options, list) or not options:
            raise f.fail(f"{where}.options", "expected a non-empty list of options")
        opts = [_option(f, o, f"{where}.options[{j}]", j) for j, o in enumerate(options)]
        seen: dict[str, int] = {}
        for j, o in enumerate(opts):
            if o.name in seen:
                raise f.fail(f"{where}.options[{j}].name",
                             f"{o.name!r} is also the name of options[{seen[o.name]}]; names must differ")
            seen[o.name] = j
        fronts[kind] = opts
    return fronts, static


def _layers(f: Fields, data: Any, fronts: Mapping) -> list:
    if not isinstance(data, list) or not data:
        raise f.fail("layers", "expected a non-empty list of {kind, count}")
    kinds: list = []
    for i, run in enumerate(data):
        run = f.mapping(run, f"layers[{i}]", LAYER_RUN)
        if "kind" not in run:
            raise f.fail(f"layers[{i}]", "missing 'kind'")
        kind = run["kind"]
        if not isinstance(kind, (str, int)) or isinstance(kind, bool) or kind not in fronts:
            raise f.fail(f"layers[{i}].kind", f"unknown kind {short(kind)}; kinds are {sorted(map(str, fronts))}")
        count = f.integer(run.get("count", 1), f"layers[{i}].count", 0, MAX_LAYERS)
        if len(kinds) + count > MAX_LAYERS:
            raise f.fail(f"layers[{i}].count", f"the model would have more than {MAX_LAYERS:,} layers")
        kinds.extend([kind] * count)
    if not kinds:
        raise f.fail("layers", "the model has no layers")
    return kinds


def load_spec(path: str | os.PathLike, *, capacity: Any = None, micro_batches: int | None = None,
              stages: int | None = None, bucket: Any = None, reserved: Any = None, **training: Any) -> Spec:
    """Load a spec file, a SAPP-PPB profile or a Hugging Face ``config.json``;
    keyword arguments override the file.

    An override that is wrong is blamed on the keyword (``stages: expected an
    integer >= 1, got 0``), a field of the file on the file and the field.
    ``training`` (``seq``, ``micro_batch``, ``tensor_parallel``,
    ``expert_parallel``, ``data_parallel``, ``sequence_parallel``) says how a
    Hugging Face config is trained (``seq`` required); it is refused for
    other inputs rather than ignored.  More stages than the model has layers
    are refused.
    """
    spec = _load(path, capacity, micro_batches, stages, bucket, reserved, training)
    if spec.stages is not None and spec.stages > spec.model.layers:
        if stages is not None:  # the keyword against the file's model: both named
            raise ValueError(f"stages (--stages): {spec.stages} stages for the model of {spec.source}, which has "
                             f"{spec.model.layers} layers; every stage needs at least one layer")
        raise ValueError(f"{spec.source}: pipeline.stages: {spec.stages} stages for a model of {spec.model.layers} "
                         "layers; every stage needs at least one layer")
    return spec


def _load(path: Any, capacity: Any, micro_batches: Any, stages: Any, bucket: Any, reserved: Any,
          training: dict) -> Spec:
    """:func:`load_spec` before its checks across the fields."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: expected a file path, got {type(path).__name__}")
    path = os.fspath(path)
    capacity, micro_batches, stages, bucket, reserved = map(plain, (capacity, micro_batches, stages, bucket, reserved))
    capacity, micro_batches, stages, bucket, reserved, training = check_arguments(
        capacity, micro_batches, stages, bucket, reserved, {k: plain(v) for k, v in training.items()})
    data = read_document(path)
    f = Fields(path)
    f.mapping(data, "(top level)")
    if hf.is_config(data):
        return hf.spec_of(data, path, capacity, micro_batches, stages, bucket, reserved, training)
    if any(key in data for key in hf.SHAPE_FIELDS) and not any(key in data for key in TOP_LEVEL):
        raise ValueError(f"{path}: not a Hugging Face config (no 'model_type' or 'architectures'), though it has "
                         f"a config's fields; add the model_type its model has (e.g. \"llama\")")
    if "window" in training:
        raise ValueError(f"window: the attention window applies to a Hugging Face config, and {path} is not one")
    if training.pop("flash_attention", True) is False:
        raise ValueError(f"flash_attention: attention without flash attention is costed on a Hugging Face config, "
                         f"and {path} is not one")
    analytic = isinstance(data, Mapping) and "transformer" in data and "layers_description" not in data
    if training and not analytic:
        name = next((k for k in sorted(training) if k != "device"), None)
        if name is not None:
            flag = TRAINING.get(name, (DEVICE_FLAGS.get(name, "--" + name),))[0]
            raise ValueError(f"{name} ({flag}): applies to analytic models (a Hugging Face config.json or a spec "
                             f"with a 'transformer' section), and {path} gives its layers' options itself")
    if "layers_description" in data:  # a SAPP-PPB profile
        if capacity is None and "device" in training:
            capacity = training["device"].memory
        if capacity is None or micro_batches is None:
            raise f.fail("(SAPP-PPB profile)", "give the device capacity (--capacity or --device) and "
                                               "micro-batches (--micro-batches)")
        model = sapp_ppb.model_of(data, path, capacity, micro_batches, reserved or 0.0)
        name = data.get("name", os.path.basename(path))
        return Spec(model, stages, 1, None, MEGABYTE if bucket is None else bucket, path,
                    name if isinstance(name, str) else os.path.basename(path), "profile")
    f.mapping(data, "(top level)", TOP_LEVEL)
    name = f.text(data["name"], "name") if "name" in data else os.path.basename(path)
    device = f.mapping(data.get("device", {}), "device", DEVICE)
    pipeline = f.mapping(data.get("pipeline", {}), "pipeline", PIPELINE)
    preset, fields_ = spec_device(f, data)
    transformer = data.get("transformer") if isinstance(data.get("transformer"), Mapping) else {}
    said = {v: f"transformer.{k}" for k, v in TRANSFORMER_DEVICE.items() if transformer.get(k) is not None}
    dev = _device(f, preset, fields_, training, lambda k: said.get(k, f"device.{k}"))
    if capacity is None:
        if "device" in training or "memory" in (training.get("device_fields") or {}):
            capacity = dev.memory  # the flags' device over the file's: its memory is the capacity
        elif "capacity" in device:
            capacity = f.quantity(device["capacity"], "device.capacity", "bytes", positive=True)
        elif analytic or preset is not None:
            capacity = dev.memory
        else:
            raise f.fail("device.capacity", "missing (the device memory, e.g. '80 GiB', or a device preset)")
    if reserved is None:
        if "reserved" in device:
            reserved = f.quantity(device["reserved"], "device.reserved", "bytes")
        else:  # analytic models know nothing of the framework's own memory: reserve its typical overhead
            reserved = default_reserved(capacity) if analytic else 0.0
    if reserved >= capacity:
        blame = "device.reserved" if "reserved" in device else "reserved"
        raise f.fail(blame, f"{reserved:,.0f} bytes reserved leave nothing of the {capacity:,.0f}-byte capacity")
    given_micro_batches = micro_batches is not None
    if micro_batches is None:
        if "micro_batches" not in pipeline:
            raise f.fail("pipeline.micro_batches", "missing")
        micro_batches = f.integer(pipeline["micro_batches"], "pipeline.micro_batches", 1, MAX_IN_FLIGHT)
    if stages is None and "stages" in pipeline:
        stages = f.integer(pipeline["stages"], "pipeline.stages", 1, MAX_LAYERS)
    if analytic:
        if "layers" in data or "kinds" in data:
            raise f.fail("transformer", "give either 'transformer' or 'layers' and 'kinds', not both")
        try:
            config = trained(config_from(data["transformer"]), training, stages)
            model = transformer_model(config, capacity, micro_batches, reserved, dev)
            if training.get("recompute"):
                model = fixed(model, training["recompute"])
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    else:
        for req in ("layers", "kinds"):
            if req not in data:
                raise f.fail(req, "missing (or give a 'transformer' section)")
        fronts, static = _kinds(f, data["kinds"])
        kinds = _layers(f, data["layers"], fronts)
        model = PipelineModel(kinds, fronts, static, capacity, micro_batches, reserved)
    chunks = f.integer(pipeline.get("interleave", 1), "pipeline.interleave", 1, 64)
    in_flight = pipeline.get("in_flight")
    if in_flight is not None:
        if stages is None:
            raise f.fail("pipeline.in_flight", "needs pipeline.stages")
        if not isinstance(in_flight, list):
            raise f.fail("pipeline.in_flight", "expected a list of rows [stage][chunk]")
        try:
            in_flight = tuple(tuple(r) for r in model.in_flight_table(stages, chunks, in_flight))
        except (TypeError, ValueError) as exc:
            raise f.fail("pipeline.in_flight", str(exc)) from None
    elif chunks > 1 and stages is not None:  # the interleaved schedule's own in-flight counts
        try:
            in_flight = tuple(tuple(r) for r in model.in_flight_table(stages, chunks))
        except ValueError as exc:
            what, sep, rest = str(exc).partition(": ")
            if "micro_batches" in what:  # the schedule too long to build, or M not filling its groups: blame M
                raise f.fail("--micro-batches (micro_batches=)" if given_micro_batches else "pipeline.micro_batches",
                             rest if what == "micro_batches" and sep
                             else f"with {stages} stages x {chunks} chunks, {exc}") from None
            raise f.fail("pipeline.interleave", str(exc)) from None
    field = ""
    if bucket is None:
        bucket = f.quantity(data.get("bucket", MEGABYTE), "bucket", "bytes", positive=True)
        field = f"{path}: bucket" if "bucket" in data else ""
    return Spec(model, stages, chunks, in_flight, bucket, path, name, bucket_field=field)


def pipeline_shape(path: str | os.PathLike) -> tuple[int | None, int]:
    """A spec file's own ``(pipeline.stages or None, pipeline.interleave or 1)``, read before the
    spec is built (a command given counts builds it for their stage count); a file that is not a
    spec, or a value that is not one, gives the defaults and is left for :func:`load_spec` to name."""
    try:
        data = read_document(os.fspath(path))
    except (ValueError, TypeError):
        return None, 1
    pipeline = data.get("pipeline") if isinstance(data, dict) else None
    pipeline = pipeline if isinstance(pipeline, dict) else {}

    def whole(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None

    return whole(pipeline.get("stages")), min(whole(pipeline.get("interleave", 1)) or 1, 64)


def config_from(data: Mapping[str, Any], where: str = "transformer") -> TransformerConfig:
    """A config from a preset name and/or explicit fields (``{"preset": ..., "seq": ...}``)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping")
    data = dict(data)
    preset = data.pop("preset", None)
    check_keys(data, {f.name for f in fields(TransformerConfig)} | {"preset"}, where)
    if preset is not None:
        if not isinstance(preset, str) or preset not in PRESETS:
            raise ValueError(f"{where}.preset must be one of {sorted(PRESETS)}, got {preset!r}")
        try:
            return replace(PRESETS[preset], **data)
        except ValueError as exc:
            raise ValueError(str(exc).replace("transformer.", f"{where}.", 1)) from None
    missing = sorted({"layers", "hidden", "heads", "ffn", "seq"} - set(data))
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing} (or give a preset)")
    try:
        return TransformerConfig(**data)
    except ValueError as exc:
        raise ValueError(str(exc).replace("transformer.", f"{where}.", 1)) from None


#: A transformer section's device keys -> the device section's keys saying the same.
TRANSFORMER_DEVICE = {"device": "preset", "peak_flops": "peak_flops", "efficiency": "efficiency",
                      "gpus_per_node": "gpus_per_node"}


def spec_device(f: Fields, data: Mapping) -> tuple[str | None, dict]:
    """``(preset, fields)`` of the device a spec describes: its ``device`` section (``preset`` and
    any field of :class:`gpuknap.costs.Device`) and its ``transformer`` section's ``device``,
    ``peak_flops``, ``efficiency`` and ``gpus_per_node`` (the same things said there; saying one
    in both places is refused)."""
    section = f.mapping(data.get("device", {}), "device", DEVICE)
    transformer = data.get("transformer")
    said = dict(section)
    for key, target in TRANSFORMER_DEVICE.items():
        if isinstance(transformer, Mapping) and transformer.get(key) is not None:
            if target in section:
                raise f.fail(f"transformer.{key}", f"the device section gives device.{target} too; say it once")
            said[target] = transformer[key]
    preset = said.get("preset")
    if preset is not None and not isinstance(preset, str):
        where = "device.preset" if "preset" in section else "transformer.device"
        raise f.fail(where, f"expected a device name, got {short(preset)}")
    fields_ = {}
    for key, value in said.items():
        if key in ("capacity", "reserved", "preset"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            where = f"device.{key}" if key in section else f"transformer.{key}"
            raise f.fail(where, f"expected a number, got {short(value)}")
        fields_[key] = value
    return preset, fields_


def _device(f: Fields, preset: str | None, fields_: dict, training: dict, origin: Any = lambda k: f"device.{k}") -> Any:
    """The device of a spec: the keywords' (``--device`` and friends) over the spec's own
    (:func:`spec_device`), over the default preset.  ``origin(field)``: where the spec says it."""
    try:
        base = costs_device(preset, **fields_)
    except ValueError as exc:
        text = str(exc).split(": ", 1)[-1]
        key, _, rest = text.partition(" ")
        if key.startswith("device.") and rest:  # name the field as the spec wrote it
            raise f.fail(origin(key[len("device."):]), rest) from None
        raise f.fail("device", text) from None
    if not {"device", "gpus_per_node", "efficiency", "device_fields"} & set(training):
        return base
    keywords = dict(training)
    keywords.setdefault("device", base)
    return device_of(keywords)


#: Keyword -> TransformerConfig field of the training keywords a transformer section takes.
CONFIG_OF = {"seq": "seq", "micro_batch": "micro_batch", "tensor_parallel": "tensor_parallel",
             "context_parallel": "context_parallel", "data_parallel": "data_parallel",
             "pipeline_parallel": "pipeline_parallel", "sequence_parallel": "sequence_parallel",
             "tp_comm_overlap": "tp_comm_overlap"}


def trained(config: TransformerConfig, training: dict, stages: int | None) -> TransformerConfig:
    """A transformer section with the training keywords applied (``--tp``, ``--dp``, ...)."""
    changes = {CONFIG_OF[k]: v for k, v in training.items() if k in CONFIG_OF}
    for key in ("expert_parallel", "expert_tensor_parallel"):
        if training.get(key, 1) != 1:
            raise ValueError(f"{key}: a spec's transformer section is a dense model; expert parallelism applies "
                             "to MoE models (a Hugging Face config.json)")
    if stages is not None and "pipeline_parallel" not in changes:
        changes["pipeline_parallel"] = stages
    return replace(config, **changes) if changes else config
