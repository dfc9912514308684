"""The search: a model's layers split into pipeline stages, and the exact best splits.

Owns the pipeline model (:class:`PipelineModel`: layers, options, static
bytes, device, micro-batches; the stages of a split), the ranking of given
splits (``model.rank``), the segment tables and their classification into
stage problems, the certified rounds every score plugs into (:mod:`._rounds`),
one module per score (``slowest``, ``1f1b``, ``simulated``), the interleaved
search, and ``best_splits`` on top.  It builds on the engine (stage problems
solved in batches) and the schedule (in-flight tables, simulated scores).
"""
from ._best import (
    SCORES,
    best_interleaved,
    best_splits,
    interleaved_counts,
    interleaved_rounds,
)
from ._constrained import constrained_splits
from ._constrained_rows import best_on_split
from ._patterns import (FRAMEWORKS, GROUPED, Pattern, Rule, apply, decoder_kinds, framework_rule, run_names,
                        with_grouped)
from ._classify import KindIndex, classify, kind_counts, kind_index
from ._interleaved import (EVEN_MARGIN, TupleSource, counts_of, even_candidate, even_counts, even_is_faster, interleaved_score,
                           one_body_kind)
from ._model import MAX_IN_FLIGHT, MAX_LAYERS, PipelineModel, pipeline_model
from ._plain import SegmentSource, front_table, plain_search, variants
from ._rounds import Found, Score, Solver, certified_rounds, first_limit, run_rounds
from ._segments import (
    SegmentPlan,
    SegmentTable,
    coverage,
    fastest_prefix,
    plan_segments,
    segment_table,
    segment_times,
)
from ._slowest import exact_score, score_of

__all__ = [
    "SCORES", "best_interleaved", "best_splits", "interleaved_counts", "interleaved_rounds",
    "KindIndex", "classify", "kind_counts", "kind_index", "TupleSource", "counts_of", "EVEN_MARGIN", "even_candidate", "even_counts", "even_is_faster", "interleaved_score",
    "one_body_kind",
    "MAX_IN_FLIGHT", "MAX_LAYERS", "PipelineModel", "pipeline_model", "SegmentSource", "front_table", "plain_search", "variants",
    "Found", "Score", "Solver", "certified_rounds", "first_limit", "run_rounds",
    "SegmentPlan", "SegmentTable", "coverage", "fastest_prefix", "plan_segments", "segment_table",
    "segment_times", "exact_score", "score_of",
    "FRAMEWORKS", "GROUPED", "Pattern", "Rule", "apply", "best_on_split", "constrained_splits", "decoder_kinds", "framework_rule",
    "run_names", "with_grouped",
]
