"""The engine: stage problems and their exact bucketed DP, one stage or a whole batch.

Owns what a stage is (:class:`LayerOption`, :class:`Layers`, :class:`Stage`,
the useful-option fronts and the canonical :class:`StageProblem`), the
single-stage solvers (``choose``, ``least_times``, ``suffix_times``,
``pp_lite``), the batched engine (dedup, trie chunks under a memory limit,
min-plus passes on the array backend, ``rank`` of candidate stage lists),
the backends (NumPy, CuPy and its CUDA kernel) and the work limit and
progress hook every long call goes through.  It imports nothing else of
gpuknap: everything above (search, schedule, costs, formats, sweep, cli)
builds on it.
"""
from ._backend import (BACKENDS, Backend, BackendUnavailable, available_host_bytes, cupy_available, get_backend,
                       numba_available)
from ._options import (
                       MAX_BYTES,
                       MAX_TIME,
                       MEGABYTE,
                       Front,
                       FrontTable,
                       FrozenMap,
                       LayerOption,
                       Layers,
                       buckets_down,
                       buckets_up,
                       check_bucket,
                       check_int,
                       check_number,
                       option_times,
                       own_fronts,
                       plain,
                       short,
)
from ._problem import (
                       FASTEST,
                       INFEASIBLE,
                       KNAPSACK,
                       StageProblem,
                       Verdict,
                       canonical,
                       check_groups,
                       kept_bytes,
                       verdict,
)
from ._rank import Ranking, compact_codes, rank
from ._results import Assignment, PipelineChoice, Stage, StageChoice
from ._solve import Solved, check_max_bytes, solve_knapsacks, solve_problems
from ._stage import Planner, check_stages, choose, least_times, pp_lite, suffix_times
from ._stagelimits import single_stage_memory
from ._work import (
                       DEFAULT_MAX_CELLS,
                       MAX_TOP,
                       WorkTooLarge,
                       check_work,
                       command_budget,
                       counting,
                       format_bytes,
                       format_seconds,
                       listening,
                       max_cells,
                       paused_collection,
                       report,
                       reporting,
                       work_limit,
)

__all__ = [
    "BACKENDS", "available_host_bytes", "Backend", "BackendUnavailable", "cupy_available", "get_backend",
    "numba_available",
    "MAX_BYTES", "MAX_TIME", "MEGABYTE", "Front", "FrontTable", "LayerOption", "Layers", "buckets_down",
    "FrozenMap", "buckets_up", "check_bucket", "check_groups", "check_int", "check_number", "option_times", "plain",
    "own_fronts", "short",
    "FASTEST", "INFEASIBLE", "KNAPSACK", "StageProblem", "Verdict", "canonical", "kept_bytes", "verdict",
    "Ranking", "compact_codes", "rank", "Assignment", "PipelineChoice", "Stage", "StageChoice",
    "Solved", "check_max_bytes", "solve_knapsacks", "solve_problems",
    "Planner", "check_stages", "choose", "least_times", "pp_lite", "single_stage_memory", "suffix_times",
    "DEFAULT_MAX_CELLS", "MAX_TOP", "WorkTooLarge", "check_work", "command_budget", "counting", "format_bytes",
    "format_seconds", "listening", "max_cells", "paused_collection", "report", "reporting", "work_limit",
]
