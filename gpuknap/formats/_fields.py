"""What every reader shares: the loaded :class:`Spec`, field access that names the file and the
field in every error, and the keyword arguments that override a file, checked once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..engine import MAX_BYTES, MAX_TIME
from ..search import MAX_IN_FLIGHT, MAX_LAYERS, PipelineModel
from ._documents import check_keys
from ._units import parse_quantity


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


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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


def _training(training: dict, arg: Fields) -> dict:
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
