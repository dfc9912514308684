"""Quantities with units: bytes (``MB``, ``GiB``...) and times (``ms``, ``s``...).

Memory units follow the profilers' habit: ``KB``/``MB``/``GB``/``TB`` are
binary (2**10...) like ``KiB``/``MiB``; ``kB`` is 1000 bytes.  Times are kept
in milliseconds, the profilers' unit.
"""
from __future__ import annotations

import math
import re
from typing import Any

BYTES = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "kb": 2**10, "kib": 2**10, "mb": 2**20, "mib": 2**20, "gb": 2**30, "gib": 2**30, "tb": 2**40, "tib": 2**40,
}
MILLISECONDS = {"": 1.0, "ms": 1.0, "s": 1000.0, "us": 1e-3, "µs": 1e-3, "ns": 1e-6, "min": 60000.0}
_PATTERN = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-zµ]*)\s*$")


def parse_quantity(value: Any, dimension: str, field: str) -> float:
    """A number, or a string ``"<number><unit>"``, in bytes or milliseconds."""
    table = BYTES if dimension == "bytes" else MILLISECONDS
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a number or a string with a unit, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    elif isinstance(value, str):
        m = _PATTERN.match(value)
        if not m:
            raise ValueError(f"{field}: cannot read {value!r} as a quantity (e.g. '80 GiB', '2.5 ms')")
        number, unit = float(m.group(1)), m.group(2)
    else:
        raise ValueError(f"{field}: expected a number or a string with a unit, got {type(value).__name__}")
    key = unit if unit in table else unit.lower()
    if dimension == "bytes" and unit == "kB":
        scale = 1000
    elif key in table:
        scale = table[key]
    else:
        raise ValueError(f"{field}: unknown {dimension} unit {unit!r} (known: {', '.join(k for k in table if k)})")
    result = number * scale
    if not math.isfinite(result):
        raise ValueError(f"{field}: must be finite, got {value!r}")
    return result
