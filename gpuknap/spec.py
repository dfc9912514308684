"""Spec files (YAML or JSON, one schema; see docs/spec.md) and SAPP-PPB profiles.

A spec gives the model's layers as runs of a kind, each kind's options and
static memory (or an analytic ``transformer`` section), the device, the
pipeline and the bucket.  Quantities may carry units (``"852 MB"``,
``"80 GiB"``, ``"1.5 ms"``); bytes and milliseconds inside.  Every error
names the file and the field.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from .analytic import config_from, transformer_model
from .formats import sapp_ppb
from .model import PipelineModel
from .options import MEGABYTE, LayerOption
from .units import parse_quantity

TOP_LEVEL = {"name", "layers", "kinds", "transformer", "device", "pipeline", "bucket"}


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


def _read(path: str) -> Any:
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror})") from None
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path}: reading YAML needs PyYAML (pip install 'gpuknap[yaml]')") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


class _Fields:
    """Field access that names the file and the field in every error."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, field: str, what: str) -> ValueError:
        return ValueError(f"{self.path}: {field}: {what}")

    def mapping(self, value: Any, field: str) -> Mapping:
        if not isinstance(value, Mapping):
            raise self.fail(field, f"expected a mapping, got {type(value).__name__}")
        return value

    def integer(self, value: Any, field: str, low: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.fail(field, f"expected an integer >= {low}, got {value!r}")
        return value

    def quantity(self, value: Any, field: str, dimension: str, *, positive: bool = False) -> float:
        try:
            number = parse_quantity(value, dimension, field)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}") from None
        if number < 0 or (positive and number == 0):
            raise self.fail(field, f"expected a {'positive' if positive else 'non-negative'} {dimension} value, got {value!r}")
        return number


def _kinds(f: _Fields, data: Any) -> tuple[dict, dict]:
    fronts, static = {}, {}
    for kind, spec in f.mapping(data, "kinds").items():
        where = f"kinds.{kind}"
        spec = f.mapping(spec, where)
        unknown = sorted(set(spec) - {"static", "options"})
        if unknown:
            raise f.fail(where, f"unknown field(s) {unknown}; expected 'static' and 'options'")
        static[kind] = f.quantity(spec.get("static", 0), f"{where}.static", "bytes")
        options = spec.get("options")
        if not isinstance(options, list) or not options:
            raise f.fail(f"{where}.options", "expected a non-empty list of options")
        opts = []
        for j, o in enumerate(options):
            ow = f"{where}.options[{j}]"
            o = f.mapping(o, ow)
            unknown = sorted(set(o) - {"name", "memory", "held_once", "forward", "backward", "excess"})
            if unknown:
                raise f.fail(ow, f"unknown field(s) {unknown}")
            for req in ("memory", "forward", "backward"):
                if req not in o:
                    raise f.fail(ow, f"missing '{req}'")
            excess = []
            for e, pair in enumerate(o.get("excess", [])):
                if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                    raise f.fail(f"{ow}.excess[{e}]", "expected [in_flight, bytes]")
                excess.append((f.integer(pair[0], f"{ow}.excess[{e}][0]"),
                               f.quantity(pair[1], f"{ow}.excess[{e}][1]", "bytes")))
            opts.append(LayerOption(
                str(o.get("name", f"option{j}")),
                f.quantity(o["memory"], f"{ow}.memory", "bytes"),
                f.quantity(o["forward"], f"{ow}.forward", "ms"),
                f.quantity(o["backward"], f"{ow}.backward", "ms"),
                f.quantity(o.get("held_once", 0), f"{ow}.held_once", "bytes"),
                tuple(excess),
            ))
        fronts[kind] = opts
    return fronts, static


def _layers(f: _Fields, data: Any, fronts: Mapping) -> list:
    if not isinstance(data, list) or not data:
        raise f.fail("layers", "expected a non-empty list of {kind, count}")
    kinds = []
    for i, run in enumerate(data):
        run = f.mapping(run, f"layers[{i}]")
        if "kind" not in run:
            raise f.fail(f"layers[{i}]", "missing 'kind'")
        if not isinstance(run["kind"], (str, int)) or isinstance(run["kind"], bool) or run["kind"] not in fronts:
            raise f.fail(f"layers[{i}].kind", f"unknown kind {run['kind']!r}; kinds are {sorted(map(str, fronts))}")
        kinds.extend([run["kind"]] * f.integer(run.get("count", 1), f"layers[{i}].count", 0))
    if not kinds:
        raise f.fail("layers", "the model has no layers")
    return kinds


def load_spec(path: str | os.PathLike, *, capacity: Any = None, micro_batches: int | None = None,
              stages: int | None = None, bucket: Any = None, reserved: Any = None) -> Spec:
    """Load a spec file or a SAPP-PPB profile; keyword arguments override the file."""
    path = os.fspath(path)
    data = _read(path)
    f = _Fields(path)
    f.mapping(data, "(top level)")
    if "layers_description" in data:  # a SAPP-PPB profile
        if capacity is None or micro_batches is None:
            raise f.fail("(SAPP-PPB profile)", "give the device capacity and micro-batches (--capacity, --micro-batches)")
        model = sapp_ppb.load(path, capacity, micro_batches, reserved or 0)
        return Spec(model, stages, 1, None, MEGABYTE if bucket is None else f.quantity(bucket, "bucket", "bytes", positive=True),
                    path, str(data.get("name", os.path.basename(path))))
    unknown = sorted(set(data) - TOP_LEVEL)
    if unknown:
        raise f.fail("(top level)", f"unknown field(s) {unknown}; known: {sorted(TOP_LEVEL)}")
    device = f.mapping(data.get("device", {}), "device")
    pipeline = f.mapping(data.get("pipeline", {}), "pipeline")
    cap = capacity if capacity is not None else device.get("capacity")
    if cap is None:
        raise f.fail("device.capacity", "missing (the device memory, e.g. '80 GiB')")
    cap = f.quantity(cap, "device.capacity", "bytes", positive=True)
    res = f.quantity(reserved if reserved is not None else device.get("reserved", 0), "device.reserved", "bytes")
    m = micro_batches if micro_batches is not None else pipeline.get("micro_batches")
    if m is None:
        raise f.fail("pipeline.micro_batches", "missing")
    m = f.integer(m, "pipeline.micro_batches")
    if "transformer" in data:
        if "layers" in data or "kinds" in data:
            raise f.fail("transformer", "give either 'transformer' or 'layers' and 'kinds', not both")
        try:
            config = config_from(data["transformer"])
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        model = transformer_model(config, cap, m, res)
    else:
        for req in ("layers", "kinds"):
            if req not in data:
                raise f.fail(req, "missing (or give a 'transformer' section)")
        fronts, static = _kinds(f, data["kinds"])
        try:
            model = PipelineModel(_layers(f, data["layers"], fronts), fronts, static, cap, m, res)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    p = stages if stages is not None else pipeline.get("stages")
    if p is not None:
        p = f.integer(p, "pipeline.stages")
    chunks = f.integer(pipeline.get("interleave", 1), "pipeline.interleave")
    in_flight = pipeline.get("in_flight")
    if in_flight is not None:
        if p is None:
            raise f.fail("pipeline.in_flight", "needs pipeline.stages")
        try:
            in_flight = tuple(tuple(r) for r in model.in_flight_table(p, chunks, in_flight))
        except (TypeError, ValueError) as exc:
            raise f.fail("pipeline.in_flight", str(exc)) from None
    elif chunks > 1:
        raise f.fail("pipeline.in_flight", "required when pipeline.interleave > 1")
    b = bucket if bucket is not None else data.get("bucket", MEGABYTE)
    return Spec(model, p, chunks, in_flight, f.quantity(b, "bucket", "bytes", positive=True), path,
                str(data.get("name", os.path.basename(path))))
