"""Inputs and results of the stage and pipeline solvers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._options import Layers


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: its layer ``groups``, memory ``budget`` in bytes,
    and a ``fixed_time`` added to its solved time (communication, say)."""

    groups: tuple
    budget: float
    fixed_time: float = 0.0

    def __post_init__(self):
        if isinstance(self.groups, (str, bytes)) or not hasattr(self.groups, "__iter__"):
            raise ValueError(f"Stage.groups must be a sequence of Layers, got {type(self.groups).__name__}")
        object.__setattr__(self, "groups", tuple(self.groups))
        # bools equal the numbers 0 and 1, so a batch's dedup could take one for a valid stage it
        # already checked: they are refused here, whatever other candidates hold
        if bool in (type(self.budget), type(self.fixed_time)):
            raise ValueError(f"Stage.{'budget' if type(self.budget) is bool else 'fixed_time'} must be a number, "
                             f"got a bool")
        for g in self.groups:
            if type(g) is Layers and (type(g.count) is bool or type(g.in_flight) is bool):
                at = next(i for i, h in enumerate(self.groups) if h is g)
                raise ValueError(f"Stage.groups[{at}]: count and in_flight must be integers, got {g!r}")


@dataclass(frozen=True)
class Assignment:
    """``count`` layers of the group ``layers`` run ``option``."""

    layers: Layers
    option: Any
    count: int


@dataclass(frozen=True)
class StageChoice:
    """The options chosen for one stage.

    ``assignments`` per group (zero counts omitted, slower options first);
    ``memory`` the exact bytes kept; ``time`` the total time of the layers;
    ``lower_bound`` (when asked for) a lower bound on the least time any
    choice fitting the budget in exact bytes could reach.
    """

    assignments: tuple
    memory: float
    time: float
    lower_bound: float | None = None


@dataclass(frozen=True)
class PipelineChoice:
    """The choice of every stage and every stage's time (fixed time included)."""

    stages: tuple
    times: tuple

    def __post_init__(self):
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "times", tuple(self.times))

    @property
    def slowest(self) -> float:
        """The slowest stage's time: the pipeline's score."""
        return max(self.times)
