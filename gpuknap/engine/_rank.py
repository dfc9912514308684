"""``rank``: score many candidate splits at once, exactly as ``pp_lite`` would.

A candidate is a sequence of :class:`Stage`.  Identical stage problems are
solved once; the rest go to the batched engine as knapsacks.
"""
from __future__ import annotations

from itertools import accumulate, chain, count
from operator import attrgetter
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from ._backend import get_backend
from ._options import MEGABYTE, FrontTable, check_time, own_fronts
from ._problem import StageProblem, canonical, fronts_of
from ._results import PipelineChoice, Stage
from ._solve import check_max_bytes, solve_problems
from ._stage import Planner, check_stages
from ._work import paused_collection


#: Candidates handled at a time when a whole batch's stage times would make a large temporary.
BLOCK = 1 << 15


def compact_codes(codes: np.ndarray, distinct: int) -> np.ndarray:
    """``codes`` (values below ``distinct``) in the smallest unsigned integer type that holds them."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if distinct <= np.iinfo(dtype).max + 1:
            return codes.astype(dtype, copy=False)
    return codes.astype(np.int64, copy=False)


class Ranking:
    """Scores of a batch of candidates.

    ``slowest[i]`` is candidate i's slowest stage time (``inf`` when some stage
    has no choice); ``order`` lists candidates best first (ties by index);
    ``times(i)`` and ``choice(i)`` give the per-stage times and the full
    :class:`PipelineChoice` (rebuilt on demand with ``pp_lite``).

    Kept compactly: per stage of every candidate, a small integer code into the
    distinct stage times (``values``); the times of a candidate's stages are
    looked up on demand.  ``stages``: the candidates' stage counts as offsets
    ``[B + 1]`` into the codes, or one int when every candidate has that many.
    """

    def __init__(self, codes: np.ndarray, values: np.ndarray, stages: "int | np.ndarray", rebuild: Any):
        self._codes = codes
        self._values = np.asarray(values, dtype=np.float64)
        self._rebuild = rebuild
        if isinstance(stages, (int, np.integer)):
            self._p, self._offsets = int(stages), None
            n = len(codes) // max(int(stages), 1)
        else:
            self._p, self._offsets = None, np.asarray(stages, dtype=np.int64)
            n = len(self._offsets) - 1
        self._n = n
        self._slowest_kept = self._slowest()
        self._slowest_kept.setflags(write=False)
        self._order: np.ndarray | None = None

    @property
    def slowest(self) -> np.ndarray:
        """Each candidate's slowest stage time (``inf`` where a stage has no choice); read-only
        (a view of the ranking's own array, which cannot be made writeable)."""
        return self._slowest_kept.view()

    def _bounds(self, i: int) -> tuple[int, int]:
        if self._offsets is None:
            return i * self._p, (i + 1) * self._p
        return int(self._offsets[i]), int(self._offsets[i + 1])

    def _slowest(self) -> np.ndarray:
        """Each candidate's slowest stage, a block of candidates at a time (with codes
        numbered by time, the largest code of a candidate is its slowest stage)."""
        out = np.full(self._n, np.inf)
        by_time = bool((self._values[1:] >= self._values[:-1]).all())
        for lo in range(0, self._n, BLOCK):
            hi = min(lo + BLOCK, self._n)
            a, b = self._bounds(lo)[0], self._bounds(hi - 1)[1]
            if b <= a:
                continue
            if self._offsets is None and by_time:
                out[lo:hi] = self._values[self._codes[a:b].reshape(hi - lo, self._p).max(axis=1)]
                continue
            times = self._values[self._codes[a:b]]
            if self._offsets is None:
                out[lo:hi] = times.reshape(hi - lo, self._p).max(axis=1)
            else:
                out[lo:hi] = np.maximum.reduceat(times, self._offsets[lo:hi] - a)
        return out

    def __len__(self) -> int:
        return self._n

    @property
    def order(self) -> np.ndarray:
        """Candidate indices, best (least slowest) first; ties by index."""
        if self._order is None:
            self._order = np.argsort(self._slowest_kept, kind="stable")
            self._order.setflags(write=False)
        return self._order.view()

    def _index(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ValueError(f"candidate index must be an integer, got {i!r}")
        if not -len(self) <= i < len(self):
            raise IndexError(f"candidate index {i!r} out of range for {len(self)} candidates")
        return int(i) % len(self)

    def stage_table(self) -> np.ndarray:
        """Per-stage times of every candidate as ``[B, P]`` (candidates of P stages each;
        a stage without a choice is ``inf``)."""
        if self._offsets is not None:
            sizes = np.diff(self._offsets)
            if len(sizes) and (sizes != sizes[0]).any():
                raise ValueError("stage_table needs candidates with the same number of stages")
        if not len(self):
            return np.empty((0, self._p or 0))
        return self._values[self._codes].reshape(len(self), -1)

    def times(self, i: int) -> list[float] | None:
        """Per-stage times of candidate ``i`` (fixed time included), or None."""
        i = self._index(i)
        if np.isinf(self._slowest_kept[i]):
            return None
        a, b = self._bounds(i)
        return self._values[self._codes[a:b]].tolist()

    def choice(self, i: int) -> PipelineChoice | None:
        """The :class:`PipelineChoice` of candidate ``i`` (equal to ``pp_lite``), or None."""
        i = self._index(i)
        if np.isinf(self._slowest_kept[i]):
            return None
        return self._rebuild(i)


_KEY = attrgetter("groups", "budget", "fixed_time")


def _where(offsets: Sequence[int], i: int) -> str:
    c = int(np.searchsorted(offsets, i, side="right")) - 1
    return f"candidates[{c}][{i - offsets[c]}]"


def _hashable(stage: Stage) -> bool:
    try:
        hash(_KEY(stage))
        return True
    except TypeError:
        return False


#: Stages sampled to decide whether candidates share Stage objects (PipelineModel.stages reuses them).
_SAMPLE = 2048


def _flatten(candidates: list) -> tuple[list, list[int], np.ndarray]:
    """All stages in one list, each candidate's offset into it, and per stage the
    index of its object among the distinct objects (validated)."""
    if not (set(map(type, candidates)) <= {list, tuple} and all(candidates)):
        for c, stages in enumerate(candidates):  # slow path: find what is wrong, or accept
            candidates[c] = check_stages(stages, f"candidates[{c}]")
    flat = list(chain.from_iterable(candidates))
    sample = flat[:_SAMPLE]
    if len(set(map(id, sample))) * 100 <= len(sample) * 99:  # objects reused: work on each object once
        ids: dict[int, int] = {}
        objects = np.fromiter(map(ids.setdefault, map(id, flat), count()), dtype=np.int64, count=len(flat))
        firsts = np.fromiter(ids.values(), dtype=np.int64, count=len(ids))
        distinct = [flat[i] for i in firsts.tolist()]
        dense = np.zeros(len(flat), dtype=np.int64)
        dense[firsts] = np.arange(len(firsts))
        objects = dense[objects]
    else:
        distinct, objects = flat, np.arange(len(flat))
    if set(map(type, distinct)) - {Stage}:
        for c, stages in enumerate(candidates):
            check_stages(stages, f"candidates[{c}]")
    return distinct, [0, *accumulate(map(len, candidates))], objects


def _dedup(flat: list, offsets: list, table: FrontTable, where: Any) -> tuple:
    """Per stage its key id; the distinct validated problems; per key its problem
    id and fixed time.  A key is ``(groups, budget, fixed_time)``; ``where(i)``
    maps a position in ``flat`` to a position among all the candidates' stages."""
    index: dict[tuple, int] = {}
    try:  # one hash per stage; a key's id is its first stage, made dense below
        first = np.fromiter(map(index.setdefault, map(_KEY, flat), count()), dtype=np.int64, count=len(flat))
    except TypeError:
        at = next(i for i, s in enumerate(flat) if not _hashable(s))
        raise ValueError(f"{_where(offsets, where(at))} has an unhashable layer kind or budget") from None
    dense = np.zeros(len(flat), dtype=np.int64)
    dense[np.fromiter(index.values(), dtype=np.int64, count=len(index))] = np.arange(len(index))
    problem_ids: dict[StageProblem, int] = {}
    key_problem, key_fixed = [], []
    for (groups, budget, fixed), at in index.items():
        try:
            key_fixed.append(float(check_time(fixed, "fixed_time")))
            problem = canonical(groups, budget)
            fronts_of(problem, table)
        except ValueError as exc:
            raise ValueError(f"{_where(offsets, where(at))}: {exc}") from None
        key_problem.append(problem_ids.setdefault(problem, len(problem_ids)))
    return dense[first], list(problem_ids), np.asarray(key_problem, dtype=np.int64), np.asarray(key_fixed)


def rank(candidates: Sequence[Sequence[Stage]], fronts: Mapping[Hashable, Sequence[Any]],
         bucket: float = MEGABYTE, backend: str | None = "auto", max_bytes: int | None = None) -> Ranking:
    """Score every candidate exactly as ``pp_lite`` would, in one batch."""
    fronts = own_fronts(fronts)  # the ranking's choices must not follow later edits
    table = FrontTable(fronts, bucket)
    if max_bytes is not None:
        check_max_bytes(max_bytes)
    get_backend(backend)  # fail early on a bad or unavailable backend
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
        raise ValueError(f"candidates must be a sequence of candidates, got {type(candidates).__name__}")
    candidates = list(candidates)
    with paused_collection():
        distinct, offsets, objects = _flatten(candidates)
        where = lambda i: int(np.argmax(objects == i))  # noqa: E731 - only for error messages
        stage_keys, problems, key_problem, key_fixed = _dedup(distinct, offsets, table, where)
    values = solve_problems(problems, table, backend, max_bytes)
    key_times = values[key_problem] + key_fixed
    order = np.argsort(key_times, kind="stable")  # codes numbered by time
    rank_of = np.empty(len(order), dtype=np.int64)
    rank_of[order] = np.arange(len(order))
    codes = compact_codes(rank_of[stage_keys][objects], len(key_times))
    key_times = key_times[order]
    plan = Planner(fronts, bucket)  # choices of many candidates share their stages
    starts = np.asarray(offsets, dtype=np.int64)
    held = compact_codes(objects, len(distinct))  # the stage objects as ranked, not the caller's lists

    def rebuild(i: int) -> Any:
        return plan([distinct[j] for j in held[starts[i]:starts[i + 1]].tolist()])

    return Ranking(codes, key_times, starts, rebuild)
