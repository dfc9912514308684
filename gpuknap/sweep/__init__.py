"""The sweep: which parallel configuration? Every configuration of a grid on a cluster, searched.

Owns the grid (configurations, validity rules, skip reasons), where each
configuration's model comes from (a spec, a Hugging Face config, a callable),
running every configuration's certified search in lockstep with one solve per
round, the rows (simulated iteration time, throughput, memory) and their
order, and sharding over a Dask cluster.  It builds on the search, the costs
and the formats; only the command line sits above it.
"""
from ._grid import GRID_KEYS, MAX_CONFIGS, Sweep, expand
from ._run import SCORES, order_rows, run_configs
from ._sources import HuggingFaceBuilder, TransformerBuilder, builder_of
from ._sweep import sweep

__all__ = ["GRID_KEYS", "MAX_CONFIGS", "Sweep", "expand", "SCORES", "order_rows", "run_configs",
           "HuggingFaceBuilder", "TransformerBuilder", "builder_of", "sweep"]
