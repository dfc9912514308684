"""gpuknap: batched, exact activation-recompute knapsacks for pipeline-parallel splits.

Every stage of every candidate split is a multiple-choice knapsack over its
layers' recompute options; gpuknap packs many candidates into one batch and
solves all stages with min-plus passes on NumPy or CuPy.
"""
from .backend import BackendUnavailable, cupy_available, get_backend
from .limits import WorkTooLarge, work_limit
from .options import MEGABYTE, LayerOption, Layers
from .model import PipelineModel
from .ranking import Ranking, rank
from .search import best_splits
from .results import Assignment, PipelineChoice, Stage, StageChoice
from .stage import choose, least_times, pp_lite, suffix_times
from .sweep import Sweep, sweep

__all__ = [
    "MEGABYTE", "LayerOption", "Layers", "Assignment", "StageChoice", "Stage", "PipelineChoice",
    "choose", "least_times", "suffix_times", "pp_lite", "rank", "Ranking",
    "PipelineModel", "best_splits", "sweep", "Sweep",
    "get_backend", "cupy_available", "BackendUnavailable", "work_limit", "WorkTooLarge",
]
__version__ = "0.1.0"
