"""Devices and clusters: what one accelerator computes and moves per second, and how they are wired.

Every number of a preset comes from its vendor's published specifications
(docs/costs.md, "Devices", lists each with its source).  Peak FLOP/s are
dense 16-bit tensor-core rates (no sparsity).  Bandwidths are per device and
per direction, in bytes per second: ``intra_bandwidth`` over the node's
GPU-to-GPU links (NVLink, HCCS), ``inter_bandwidth`` over the network to
other nodes (InfiniBand, RoCE; one NIC per device as in DGX-style nodes).

Three shares turn peaks into what runs: ``efficiency`` (the matrix math's
share of peak FLOP/s: one number per preset, chosen as docs/costs.md says),
``memory_efficiency`` (what streaming kernels reach of the HBM bandwidth)
and ``link_efficiency`` (what NCCL collectives reach of a link's bandwidth).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from ..engine import plain, short

GB = 1e9
GIB = 2**30

#: The share of peak FLOP/s the matrix math of a training step reaches, for every preset unless
#: overridden: chosen once against Korthikanti et al. 2022, Table 5 (docs/costs.md, "Validation").
DEFAULT_EFFICIENCY = 0.73
#: Share of HBM bandwidth a streaming kernel reaches (STREAM-like copies on A100/H100 reach 85-92%).
DEFAULT_MEMORY_EFFICIENCY = 0.9
#: Share of a link's bandwidth NCCL's ring collectives reach (nccl-tests bus bandwidth, 8-GPU nodes).
DEFAULT_LINK_EFFICIENCY = 0.8


def plain_fields(obj: Any) -> None:
    """Replace a frozen dataclass's NumPy scalar fields by :func:`plain` ones, before they are checked."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if plain(value) is not value:
            object.__setattr__(obj, f.name, plain(value))


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond any float
        return False


#: Rates of a device (FLOP/s, bytes/s): below :data:`LEAST_RATE` no device's, and layer times overflow.
RATES = ("peak_flops", "memory_bandwidth", "intra_bandwidth", "inter_bandwidth")
LEAST_RATE, LEAST_EFFICIENCY = 1e3, 1e-3


@dataclass(frozen=True)
class Device:
    """One accelerator and its node (see the module docstring for units and meaning)."""

    name: str
    peak_flops: float
    memory: float
    memory_bandwidth: float
    intra_bandwidth: float
    inter_bandwidth: float
    gpus_per_node: int = 8
    intra_latency: float = 5e-6
    inter_latency: float = 10e-6
    efficiency: float = DEFAULT_EFFICIENCY
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY
    link_efficiency: float = DEFAULT_LINK_EFFICIENCY

    def __post_init__(self):
        plain_fields(self)
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"device.name must be a non-empty string, got {self.name!r}")
        for f in fields(self):
            if f.name == "name":
                continue
            value = getattr(self, f.name)
            if f.name == "gpus_per_node":
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
                    raise ValueError(f"device.gpus_per_node must be an integer from 1 to 4096, got {short(value)}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
                raise ValueError(f"device.{f.name} must be a finite number, got {short(value)}")
            if value < 0 or (value == 0 and not f.name.endswith("latency")):
                raise ValueError(f"device.{f.name} must be > 0, got {value!r}")
            if f.name.endswith("efficiency") and not LEAST_EFFICIENCY <= value <= 1:
                raise ValueError(f"device.{f.name} must be from {LEAST_EFFICIENCY:g} to 1, got {value!r}")
            if f.name in RATES and value < LEAST_RATE:  # times of any layer would overflow to inf
                raise ValueError(f"device.{f.name} must be at least {LEAST_RATE:g} per second, got {value!r}")
            if f.name.endswith("latency") and value > 1:
                raise ValueError(f"device.{f.name} must be at most 1 second, got {value!r}")

    def matmul_seconds(self, flops: float) -> float:
        """Time of ``flops`` of matrix math at the device's efficiency."""
        return flops / (self.peak_flops * self.efficiency)

    def memory_seconds(self, nbytes: float) -> float:
        """Time to stream ``nbytes`` through HBM (memory-bound kernels)."""
        return nbytes / (self.memory_bandwidth * self.memory_efficiency)


#: Presets: dense BF16/FP16 peak, HBM, per-direction link bandwidths (sources in docs/costs.md).
DEVICES: Mapping[str, Device] = {
    "a100-40gb": Device("a100-40gb", 312e12, 40 * GIB, 1555 * GB, 300 * GB, 25 * GB),
    "a100-80gb": Device("a100-80gb", 312e12, 80 * GIB, 2039 * GB, 300 * GB, 25 * GB),
    "h100": Device("h100", 989e12, 80 * GIB, 3350 * GB, 450 * GB, 50 * GB),
    "h200": Device("h200", 989e12, 141 * GB, 4800 * GB, 450 * GB, 50 * GB),
    "b200": Device("b200", 2250e12, 180 * GB, 8000 * GB, 900 * GB, 50 * GB),
    "910b": Device("910b", 313e12, 64 * GIB, 1600 * GB, 196 * GB, 25 * GB),
}
#: Other names users write for the presets.
ALIASES = {"a100": "a100-80gb", "a100-80g": "a100-80gb", "a100-40g": "a100-40gb", "h100-80gb": "h100",
           "h100-sxm": "h100", "h200-141gb": "h200", "ascend-910b": "910b", "ascend910b": "910b"}
#: The device models assume when none is given (the analytic models' historical H100 peak).
DEFAULT_DEVICE = "h100"


def device(spec: Any = None, **overrides: Any) -> Device:
    """A :class:`Device`: a preset name (or alias), a Device, or None (the default preset), with any
    field overridden (``device("h100", gpus_per_node=4, efficiency=0.6)``)."""
    if spec is None:
        spec = DEFAULT_DEVICE
    if isinstance(spec, Device):
        base = spec
    elif isinstance(spec, str):
        key = ALIASES.get(spec.strip().lower(), spec.strip().lower())
        if key not in DEVICES:
            from difflib import get_close_matches
            near = get_close_matches(key, list(DEVICES) + list(ALIASES), n=1, cutoff=0.5)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(f"device: unknown device {spec!r}{hint}; presets: {', '.join(DEVICES)}")
        base = DEVICES[key]
    else:
        raise ValueError(f"device must be a preset name or a Device, got {type(spec).__name__}")
    known = {f.name for f in fields(Device)} - {"name"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"device: unknown field {unknown[0]!r}; known: {', '.join(sorted(known))}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **overrides) if overrides else base
