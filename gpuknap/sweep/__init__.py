"""The sweep: which parallel configuration? Every configuration of a grid on a cluster, searched.

Owns the grid (configurations, validity rules, skip reasons), where each
configuration's model comes from (a spec, a Hugging Face config, a callable),
running every configuration's certified search in lockstep with one solve per
round, a sweep's time estimated on a pilot of its configurations before the
rest run, certified pruning across configurations (the N best rows without
searching the rest), the rows (simulated iteration time, throughput, memory) and their
order, and sharding over a Dask cluster.  It builds on the search, the costs
and the formats; only the command line sits above it.
"""
from ._explain import infeasible_reason, order_rows
from ._framework import FRAMEWORKS, check_framework
from ._grid import CONFIG_KEYS, GRID_KEYS, MAX_CONFIGS, MAX_CONFIGS_TOP, Sweep, expand
from ._pace import DEFAULT_MAX_SECONDS, PILOT, pilot_plan
from ._prune import lower_bounds, span_bound
from ._run import SCORES, run_configs
from ._sources import HuggingFaceBuilder, TransformerBuilder, builder_of
from ._sweep import MAX_TOP_ROWS, sweep

__all__ = ["infeasible_reason", "order_rows", "FRAMEWORKS", "check_framework", "CONFIG_KEYS", "GRID_KEYS", "MAX_CONFIGS", "MAX_CONFIGS_TOP", "Sweep", "expand",
           "lower_bounds", "span_bound", "SCORES", "run_configs", "HuggingFaceBuilder", "TransformerBuilder",
           "builder_of", "MAX_TOP_ROWS", "sweep", "DEFAULT_MAX_SECONDS", "PILOT", "pilot_plan"]
