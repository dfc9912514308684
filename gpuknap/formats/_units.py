"""Quantities with units: bytes (``MB``, ``GiB``...) and times (``ms``, ``s``...).

One rule for memory, the profilers' habit: every prefix is binary.  ``KB``
and ``KiB`` are 2**10 bytes, ``MB`` and ``MiB`` 2**20, ``GB``/``GiB`` 2**30,
``TB``/``TiB`` 2**40; a plain number (or ``B``, ``byte``, ``bytes``) is
bytes.  Spellings are case-sensitive: a lower-case ``b`` is a bit (``Mb``,
``Gb``) and ``kB`` is the SI kilobyte (1000 bytes), so both are refused with
a message rather than guessed.  Times are kept in milliseconds, the
profilers' unit: ``ns``, ``us`` (or ``µs``), ``ms``, ``s``, ``min``.
"""
from __future__ import annotations

import math
import re
from typing import Any

from ..engine import short

BYTES = {
    "": 1, "B": 1, "byte": 1, "bytes": 1,
    "KB": 2**10, "KiB": 2**10, "MB": 2**20, "MiB": 2**20,
    "GB": 2**30, "GiB": 2**30, "TB": 2**40, "TiB": 2**40,
}
MILLISECONDS = {"": 1.0, "ms": 1.0, "s": 1000.0, "us": 1e-3, "µs": 1e-3, "ns": 1e-6, "min": 60000.0}
_PATTERN = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-zµ]*)\s*$")
_BYTE_UNITS = "B, KB/KiB, MB/MiB, GB/GiB, TB/TiB (all binary: 1 MB = 1 MiB = 2**20 bytes)"
_TIME_UNITS = "ns, us, ms, s, min"


def _unit_hint(unit: str, dimension: str, number: str = "") -> str:
    """Why a unit is refused, in one clause (with the spelling meant, when it is clear)."""
    if dimension != "bytes":
        return f"unknown time unit {unit!r} (known, case-sensitive: {_TIME_UNITS})"
    if len(unit) >= 2 and unit.endswith("b") and unit[-2] in "kKmMgGtT" or unit == "b":
        meant = f" (did you mean '{number}{unit[:-1].upper()}iB'?)" if len(unit) >= 2 else ""
        return f"{unit!r} is a unit of bits; memory is in bytes{meant}: {_BYTE_UNITS}"
    if unit == "kB":
        return f"'kB' is ambiguous (1000 or 1024 bytes); write KB or KiB (1024 bytes). Units: {_BYTE_UNITS}"
    if unit.lower() in {k.lower() for k in BYTES if k}:
        return f"unit {unit!r} is not spelled as gpuknap reads it (case matters); units: {_BYTE_UNITS}"
    return f"unknown memory unit {unit!r}; units: {_BYTE_UNITS}"


def parse_quantity(value: Any, dimension: str, field: str) -> float:
    """A number, or a string ``"<number><unit>"``, in bytes or milliseconds."""
    table = BYTES if dimension == "bytes" else MILLISECONDS
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a number or a string with a unit, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = value, ""
    elif isinstance(value, str):
        m = _PATTERN.match(value) if len(value) <= 100 else None
        if not m:
            shown = value if len(value) <= 40 else value[:37] + "..."
            raise ValueError(f"{field}: cannot read {shown!r} as a quantity (e.g. '80 GiB', '2.5 ms')")
        number, unit = float(m.group(1)), m.group(2)
    else:
        raise ValueError(f"{field}: expected a number or a string with a unit, got {type(value).__name__}")
    if unit not in table:
        raise ValueError(f"{field}: {_unit_hint(unit, dimension, m.group(1) if isinstance(value, str) else '')}")
    try:
        result = float(number) * table[unit]
    except OverflowError:  # an integer beyond any float
        result = math.inf
    if not math.isfinite(result):
        raise ValueError(f"{field}: must be finite, got {short(value)}")
    return result
