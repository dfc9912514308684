"""What every reader shares: the loaded :class:`Spec`, field access that names the file and the
field in every error, and the keyword arguments that override a file, checked once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..costs import DISPATCHERS
from ..costs import device as costs_device
from ..engine import MAX_BYTES, MAX_TIME, short
from ..search import MAX_IN_FLIGHT, MAX_LAYERS, PipelineModel
from ._documents import check_keys
from ._units import parse_quantity


@dataclass(frozen=True)
class Spec:
    """A loaded spec: the model plus the pipeline settings to search with.

    ``model``: the :class:`~gpuknap.PipelineModel` (layers, options, memory).
    ``stages``: pipeline stages to split into (None when neither the file nor
    the caller said; at most the model's layers).  ``chunks``: model chunks per
    stage (interleaved pipeline; 1 for plain 1F1B).  ``in_flight``: micro-batches
    each stage keeps, ``[stage][chunk]``, or None for the schedule's own counts.
    ``bucket``: the DP's memory bucket in bytes.  ``source``: the path read.
    ``name``: the model's name (the file's, else its file name).  ``kind``:
    ``"spec"``, ``"profile"`` (SAPP-PPB) or ``"config"`` (Hugging Face).
    ``bucket_field``: ``"PATH: bucket"`` when the file set the bucket (refusals
    that suggest another one name it), else ``""``.  ``notes``: what the input
    says that the plan does not follow (a Hugging Face config's quantized
    weights, say), for the user to read.
    """

    model: PipelineModel
    stages: int | None
    chunks: int
    in_flight: tuple | None
    bucket: float
    source: str
    name: str
    kind: str = "spec"
    bucket_field: str = ""
    notes: tuple = ()


class Fields:
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
            raise self.fail(field, f"expected an integer >= {low}, got {short(value)}")
        if high is not None and value > high:
            raise self.fail(field, f"expected an integer <= {high:,}, got {short(value)}")
        return value

    def quantity(self, value: Any, field: str, dimension: str, *, positive: bool = False) -> float:
        try:
            number = parse_quantity(value, dimension, field)
        except ValueError as exc:
            raise ValueError(f"{self.path}: {exc}") from None
        if number < 0 or (positive and number == 0):
            raise self.fail(field, f"expected a {'positive' if positive else 'non-negative'} {dimension} value, "
                                   f"got {short(value)}")
        high = MAX_BYTES if dimension == "bytes" else MAX_TIME
        if number > high:
            raise self.fail(field, f"{short(value)} is beyond any real {dimension} value (at most {high:g})")
        return number

    def text(self, value: Any, field: str) -> str:
        if not isinstance(value, str):
            raise self.fail(field, f"expected a string, got {type(value).__name__}")
        return value


def _override(value: Any, name: str, check) -> Any:
    """A keyword override, validated and blamed on the keyword (not the file)."""
    try:
        return check(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {str(exc).split(': ', 2)[-1]}") from None


#: How an analytic model (a Hugging Face config, a spec's transformer section) is trained:
#: keyword -> (command-line flag, low, high); booleans, devices and recompute apart.
TRAINING = {"seq": ("--seq", 1, 10**7), "micro_batch": ("--micro-batch-size", 1, 10**6),
            "tensor_parallel": ("--tp", 1, 4096), "expert_parallel": ("--ep", 1, 4096),
            "expert_tensor_parallel": ("--etp", 1, 4096), "context_parallel": ("--cp", 1, 4096),
            "data_parallel": ("--dp", 1, 10**6), "pipeline_parallel": ("--stages", 1, 10**6)}
#: Keywords about the device: keyword -> command-line flag.
DEVICE = {"device": "--device", "gpus_per_node": "--gpus-per-node", "efficiency": "--efficiency",
          "device_fields": "--device-field"}
#: Keywords for a run as it was run: every decoder layer's option.
RECOMPUTE = ("none", "selective", "full", "moe_act", "selective+moe_act")
BOOLEANS = ("sequence_parallel", "tp_comm_overlap", "flash_attention")


def _training(training: dict, arg: Fields) -> dict:
    """Validated training and device keywords (None values dropped), blamed on the keyword and its flag."""
    out = {}
    for name, value in training.items():
        if value is None:
            continue
        if name in BOOLEANS:
            if not isinstance(value, bool):
                raise ValueError(f"{name}: expected true or false, got {value!r}")
        elif name in TRAINING:
            flag, low, high = TRAINING[name]
            value = _override(value, f"{name} ({flag})", lambda v: arg.integer(v, name, low, high))
        elif name == "device":
            try:
                value = costs_device(value)
            except ValueError as exc:
                raise ValueError(f"device (--device): {str(exc).split(': ', 1)[-1]}") from None
        elif name == "gpus_per_node":
            value = _override(value, "gpus_per_node (--gpus-per-node)", lambda v: arg.integer(v, name, 1, 4096))
        elif name == "efficiency":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"efficiency (--efficiency): expected a number in (0, 1], got {value!r}")
        elif name == "device_fields":
            if not isinstance(value, Mapping):
                raise ValueError(f"device_fields (--device-field): expected a mapping of field to value, got {value!r}")
            try:
                costs_device(None, **value)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"device_fields (--device-field): {str(exc).split(': ', 1)[-1]}") from None
        elif name == "window":  # the attention window a framework's settings run (0: the whole sequence)
            value = _override(value, "window", lambda v: arg.integer(v, name, 0, 10**7))
        elif name == "recompute":
            if value not in RECOMPUTE:
                raise ValueError(f"recompute (--recompute): expected one of {', '.join(RECOMPUTE)}, got {value!r}")
        elif name == "dispatcher":
            if value not in DISPATCHERS:
                raise ValueError(f"dispatcher (--dispatcher): expected one of {', '.join(DISPATCHERS)}, got {value!r}")
        else:
            known = sorted(TRAINING) + sorted(DEVICE) + ["dispatcher", "recompute", "window", *BOOLEANS]
            raise ValueError(f"unknown keyword {name!r}; known: {', '.join(known)}")
        out[name] = value
    return out


def device_of(training: dict) -> Any:
    """The :class:`gpuknap.costs.Device` the keywords describe (the default preset when none)."""
    fields_ = dict(training.get("device_fields") or {})
    for key in ("gpus_per_node", "efficiency"):
        if training.get(key) is not None:
            fields_[key] = training[key]
    return costs_device(training.get("device"), **fields_)


def default_reserved(capacity: float) -> float:
    """Bytes reserved on a device when nobody says (docs/costs.md, "Memory"): the CUDA context and
    library workspaces, NCCL's buffers and the caching allocator's fragmentation, taken as 2 GiB
    plus 5 % of the capacity (6 GiB of an 80 GiB device)."""
    return min(2 * 2**30 + 0.05 * capacity, 0.5 * capacity)


def check_arguments(capacity: Any, micro_batches: Any, stages: Any, bucket: Any, reserved: Any,
                    training: dict) -> tuple:
    """The keyword overrides of a reader, validated and blamed on the keyword:
    ``(capacity, micro_batches, stages, bucket, reserved, training)`` (None where not given)."""
    arg = Fields("(argument)")
    if capacity is not None:
        capacity = _override(capacity, "capacity", lambda v: arg.quantity(v, "capacity", "bytes", positive=True))
    if reserved is not None:
        reserved = _override(reserved, "reserved", lambda v: arg.quantity(v, "reserved", "bytes"))
    if bucket is not None:
        bucket = _override(bucket, "bucket", lambda v: arg.quantity(v, "bucket", "bytes", positive=True))
    if micro_batches is not None:
        micro_batches = _override(micro_batches, "micro_batches",
                                  lambda v: arg.integer(v, "micro_batches", 1, MAX_IN_FLIGHT))
    if stages is not None:
        stages = _override(stages, "stages", lambda v: arg.integer(v, "stages", 1, MAX_LAYERS))
    return capacity, micro_batches, stages, bucket, reserved, _training(training, arg)
