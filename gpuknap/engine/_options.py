"""Layer options, layer groups and the useful-option fronts of the contract.

An *option* is one way to run a layer (keep everything, selective recompute,
full recompute, offload ...).  Anything with ``memory(k)``, ``forward_time``
and ``backward_time`` is accepted as an option; :class:`LayerOption` is the
shipped implementation.  A *front* maps a layer kind to its options.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

MEGABYTE = 2**20
#: Largest forward or backward time accepted: sums of any real number of layers stay finite.
MAX_TIME = 1e200
#: Largest byte quantity accepted in an input file (a zebibyte): products with any in-flight count stay finite.
MAX_BYTES = float(2**70)
#: Weights are clipped here: no DP row is ever this wide, so such an option never fits.
WEIGHT_CAP = 2**62


@dataclass(frozen=True)
class LayerOption:
    """One way to run a layer.

    ``memory(k) = k * per_micro_batch + held_once - excess(k)`` bytes while
    the stage holds ``k`` micro-batches in flight; ``excess`` is a tuple of
    ``(in_flight, bytes)`` corrections (0 for counts not listed).  ``parts``:
    how the forward plus backward time splits into components, as
    ``((name, time), ...)`` (``compute``, ``recompute``, ``tp``...), for reports;
    the solvers never read it.  Checked when built (ValueError naming the field): ``name`` a
    non-empty str, the bytes finite and >= 0, the times from 0 to :data:`MAX_TIME`, each
    in-flight count of ``excess`` once.
    """

    name: str
    per_micro_batch: float
    forward_time: float
    backward_time: float
    held_once: float = 0.0
    excess: tuple = ()
    parts: tuple = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"LayerOption.name must be a non-empty str, got {short(self.name)}")
        for name in ("per_micro_batch", "held_once"):
            if isinstance(getattr(self, name), bool):
                raise ValueError(f"LayerOption.{name} must be a number of bytes, got {getattr(self, name)!r}")
            if check_number(getattr(self, name), f"LayerOption.{name}") < 0:
                raise ValueError(f"LayerOption.{name} must be >= 0 bytes, got {getattr(self, name)!r}")
        for name in ("forward_time", "backward_time"):
            check_time(getattr(self, name), f"LayerOption.{name}")
        excess = self.excess
        if isinstance(excess, (str, bytes)) or not hasattr(excess, "__iter__"):
            raise ValueError(f"LayerOption.excess must be a tuple of (in_flight, bytes) pairs, got {excess!r}")
        pairs = tuple(tuple(pair) if isinstance(pair, (list, tuple)) else pair for pair in excess)
        seen: dict[int, int] = {}
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, tuple) and len(pair) == 2) or any(isinstance(x, bool) for x in pair):
                raise ValueError(f"LayerOption.excess must hold (in_flight, bytes) pairs of numbers, got {pair!r}")
            k = check_int(pair[0], f"LayerOption.excess[{i}] in_flight", 1)
            if k in seen:  # memory() would read the first and ignore this one
                raise ValueError(f"LayerOption.excess[{i}] in_flight {k} is also that of excess[{seen[k]}]; "
                                 "give each in-flight count once")
            seen[k] = i
            if not 0 <= check_number(pair[1], f"LayerOption.excess[{i}] bytes") <= MAX_BYTES:
                raise ValueError(f"LayerOption.excess[{i}] bytes must be from 0 to {MAX_BYTES:g}, got {pair[1]!r}")
        object.__setattr__(self, "excess", pairs)  # a tuple of its own: the caller's list may change
        parts = self.parts
        if isinstance(parts, (str, bytes)) or not hasattr(parts, "__iter__"):
            raise ValueError(f"LayerOption.parts must be a tuple of (name, time) pairs, got {parts!r}")
        parts = tuple(tuple(pair) if isinstance(pair, (list, tuple)) else pair for pair in parts)
        for i, pair in enumerate(parts):
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
                raise ValueError(f"LayerOption.parts must hold (name, time) pairs, got {pair!r}")
            check_number(pair[1], f"LayerOption.parts[{i}] time")
        object.__setattr__(self, "parts", parts)

    def memory(self, in_flight: int) -> float:
        """Bytes kept by one layer running this option at ``in_flight``."""
        extra = 0.0
        for count, nbytes in self.excess:
            if count == in_flight:
                extra = nbytes
                break
        return in_flight * self.per_micro_batch + self.held_once - extra

    @property
    def time(self) -> float:
        """Forward plus backward time."""
        return self.forward_time + self.backward_time


class Layers(NamedTuple):
    """``count`` layers of one ``kind`` holding ``in_flight`` micro-batches.

    Immutable like the dataclasses here, but a named tuple so that hashing and
    comparing the groups of hundreds of thousands of stages (batch dedup)
    runs at C speed.
    """

    kind: Hashable
    count: int
    in_flight: int = 1


def check_bucket(bucket: Any) -> float:
    """Validate a bucket size in bytes."""
    if isinstance(bucket, bool) or not isinstance(bucket, (int, float, np.integer, np.floating)):
        raise ValueError(f"bucket must be a positive number of bytes, got {bucket!r}")
    try:
        finite = math.isfinite(bucket)
    except OverflowError:  # an int beyond the float range
        finite = False
    if not finite or bucket <= 0:
        raise ValueError(f"bucket must be a positive finite number of bytes, got {bucket!r}")
    return bucket


def check_int(value: Any, field: str, low: int = 0) -> int:
    """An integer (not a bool) ``>= low``, else ValueError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{field} must be an integer >= {low}, got {value!r}")
    return int(value)


def plain(value: Any) -> Any:
    """A NumPy scalar as the Python ``bool``, ``int`` or ``float`` it holds (a driver's
    ``np.int64(8)`` reads as ``8``); anything else unchanged."""
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def check_number(value: Any, field: str, *, allow_inf: bool = False) -> float:
    """A real number (not NaN; finite unless ``allow_inf``), else ValueError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{field} must be a number, got {value!r}")
    try:  # a Python float: a NumPy scalar compared with a limit (1e200) would cast the limit, with a warning
        value = float(value)
    except OverflowError:
        raise ValueError(f"{field} must be finite, got an integer of {int(value).bit_length()} bits") from None
    if math.isnan(value) or (not allow_inf and math.isinf(value)):
        raise ValueError(f"{field} must be finite, got {value!r}")
    return value


def short(value: Any) -> str:
    """A value as a refusal shows it: a long one cut to its first and last characters, with its length."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} characters)"


class FrozenMap(Mapping):
    """A read-only copy of a mapping: what a frozen model or result holds, so that an edit made
    through it (``model.static[kind] = ...``) raises TypeError instead of leaving the answers
    already cached on it disagreeing with the ones computed after."""

    def __init__(self, items: Any = ()):
        self._items = dict(items)

    def __getitem__(self, key: Any) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return repr(self._items)

    def __reduce__(self) -> tuple:
        return FrozenMap, (self._items,)


def own_fronts(fronts: Any) -> Any:
    """A mapping's own read-only copy with its option lists as tuples (a caller editing its lists
    later must not change a result or a model); anything else as given, for the validators to refuse."""
    if not isinstance(fronts, Mapping):
        return fronts
    return FrozenMap((k, tuple(v) if isinstance(v, list) else v) for k, v in fronts.items())


def check_time(value: Any, field: str) -> float:
    """A time: a finite number from 0 to :data:`MAX_TIME`, else ValueError naming ``field``."""
    value = check_number(value, field)
    if not 0 <= value <= MAX_TIME:
        raise ValueError(f"{field} must be from 0 to {MAX_TIME:g}, got {value!r}")
    return value


def check_layers(group: Any, where: str) -> Layers:
    """Validate one group of layers."""
    if not isinstance(group, Layers):
        raise ValueError(f"{where} must be a Layers, got {type(group).__name__}")
    check_int(group.count, f"{where}.count", 0)
    check_int(group.in_flight, f"{where}.in_flight", 1)
    return group


@dataclass(frozen=True)
class Front:
    """The useful options of one kind at one in-flight count, in bytes and buckets.

    ``options`` run from the lightest (slowest) to the fastest; ``weights`` are
    whole buckets, ``memories`` exact bytes and ``times`` forward + backward.
    """

    kind: Hashable
    in_flight: int
    options: tuple
    memories: np.ndarray
    times: np.ndarray
    weights: np.ndarray

    @property
    def fastest(self) -> int:
        """Index of the fastest useful option (the last one)."""
        return len(self.options) - 1


def useful_options(kind: Hashable, options: Sequence[Any], in_flight: int,
                   times: list[float] | None = None) -> list[tuple[float, float, Any]]:
    """``(memory, time, option)`` of the useful options, lightest to fastest.

    Sort by ``(memory(k), time)`` and keep an option only if it is strictly
    faster than every option kept before it.  Raises ValueError for an empty
    front, NaN or negative times and negative memory.  ``times``: the options'
    forward + backward times from :func:`option_times` (checked once per kind).
    """
    if times is None:
        times = option_times(kind, options)
    rows = []
    for j, opt in enumerate(options):
        where = f"fronts[{kind!r}][{j}]"
        try:
            mem = opt.memory(in_flight)
        except AttributeError as exc:
            raise ValueError(f"{where} is not an option (needs memory(k), forward_time, backward_time)") from exc
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise ValueError(f"{where}.memory({in_flight}) failed: {exc}") from None
        check_number(mem, f"{where}.memory({in_flight})")
        if mem < 0:
            raise ValueError(f"{where}.memory({in_flight}) comes out negative ({mem!r} bytes)")
        rows.append((float(mem), times[j], j, opt))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    kept: list[tuple[float, float, Any]] = []
    for mem, time, _, opt in rows:
        if not kept or time < kept[-1][1]:
            kept.append((mem, time, opt))
    return kept


def option_times(kind: Hashable, options: Sequence[Any]) -> list[float]:
    """Each option's ``forward_time + backward_time``, validated (the same at every in-flight count)."""
    if isinstance(options, (str, bytes)) or not isinstance(options, (Sequence, np.ndarray)):
        raise ValueError(f"fronts[{kind!r}] must be a sequence of options, got {type(options).__name__}")
    if len(options) == 0:
        raise ValueError(f"fronts[{kind!r}] is empty: every kind needs at least one option")
    out = []
    for j, opt in enumerate(options):
        where = f"fronts[{kind!r}][{j}]"
        try:
            fwd, bwd = opt.forward_time, opt.backward_time
        except AttributeError as exc:
            raise ValueError(f"{where} is not an option (needs memory(k), forward_time, backward_time)") from exc
        for name, val in (("forward_time", fwd), ("backward_time", bwd)):
            value = check_number(val, f"{where}.{name}")  # a Python float: no warning comparing with MAX_TIME
            if value < 0:
                raise ValueError(f"{where}.{name} must be >= 0, got {val!r}")
            if value > MAX_TIME:
                raise ValueError(f"{where}.{name} must be at most {MAX_TIME:g}, got {val!r}")
        out.append(float(fwd) + float(bwd))
    return out


class FrontTable:
    """Caches the :class:`Front` of every ``(kind, in_flight)`` for one bucket size.

    ``relaxed=True`` rounds weights down (and :func:`._problem.verdict`
    rounds budgets up): every choice that fits in exact bytes fits the relaxed
    knapsack, so its optimum is a lower bound on the exact-bytes optimum.
    """

    def __init__(self, fronts: Mapping[Hashable, Sequence[Any]], bucket: float, relaxed: bool = False):
        if not isinstance(fronts, Mapping):
            raise ValueError(f"fronts must be a mapping from kind to options, got {type(fronts).__name__}")
        self.fronts = fronts
        self.bucket = check_bucket(bucket)
        self.relaxed = bool(relaxed)
        self._cache: dict[tuple, Front] = {}
        self._times: dict[Hashable, list[float]] = {}
        #: Verdicts of stage problems on this table, kept by :func:`._problem.verdict` (a search's
        #: rounds classify the same problems again), up to ``VERDICTS_KEPT`` of them.
        self.verdicts: dict = {}

    def get(self, kind: Hashable, in_flight: int) -> Front:
        """The front of ``kind`` at ``in_flight`` (validated on first use)."""
        key = (kind, int(in_flight))
        try:
            front = self._cache.get(key)
        except TypeError:
            raise ValueError(f"layer kind {kind!r} is not hashable") from None
        if front is None:
            try:
                options = self.fronts[kind]
            except (KeyError, TypeError):
                raise ValueError(f"kind {kind!r} is missing from fronts") from None
            times = self._times.get(kind)
            if times is None:
                times = self._times[kind] = option_times(kind, options)
            kept = useful_options(kind, options, int(in_flight), times)
            mems = np.array([m for m, _, _ in kept], dtype=np.float64)
            times = np.array([t for _, t, _ in kept], dtype=np.float64)
            weigh = buckets_down if self.relaxed else buckets_up
            weights = np.array([min(weigh(m, self.bucket), WEIGHT_CAP) for m in mems], dtype=np.int64)
            front = Front(kind, int(in_flight), tuple(o for _, _, o in kept), mems, times, weights)
            self._cache[key] = front
        return front


def _too_small(nbytes: float, bucket: float) -> ValueError:
    return ValueError(f"bucket {float(bucket):g} is too small: {float(nbytes):,.0f} bytes would be more buckets "
                      "than a float can count; give a bucket of at least 1 byte")


def buckets_up(nbytes: float, bucket: float) -> int:
    """Whole buckets an option of ``nbytes`` weighs: ``ceil(nbytes / bucket)`` (ValueError naming the
    bucket when the quotient overflows)."""
    q = -(-float(nbytes) // float(bucket))  # Python floats: an overflow is inf, without a warning
    if not math.isfinite(q):
        raise _too_small(nbytes, bucket)
    return int(q)


def buckets_down(budget: float, bucket: float, cap: int | None = None) -> int:
    """Whole buckets a budget allows: ``floor(budget / bucket)``, at most ``cap``."""
    if cap is not None and (math.isinf(budget) or budget // bucket > cap):
        return cap
    q = float(budget) // float(bucket)
    if not math.isfinite(q):
        raise _too_small(budget, bucket)
    return int(q)
