"""A sweep of every row: its time estimated before the whole grid runs, and its progress over
the whole sweep.

A configuration's search can take a few milliseconds or several seconds (few stages with
many chunks and wide memory budgets pose hundreds of thousands of stage problems), so a
sweep's time cannot be read off its grid.  It is measured instead: a grid of more than
``2 * PILOT`` configurations and a time limit first runs a *pilot* of :data:`PILOT` configurations drawn
from each group of like ones (:func:`pilot_plan`), a group at a time.  Each group's time
per configuration, times the group's size, summed, is the estimate; over ``max_seconds``
the sweep is refused then, before the rest runs (or as soon as the groups timed so far
add up to more), with the estimate and what to change.
Accepted, the pilot's rows are kept: a configuration's rows are those of its search
alone, whatever batch it runs in.

Progress is one phase, ``configurations``: configurations done of the grid's total,
counted across batches (a batch's own count, its ``searches`` phase, added to those of
the batches before).  The engine's other reports inside a batch (DP passes, shards) are
passed on as that phase's line, so the line stays alive through a long batch; the
command line shows this phase's time left.
"""
from __future__ import annotations

import math
import numbers
import random
import time
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator

from ..engine import format_seconds, listening, reporting
from ._run import SEARCHES

#: Configurations the pilot runs (when the grid has more than twice as many).
PILOT = 48
#: The time a sweep of every row may take, by its pilot's estimate (``max_seconds``, ``--max-time``).
DEFAULT_MAX_SECONDS = 3600.0
PHASE = "configurations"


def pilot_plan(configs: list, pilot: int = PILOT) -> list[tuple[list[int], int]]:
    """The pilot of ``configs``: ``[(indices, stratum size)]``, one entry per stratum, ``pilot``
    indices in all (none when there are at most ``2 * pilot`` configurations).  The strata are
    the configurations of one (stages, interleave, micro-batch size), the main drivers of a
    search's time; when there are more of them than ``pilot``, of one (stages, interleave),
    then of one interleave, then one stratum.  Every stratum gets one, the rest go by size
    (largest remainders); within a stratum they are drawn at random with a fixed seed (a
    stride through the grid aliases with its inner keys)."""
    n = len(configs)
    if n <= 2 * pilot:
        return []
    for key in (("stages", "interleave", "micro_batch_size"), ("stages", "interleave"), ("interleave",), ()):
        strata: dict = {}
        for i, c in enumerate(configs):
            strata.setdefault(tuple(c.get(k) for k in key), []).append(i)
        if len(strata) <= pilot:
            break
    spare = pilot - len(strata)
    share = {k: spare * len(v) / n for k, v in strata.items()}
    take = {k: 1 + min(int(share[k]), len(v) - 1) for k, v in strata.items()}
    for k in sorted(strata, key=lambda k: int(share[k]) - share[k])[:pilot - sum(take.values())]:
        take[k] += take[k] < len(strata[k])
    rng = random.Random(0)
    return [(sorted(rng.sample(v, take[k])), len(v)) for k, v in strata.items()]


def check_max_seconds(value: object) -> float | None:
    """``max_seconds`` checked: None (no limit) or a positive number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise ValueError(f"max_seconds must be a positive number of seconds, got {value!r}")
    return float(value)


class Progress:
    """The sweep's one progress phase: :meth:`part` runs a batch whose inner reports are passed
    on as ``configurations`` done (before the batch, plus the batch's own ``searches``) of ``total``."""

    def __init__(self, total: int):
        self.total, self.done, self.shown, self.outer = total, 0, 0, listening()

    def send(self, done: int) -> None:
        """Report ``done`` configurations, never fewer than reported before (a batch's searches
        are done before its local searches and simulations)."""
        self.shown = max(self.shown, min(done, self.total))
        if self.outer is not None:
            self.outer(PHASE, self.shown, self.total)

    @contextmanager
    def part(self, size: int) -> Iterator[None]:
        before = self.done

        def inner(stage: str, done: int, total: int) -> None:
            self.send(before + min(done, size) if stage == SEARCHES else self.shown)

        with reporting(inner):
            yield
        self.done = before + size
        self.send(self.done)


def in_batches(chunk: list, step: int, run: Callable[[list], tuple[list, list]],
               progress: Progress | None = None) -> tuple[list, list]:
    """``run(part) -> (rows, skipped)`` over ``chunk`` ``step`` configurations at a time (each
    batch's jobs, models and plans freed before the next), each batch a part of ``progress``."""
    rows: list = []
    skipped: list = []
    for lo in range(0, len(chunk), step):
        part = chunk[lo:lo + step]
        with progress.part(len(part)) if progress is not None else nullcontext():
            got = run(part)
        rows += got[0]
        skipped += got[1]
    return rows, skipped


def paced(configs: list, run: Callable[[list], tuple[list, list]], step: int,
          max_seconds: float | None) -> tuple[list, list]:
    """:func:`in_batches` over every configuration, the pilot first (see the module docstring),
    a stratum at a time: ``(rows, skipped)`` of all of them.  A pilot's estimate over
    ``max_seconds`` is a ValueError saying the estimate and what to change.  Without a limit
    (``max_seconds`` None) no pilot runs: the configurations run in grid order, batches
    sharing more than the pilot's groups do."""
    plan = pilot_plan(configs, PILOT) if max_seconds is not None else []  # no limit: nothing to estimate
    progress = Progress(len(configs))
    progress.send(0)
    rows: list = []
    skipped: list = []
    estimate = spent = 0.0
    timed = 0
    for g, (indices, size) in enumerate(plan, 1):
        start = time.perf_counter()
        got = in_batches([configs[i] for i in indices], step, run, progress)
        took = time.perf_counter() - start
        rows, skipped, spent, timed = rows + got[0], skipped + got[1], spent + took, timed + len(indices)
        estimate += took * size / len(indices)
        if max_seconds is not None and estimate > max_seconds:  # (the groups left only add to it)
            raise ValueError(
                f"this sweep of every row would take {'about' if g == len(plan) else 'over'} "
                f"{format_seconds(estimate)} here ({estimate:.0f} s): {len(configs):,} configurations, timed on "
                f"{timed} of them drawn from {g} of its {len(plan)} groups of like ones ({spent:.1f} s), over the "
                f"limit of {max_seconds:g} s; narrow the grid, ask for the best rows only (--top N), or allow it "
                f"(--max-time {math.ceil(estimate * 1.5)}, max_seconds={math.ceil(estimate * 1.5)})")
    done = {i for indices, _ in plan for i in indices}
    more, bad = in_batches([c for i, c in enumerate(configs) if i not in done], step, run, progress)
    return rows + more, skipped + bad


def check_pace(left: int, top: int, searched: int, spent: float, max_seconds: float) -> None:
    """Refuse (ValueError) a sweep of the ``top`` best rows whose ``searched`` configurations took
    ``spent`` seconds and whose ``left`` configurations still within reach of the ``top``-th best
    row so far (it only falls, so these are all it can still search) would take it over
    ``max_seconds`` at the time per search so far: an estimate from above in the count, not in
    the time per search."""
    estimate = spent + spent / searched * left
    if estimate <= max_seconds:
        return
    allow, shown = math.ceil(estimate * 1.5), format_seconds(estimate)
    raise ValueError(
        f"the best {top} rows of this sweep could take up to about {shown} here"
        f"{'' if shown == f'{estimate:.0f} s' else f' ({estimate:.0f} s)'}: {searched:,} configurations searched in {spent:.1f} s and up to {left:,} more "
        f"within reach of the {top}-th best row so far, over the limit of {max_seconds:g} s; narrow the grid, "
        f"ask for fewer rows, or allow it (--max-time {allow}, max_seconds={allow})")
