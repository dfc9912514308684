"""Spec files (YAML or JSON, one schema; see docs/spec.md) and SAPP-PPB profiles.

A spec gives the model's layers as runs of a kind, each kind's options and
static memory (or an analytic ``transformer`` section), the device, the
pipeline and the bucket.  Quantities may carry units (``"852 MB"``,
``"80 GiB"``, ``"1.5 ms"``); bytes and milliseconds inside.  Every mapping
is closed (an unknown key is an error, with the nearest known key
suggested) and every error names the file and the field.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from .analytic import config_from, transformer_model
from .documents import check_keys, read_document
from .formats import hf, sapp_ppb
from .model import MAX_IN_FLIGHT, MAX_LAYERS, PipelineModel
from .options import MAX_BYTES, MAX_TIME, MEGABYTE, LayerOption
from .units import parse_quantity

TOP_LEVEL = ("name", "layers", "kinds", "transformer", "device", "pipeline", "bucket")
DEVICE = ("capacity", "reserved")
PIPELINE = ("stages", "micro_batches", "interleave", "in_flight")
LAYER_RUN = ("kind", "count")
KIND = ("static", "options")
OPTION = ("name", "memory", "held_once", "forward", "backward", "excess")


@dataclass(frozen=True)
class Spec:
    """A loaded spec: the model plus the pipeline settings to search with."""

    model: PipelineModel
    stages: int | None
    chunks: int
    in_flight: tuple | None
    bucket: float
    source: str
    name: str


class _Fields:
    """Field access that names the file and the field in every error."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, field: str, what: str) -> ValueError:
        return ValueError(f"{self.path}: {field}: {what}")

    def mapping(self, value: Any, field: str, known: tuple | None = None) -> Mapping:
        if not isinstance(value, Mapping):
            raise self.fail(field, f"expected a mapping, got {type(value).__name__}")
        if known is not None:
            try:
                check_keys(value, known, field)
            except ValueError as exc:
                raise ValueError(f"{self.path}: {exc}") from None
        return value

    def integer(self, value: Any, field: str, low: int = 1, high: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.fail(field, f"expected an integer >= {low}, got {_short(value)}")
        if high is not None and value > high:
            raise self.fail(field, f"expected an integer <= {high:,}, got {_short(value)}")
        return value

    def quantity(self, value: Any, field: str, dimension: str, *, positive: bool = False) -> float:
        try:
            number = parse_quantity(value, dimension, field)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}") from None
        if number < 0 or (positive and number == 0):
            raise self.fail(field, f"expected a {'positive' if positive else 'non-negative'} {dimension} value, "
                                   f"got {_short(value)}")
        high = MAX_BYTES if dimension == "bytes" else MAX_TIME
        if number > high:
            raise self.fail(field, f"{_short(value)} is beyond any real {dimension} value (at most {high:g})")
        return number

    def text(self, value: Any, field: str) -> str:
        if not isinstance(value, str):
            raise self.fail(field, f"expected a string, got {type(value).__name__}")
        return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _option(f: _Fields, o: Any, ow: str, j: int) -> LayerOption:
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
    return LayerOption(name, memory, f.quantity(o["forward"], f"{ow}.forward", "ms"),
                       f.quantity(o["backward"], f"{ow}.backward", "ms"), held, tuple(excess))


def _kinds(f: _Fields, data: Any) -> tuple[dict, dict]:
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


def _layers(f: _Fields, data: Any, fronts: Mapping) -> list:
    if not isinstance(data, list) or not data:
        raise f.fail("layers", "expected a non-empty list of {kind, count}")
    kinds: list = []
    for i, run in enumerate(data):
        run = f.mapping(run, f"layers[{i}]", LAYER_RUN)
        if "kind" not in run:
            raise f.fail(f"layers[{i}]", "missing 'kind'")
        kind = run["kind"]
        if not isinstance(kind, (str, int)) or isinstance(kind, bool) or kind not in fronts:
            raise f.fail(f"layers[{i}].kind", f"unknown kind {_short(kind)}; kinds are {sorted(map(str, fronts))}")
        count = f.integer(run.get("count", 1), f"layers[{i}].count", 0, MAX_LAYERS)
        if len(kinds) + count > MAX_LAYERS:
            raise f.fail(f"layers[{i}].count", f"the model would have more than {MAX_LAYERS:,} layers")
        kinds.extend([kind] * count)
    if not kinds:
        raise f.fail("layers", "the model has no layers")
    return kinds


def _override(value: Any, name: str, check) -> Any:
    """A keyword override, validated and blamed on the keyword (not the file)."""
    try:
        return check(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {str(exc).split(': ', 2)[-1]}") from None


#: How a Hugging Face config is trained: keyword -> (command-line flag, low, high); booleans apart.
TRAINING = {"seq": ("--seq", 1, 10**7), "micro_batch": ("--micro-batch-size", 1, 10**6),
            "tensor_parallel": ("--tp", 1, 4096), "expert_parallel": ("--ep", 1, 4096),
            "data_parallel": ("--dp", 1, 10**6)}


def _training(training: dict, arg: _Fields) -> dict:
    """Validated training keywords (None values dropped), blamed on the keyword and its flag."""
    out = {}
    for name, value in training.items():
        if value is None:
            continue
        if name == "sequence_parallel":
            if not isinstance(value, bool):
                raise ValueError(f"sequence_parallel: expected true or false, got {value!r}")
        elif name in TRAINING:
            flag, low, high = TRAINING[name]
            value = _override(value, f"{name} ({flag})", lambda v: arg.integer(v, name, low, high))
        else:
            raise ValueError(f"unknown keyword {name!r}; known: {', '.join(sorted(TRAINING))}, sequence_parallel")
        out[name] = value
    return out


def _hf_spec(data: Mapping, path: str, capacity: Any, micro_batches: Any, stages: Any, bucket: Any,
             reserved: Any, training: dict) -> Spec:
    for name, value, flag in (("capacity", capacity, "--capacity"), ("micro_batches", micro_batches,
                                                                     "--micro-batches"),
                              ("seq", training.get("seq"), "--seq")):
        if value is None:
            raise ValueError(f"{path}: a Hugging Face config needs {name} ({flag}): it describes the model, "
                             "not the device or the training run")
    reserved = 0.0 if reserved is None else reserved
    if reserved >= capacity:
        raise ValueError(f"reserved: {reserved:,.0f} bytes reserved leave nothing of the {capacity:,.0f}-byte capacity")
    model = hf.model_of(data, path, capacity, micro_batches, reserved, **training)
    arch = data.get("architectures")
    name = next((n for n in (data.get("_name_or_path"), arch[0] if isinstance(arch, list) and arch else None)
                 if isinstance(n, str) and n), os.path.basename(path))
    return Spec(model, stages, 1, None, MEGABYTE if bucket is None else bucket, path, name[:80])


def load_spec(path: str | os.PathLike, *, capacity: Any = None, micro_batches: int | None = None,
              stages: int | None = None, bucket: Any = None, reserved: Any = None, **training: Any) -> Spec:
    """Load a spec file, a SAPP-PPB profile or a Hugging Face ``config.json``;
    keyword arguments override the file.

    An override that is wrong is blamed on the keyword (``stages: expected an
    integer >= 1, got 0``), a field of the file on the file and the field.
    ``training`` (``seq``, ``micro_batch``, ``tensor_parallel``,
    ``expert_parallel``, ``data_parallel``, ``sequence_parallel``) says how a
    Hugging Face config is trained (``seq`` required); it is refused for
    other inputs rather than ignored.
    """
    path = os.fspath(path)
    arg = _Fields("(argument)")
    if capacity is not None:
        capacity = _override(capacity, "capacity", lambda v: arg.quantity(v, "capacity", "bytes", positive=True))
    if reserved is not None:
        reserved = _override(reserved, "reserved", lambda v: arg.quantity(v, "reserved", "bytes"))
    if bucket is not None:
        bucket = _override(bucket, "bucket", lambda v: arg.quantity(v, "bucket", "bytes", positive=True))
    if micro_batches is not None:
        micro_batches = _override(micro_batches, "micro_batches", lambda v: arg.integer(v, "micro_batches", 1, MAX_IN_FLIGHT))
    if stages is not None:
        stages = _override(stages, "stages", lambda v: arg.integer(v, "stages", 1, MAX_LAYERS))
    training = _training(training, arg)
    data = read_document(path)
    f = _Fields(path)
    f.mapping(data, "(top level)")
    if hf.is_config(data):
        return _hf_spec(data, path, capacity, micro_batches, stages, bucket, reserved, training)
    if training:
        name = sorted(training)[0]
        flag = TRAINING.get(name, ("--" + name,))[0]
        raise ValueError(f"{name} ({flag}): applies to Hugging Face config.json files only, "
                         f"and {path} is a gpuknap spec or a SAPP-PPB profile")
    if "layers_description" in data:  # a SAPP-PPB profile
        if capacity is None or micro_batches is None:
            raise f.fail("(SAPP-PPB profile)", "give the device capacity and micro-batches (--capacity, --micro-batches)")
        model = sapp_ppb.model_of(data, path, capacity, micro_batches, reserved or 0.0)
        name = data.get("name", os.path.basename(path))
        return Spec(model, stages, 1, None, MEGABYTE if bucket is None else bucket, path,
                    name if isinstance(name, str) else os.path.basename(path))
    f.mapping(data, "(top level)", TOP_LEVEL)
    name = f.text(data["name"], "name") if "name" in data else os.path.basename(path)
    device = f.mapping(data.get("device", {}), "device", DEVICE)
    pipeline = f.mapping(data.get("pipeline", {}), "pipeline", PIPELINE)
    if capacity is None:
        if "capacity" not in device:
            raise f.fail("device.capacity", "missing (the device memory, e.g. '80 GiB')")
        capacity = f.quantity(device["capacity"], "device.capacity", "bytes", positive=True)
    if reserved is None:
        reserved = f.quantity(device.get("reserved", 0), "device.reserved", "bytes")
    if reserved >= capacity:
        blame = "device.reserved" if "reserved" in device else "reserved"
        raise f.fail(blame, f"{reserved:,.0f} bytes reserved leave nothing of the {capacity:,.0f}-byte capacity")
    if micro_batches is None:
        if "micro_batches" not in pipeline:
            raise f.fail("pipeline.micro_batches", "missing")
        micro_batches = f.integer(pipeline["micro_batches"], "pipeline.micro_batches", 1, MAX_IN_FLIGHT)
    if "transformer" in data:
        if "layers" in data or "kinds" in data:
            raise f.fail("transformer", "give either 'transformer' or 'layers' and 'kinds', not both")
        try:
            model = transformer_model(config_from(data["transformer"]), capacity, micro_batches, reserved)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    else:
        for req in ("layers", "kinds"):
            if req not in data:
                raise f.fail(req, "missing (or give a 'transformer' section)")
        fronts, static = _kinds(f, data["kinds"])
        kinds = _layers(f, data["layers"], fronts)
        model = PipelineModel(kinds, fronts, static, capacity, micro_batches, reserved)
    if stages is None and "stages" in pipeline:
        stages = f.integer(pipeline["stages"], "pipeline.stages", 1, MAX_LAYERS)
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
            raise f.fail("pipeline.interleave", str(exc)) from None
    if bucket is None:
        bucket = f.quantity(data.get("bucket", MEGABYTE), "bucket", "bytes", positive=True)
    return Spec(model, stages, chunks, in_flight, bucket, path, name)
