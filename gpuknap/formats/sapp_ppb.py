"""SAPP-PPB layer profiles (MindSpore hyper-parallel's pipeline balancer).

Only ``layers_description`` is read: entries in model order, each ``nb_layer``
consecutive layers of one kind.  Memory is in MB (2**20 bytes); times in the
profiler's unit.  ``BODY`` entries have recompute options (one per memory key
present); ``HEAD`` and ``TAIL`` entries one option without activation memory.
"""
from __future__ import annotations

import os
from typing import Any

from ..engine import MAX_BYTES, MAX_TIME, MEGABYTE, LayerOption
from ..search import MAX_LAYERS, PipelineModel
from ._documents import check_keys, read_document
from ._units import parse_quantity

#: (option, memory key, backward time key, coefficient key, default coefficient)
RECOMPUTE = (
    ("NONE", "memory_activation", "backward_time", "backward_coef", 0.0),
    ("SLCT", "memory_select_rec", "select_rec_time", "select_rec_coef", 0.04),
    ("COMM", "memory_select_comm", "select_comm_time", "select_comm_coef", 0.125),
    ("BOTH", "memory_both_comm_select", "both_comm_select_time", "both_comm_select_coef", 0.165),
    ("FULL", "memory_recompute", "recompute_time", "recompute_coef", 0.5),
)
TYPES = ("HEAD", "BODY", "TAIL")
#: Largest recompute coefficient accepted.
MAX_COEF = 1e6


def _number(entry: dict, key: str, where: str, *, default: Any = None) -> float:
    if key not in entry:
        if default is None:
            raise ValueError(f"{where}: missing '{key}'")
        return default
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{where}.{key} must be a number >= 0, got {value!r}")
    if key.startswith("memory"):
        high = MAX_BYTES / MEGABYTE
    else:  # times, and coefficients that multiply them: their products stay finite
        high = MAX_COEF if key.endswith("_coef") else MAX_TIME / (4 * MAX_COEF)
    if value > high:
        raise ValueError(f"{where}.{key} is beyond any real value (at most {high:g}), got {value!r}")
    return float(value)


def entry_options(entry: dict, where: str) -> list[LayerOption]:
    """The options of one layer entry."""
    time = _number(entry, "time", where)
    forward = _number(entry, "forward_time", where, default=time)
    if entry.get("type") in ("HEAD", "TAIL"):
        extra = [key for row in RECOMPUTE for key in row[1:4] if key in entry]
        if extra:  # the balancer never reads them there: a profile saying otherwise would be misread
            raise ValueError(f"{where}: a {entry['type']} entry has one option (forward time, backward twice "
                             f"'time', no activation memory), so {extra[0]!r} would be ignored; remove it")
        return [LayerOption(entry["type"], 0.0, forward, 2 * time)]
    options = []
    for name, mem_key, time_key, coef_key, coef in RECOMPUTE:
        if mem_key not in entry:
            orphan = next((key for key in (time_key, coef_key) if key in entry), None)
            if orphan is not None:  # an option exists only with its memory key
                raise ValueError(f"{where}: {orphan!r} is given but {mem_key!r} is not, so the {name} option "
                                 f"would not exist and {orphan!r} would be ignored; add {mem_key!r} or remove it")
            continue
        memory = _number(entry, mem_key, where) * MEGABYTE
        backward = _number(entry, time_key, where, default=0.0)
        if backward == 0.0:
            backward = (1 + _number(entry, coef_key, where, default=coef)) * 2 * time
        options.append(LayerOption(name, memory, forward, backward))
    if not options:
        raise ValueError(f"{where}: a BODY entry needs at least one memory key ({', '.join(r[1] for r in RECOMPUTE)})")
    return options


#: Every key a layer entry may carry; the entries are closed (a misspelt memory key would drop an option).
ENTRY_KEYS = ("name", "type", "model_name", "time", "forward_time", "nb_layer", "memory_parameter") + tuple(
    key for row in RECOMPUTE for key in row[1:4])


def profile_layers(data: Any, path: str) -> tuple[list, dict, dict]:
    """``(kinds, fronts, static)`` of a parsed profile: every layer's kind in
    order, each kind's options, each kind's static bytes per layer.  Kinds are
    entry names (made unique with ``#i`` when two entries share a name)."""
    entries = data.get("layers_description") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: 'layers_description' must be a non-empty list")
    kinds, fronts, static = [], {}, {}
    for i, entry in enumerate(entries):
        where = f"{path}: layers_description[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be an object")
        check_keys(entry, ENTRY_KEYS, where)
        if entry.get("type") not in TYPES:
            raise ValueError(f"{where}.type must be one of {TYPES}, got {entry.get('type')!r}")
        if "nb_layer" not in entry:
            raise ValueError(f"{where}: missing 'nb_layer' (how many consecutive layers the entry describes)")
        count = entry["nb_layer"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{where}.nb_layer must be an integer >= 0, got {count!r}")
        if len(kinds) + count > MAX_LAYERS:
            raise ValueError(f"{where}.nb_layer: the model would have more than {MAX_LAYERS:,} layers")
        name = entry.get("name", f"entry{i}")
        if not isinstance(name, str):
            raise ValueError(f"{where}.name must be a string, got {type(name).__name__}")
        kind = name if name not in fronts else f"{name}#{i}"
        fronts[kind] = entry_options(entry, where)
        static[kind] = _number(entry, "memory_parameter", where) * MEGABYTE
        kinds.extend([kind] * count)
    if not kinds:
        raise ValueError(f"{path}: layers_description: the profile has no layers (every nb_layer is 0)")
    return kinds, fronts, static


def read_profile(path: str | os.PathLike) -> tuple[list, dict, dict]:
    """:func:`profile_layers` of the profile in the file at ``path``."""
    path = os.fspath(path)
    return profile_layers(read_document(path), path)


def model_of(data: Any, path: str, capacity: Any, micro_batches: int, reserved: Any = 0.0) -> PipelineModel:
    """A :class:`PipelineModel` of a parsed profile (capacity in bytes or with a unit)."""
    kinds, fronts, static = profile_layers(data, path)
    return PipelineModel(kinds, fronts, static, parse_quantity(capacity, "bytes", "capacity"), micro_batches,
                         parse_quantity(reserved, "bytes", "reserved"))


def load(path: str | os.PathLike, capacity: Any, micro_batches: int, reserved: Any = 0.0) -> PipelineModel:
    """A :class:`PipelineModel` of a SAPP-PPB profile (capacity in bytes or with a unit)."""
    path = os.fspath(path)
    return model_of(read_document(path), path, capacity, micro_batches, reserved)
