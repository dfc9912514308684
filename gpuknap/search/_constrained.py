"""Framework-constrained searches: the best splits among the plans a training framework runs as written.

A framework does not run any per-layer choice of recompute options:

- Megatron-LM sets **one** recompute for every stage: none; selective modules
  (``core_attn`` is SLCT, ``moe_act`` MOEACT, both SLCT+MOEACT; a dense layer
  has no ``moe_act``); full recompute of the first N decoder layers of every
  virtual stage (``block``), or of every layer in groups of N that keep one
  saved input per group (``uniform``: the first layer of a group keeps FULL's
  input, the others nothing, :data:`GROUPED`).
- MindFormers sets, per (virtual) stage, how many of its **first** decoder
  layers run each recompute: full first, then select and comm together
  (BOTH), then one of them, then none.

Both are *patterns*: the option of a decoder layer follows from its position
among the decoder layers of its virtual stage (:class:`Pattern`).  Megatron
picks one pattern for the whole pipeline; MindFormers one per stage.  The
patterns a framework can express on a model are :func:`framework_rule`; which
option names mean which recompute is said in docs/training_settings.md
(cost-modelled models: SLCT is Megatron's ``core_attn``; measured SAPP-PPB
profiles: SLCT and COMM are MindFormers' select and comm recompute, which
Megatron has no module for).

The plain search is exact (:mod:`._constrained_rows` has the interleaved
one): for each pattern, every segment's time and bytes are summed layer by
layer in model order, as :func:`gpuknap.formats.framework.evaluate` sums
them, compared with the stage's budget in exact bytes, and the score's own
exact top k (``slowest``, ``1f1b``, ``simulated``) runs on that table.
Megatron's answer is the best over its patterns; MindFormers' table takes
each segment's best pattern.  A per-stage rule on a model whose decoder
layers are one kind is any multiset of its options (a prefix order realizes
it), so it runs as the engine's exact knapsack with select and comm kept
apart (``exclusive``), in memory buckets as every engine search.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..engine import MEGABYTE, check_int, report
from ._constrained_rows import interleaved_constrained
from ._model import PipelineModel, pipeline_model
from ._patterns import (
    GROUPED,
    SCORES,
    Layout,
    Pattern,
    Rule,
    _score,
    decoder_kinds,
    framework_rule,
    in_order,
    run_names,
    with_grouped,
)
from ._plain import plain_search
from ._rounds import Found
from ._segments import SegmentTable


def plain_constrained(model: PipelineModel, rule: Rule, stages: int, top: int, score: str, bucket: float,
                      backend: Any, in_flight: Any, max_bytes: int | None) -> Found:
    """The exact top ``top`` plain splits under ``rule``: ``(counts, score, choice, names, patterns)``
    entries (``patterns`` per stage; None for the engine path's free multisets), best first,
    ties by counts, then by the pattern's place in the rule."""
    out = Found()
    if rule.engine is not None:
        usable, exclusive = rule.engine
        fronts = {k: [o for o in v if getattr(o, "name", None) in usable] if k in decoder_kinds(model) else v
                  for k, v in model.fronts.items()}
        restricted = PipelineModel(model.kinds, fronts, model.static, model.capacity, model.micro_batches,
                                   model.reserved, costs=model.costs)
        found = plain_search(restricted, stages, top, score, bucket, backend, in_flight, max_bytes, exclusive)
        if found.refusal:  # a framework's settings are emitted from an exact search only
            raise ValueError(found.refusal)
        for counts, value, choice in found:
            names = restricted.option_names(list(counts), choice, in_flight)
            names = in_order(model, counts, names, rule.levels)
            out.append((counts, value, run_names(model, counts, names, in_flight)[3], names, [None] * stages))
        return out
    model = with_grouped(model) if any(GROUPED in p.names() for p in rule.patterns) else model
    k_of = [row[0] for row in model.in_flight_table(stages, 1, in_flight)]
    lay = Layout(model, stages, k_of)
    kidx = [lay.ks.index(k) for k in k_of]
    found: list[tuple] = []

    def search(band: np.ndarray, which: Any) -> None:
        def stage_times(s: int, a: int, b: int) -> tuple[float, float]:
            pat = which if isinstance(which, Pattern) else rule.patterns[which[s, a, b - a - 1]]
            fwd = bwd = 0.0
            for j, name in zip(range(a, b), lay.names([b - a], [pat], a)):
                o = next(o for o in model.fronts[model.kinds[j]] if getattr(o, "name", None) == name)
                fwd, bwd = fwd + o.forward_time, bwd + o.backward_time
            return fwd, bwd

        for counts, value in _score(score, model, stage_times, stages).top(SegmentTable(band), top):
            bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
            pats = [which if isinstance(which, Pattern) else
                    rule.patterns[which[s, bounds[s], counts[s] - 1]] for s in range(stages)]
            found.append((value, tuple(counts), rule.patterns.index(pats[0]) if not rule.per_stage else 0, pats))

    if rule.per_stage:
        best = np.full((stages, model.layers + 1, lay.width), np.inf)
        which = np.zeros(best.shape, dtype=np.int32)
        for i, pattern in enumerate(rule.patterns):
            band = lay.band(pattern, kidx)
            better = band < best
            best, which = np.where(better, band, best), np.where(better, i, which)
            report("framework settings", i + 1, len(rule.patterns))
        search(best, which)
    else:
        for i, pattern in enumerate(rule.patterns):
            search(lay.band(pattern, kidx), pattern)
            report("framework settings", i + 1, len(rule.patterns))
    found.sort(key=lambda f: (f[0], f[1], f[2]))
    seen: set = set()
    for value, counts, _, pats in found:  # a split that two settings run alike is one plan
        names = lay.names(counts, pats)
        if len(out) < top and (counts, tuple(names)) not in seen:
            seen.add((counts, tuple(names)))
            out.append((counts, float(value), run_names(model, counts, names, in_flight)[3], names, pats))
    return out


def constrained_splits(model: PipelineModel, stages: int, framework: str, top: int = 1, score: str = "slowest",
                       bucket: float = MEGABYTE, backend: Any = "auto", in_flight: Any = None,
                       max_bytes: int | None = None, interleave: int = 1, starts: Any = ()) -> Found:
    """The best splits among the plans ``framework`` ("megatron", "mindformers") runs as written:
    ``(counts, score, choice, names, patterns)`` entries, best first, as ``best_splits``' ``(counts,
    score, choice)`` and then ``names`` (every layer's option) and ``patterns`` (each segment's
    :class:`Pattern`, chunk-major; None where the engine chose a multiset).  Plain pipelines: exact.
    Interleaved: see :mod:`._constrained_rows` (``exact`` and ``lower_bound`` on the list; ``starts``:
    more splits to start its local search from, such as the unconstrained search's best)."""
    pipeline_model(model)
    stages, top, interleave = check_int(stages, "stages", 1), check_int(top, "top", 1), check_int(interleave,
                                                                                                    "interleave", 1)
    if stages * interleave > model.layers:
        raise ValueError(f"stages={stages} x interleave={interleave} exceeds the model's {model.layers} layers")
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    rule = framework_rule(model, framework, model.layers - stages * interleave + 1)
    if interleave > 1:
        return interleaved_constrained(model, rule, stages, interleave, top, score, bucket, backend, in_flight,
                                       max_bytes, plain_constrained, starts)
    return plain_constrained(model, rule, stages, top, score, bucket, backend, in_flight, max_bytes)


