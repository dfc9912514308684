"""gpuknap: batched, exact activation-recompute knapsacks for pipeline-parallel splits.

Every stage of every candidate split is a multiple-choice knapsack over its
layers' recompute options; gpuknap packs many candidates into one batch and
solves all stages with min-plus passes on NumPy or CuPy.

The package follows the data flow, one subpackage per concern, each
importing only the ones below it (docs/architecture.md):
``engine`` (stage problems, batched DP, backends) and ``schedule`` (pipeline
schedules simulated) at the bottom, then ``search`` (the pipeline model and
the exact whole-model search), ``costs`` (analytic layer options),
``formats`` (every file read or written), ``sweep`` (grids of
configurations) and ``cli`` (the command line).  The public API is here.
"""
from ._version import __version__
from .engine import (
                     MEGABYTE,
                     Assignment,
                     BackendUnavailable,
                     LayerOption,
                     Layers,
                     PipelineChoice,
                     Ranking,
                     Stage,
                     StageChoice,
                     WorkTooLarge,
                     choose,
                     cupy_available,
                     get_backend,
                     least_times,
                     pp_lite,
                     rank,
                     suffix_times,
                     work_limit,
)
from .formats import Spec, load_spec
from .search import PipelineModel, best_splits
from .sweep import Sweep, sweep

__all__ = [
    "MEGABYTE", "LayerOption", "Layers", "Assignment", "StageChoice", "Stage", "PipelineChoice",
    "choose", "least_times", "suffix_times", "pp_lite", "rank", "Ranking",
    "PipelineModel", "best_splits", "sweep", "Sweep", "load_spec", "Spec",
    "get_backend", "cupy_available", "BackendUnavailable", "work_limit", "WorkTooLarge", "__version__",
]
