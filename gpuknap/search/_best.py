"""``best_splits``: the exact top-k splits of a model, without enumerating them.

1. Segment times (:func:`._segments.plan_segments`): ``T[s, start, end]``, the
   least time of stage s taking layers ``start:end``, for the segments a split
   may use and whose fastest options fit the round's limit, classified with
   array operations and solved as one batch (equal problems once, shared pass
   chains).  A model whose stages cannot hold its layers even with their
   lightest options is recognised before any of this (:func:`._segments.coverage`).
2. The certified rounds (:mod:`._rounds`) with one module per score: the
   exact top k on each round's table (``slowest``: :mod:`._slowest`; ``1f1b``,
   ``(M - 1) * slowest + sum of stage times``: :mod:`._closed_form`;
   ``simulated``, Megatron's 1F1B schedule: :mod:`._simulated`), raising the
   limit until no left-out segment can change the answer.
3. Plans for the splits found, each distinct stage solved once; with
   ``bound=True`` the same search with weights rounded down and budgets
   rounded up certifies how much the bucketing can have cost.

Interleaved pipelines (``interleave=v``): the exact search over per-stage
chunk tuples where the model is one kind between its first and last layer,
else a local search (:mod:`._local`); the simulated score of those models by a
branch and bound over stage tuples (:mod:`._tuplesim`).  Ties are broken by the
rule of :mod:`._ties` (no idle stage, the least total, the most even, the counts).
"""
from __future__ import annotations

import difflib
import math
from typing import Any

import numpy as np

from ..engine import (
    MAX_TOP,
    MEGABYTE,
    WorkTooLarge,
    FrontTable,
    Planner,
    check_bucket,
    check_int,
    check_max_bytes,
    get_backend,
    paused_collection,
    report,
)
from ._classify import kind_index
from ._constrained import constrained_splits
from ._closed_form import ClosedForm
from ._interleaved import (
    TupleSource,
    counts_of,
    interleaved_score,
    most_layers,
    one_body_kind,
    simulated_rows,
)
from ._local import even_split, local_search, overflow_rows
from ._model import PipelineModel, pipeline_model
from ._plain import plain_search
from ._rounds import Found, Solver, certified_rounds, first_limit, run_rounds
from ._segments import fastest_prefix
from ._slowest import Slowest
from ._ties import tie_key
from ._tuplesim import top_interleaved_simulated

SCORES = ("slowest", "1f1b", "simulated")


@paused_collection()
def best_splits(model: PipelineModel, stages: int, top: int = 1, score: str = "slowest",
                bucket: float = MEGABYTE, backend: Any = "auto", in_flight: Any = None,
                max_bytes: int | None = None, bound: bool = False, exclusive: Any = (),
                interleave: int = 1, framework: str | None = None) -> list[tuple]:
    """The exact ``top`` splits of ``model`` into ``stages`` stages, best first.

    Each entry is ``(counts, score, PipelineChoice)``; ties by the rule of
    :mod:`gpuknap.search._ties` (no idle stage, then the least total time, then
    the most even, then the counts).  An infeasible model gives an empty list.  Scores:
    ``slowest`` (the slowest stage), ``1f1b`` (``(M - 1) * slowest + sum``) and
    ``simulated`` (Megatron's 1F1B schedule simulated with each stage's
    forward and backward times from its plan; :mod:`gpuknap.search._simulated`).

    ``bound=True`` certifies the bucketing: entries are ``(counts, score,
    choice, lower_bound)``, where ``lower_bound`` is the i-th best score of the
    same search with weights rounded down and budgets rounded up.  Every split
    scores no less in that relaxation than with exact bytes, so the i-th best
    split with exact bytes (no bucketing at all) scores at least
    ``lower_bound``: the gap to ``score`` is the most a finer bucket could gain.

    ``exclusive`` lists pairs of option names that may not both appear in one
    stage (MindFormers applies select and comm recompute to the first layers
    of a stage, so it cannot run ``SLCT`` and ``COMM`` layers side by side):
    every stage then takes the better of its choices without each name.

    ``interleave=v`` searches interleaved splits: ``v * stages`` counts in
    chunk-major order (:mod:`gpuknap.search._interleaved`; exact for models whose
    layers between the first and the last are of one kind, else a local search:
    the list returned is a :class:`~gpuknap.search.Found` whose
    ``exact`` and ``lower_bound`` say which).  ``1f1b`` is then the interleaved
    closed form ``(M - 1/v) * slowest + sum / v``.

    ``framework="megatron"`` or ``"mindformers"`` searches only the plans that
    framework runs as written (:func:`~gpuknap.search.constrained_splits`;
    entries then also carry every layer's option name and each segment's
    pattern); ``bound`` and ``exclusive`` do not combine with it.
    """
    pipeline_model(model)
    stages, top = check_int(stages, "stages", 1), check_int(top, "top", 1)
    if stages > model.layers:
        raise ValueError(f"stages={stages} exceeds the model's {model.layers} layers")
    if top > MAX_TOP:
        raise ValueError(f"top={top} is over the limit of {MAX_TOP} splits per search")
    if not isinstance(score, str) or score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if not isinstance(bound, (bool, np.bool_)):
        raise ValueError(f"bound must be True or False, got {bound!r}")
    if bound and score == "simulated":
        raise ValueError("bound=True certifies the slowest and 1f1b scores; the simulated score has no bound")
    check_bucket(bucket)
    get_backend(backend)
    if max_bytes is not None:
        check_max_bytes(max_bytes)
    interleave = check_int(interleave, "interleave", 1)
    exclusive = check_exclusive(model, exclusive)
    if framework is not None:
        if bound or exclusive:
            raise ValueError("framework= does not combine with bound=True or exclusive (the framework's own "
                             "rule says which options a stage may mix)")
        return constrained_splits(model, int(stages), framework, int(top), score, bucket, backend, in_flight,
                                  max_bytes, interleave)
    if interleave > 1:
        return _interleaved(model, int(stages), int(top), score, bucket, backend, in_flight, max_bytes, bound,
                            exclusive, interleave)
    model.in_flight_table(int(stages), 1, in_flight)
    return plain_search(model, int(stages), int(top), score, bucket, backend, in_flight, max_bytes, exclusive,
                        bound)


def check_exclusive(model: PipelineModel, exclusive: Any) -> tuple:
    """``exclusive`` as a tuple of name pairs (any iterable is read once), every name one of the
    model's options: ValueError naming an unknown name and the nearest known one."""
    if exclusive is None:
        return ()
    if isinstance(exclusive, (str, bytes, dict)) or not hasattr(exclusive, "__iter__"):
        raise ValueError(f"exclusive must be pairs of option names, got {exclusive!r}"[:300])
    known = sorted({str(getattr(o, "name", o)) for options in model.fronts.values() for o in options})
    pairs = []
    for pair in exclusive:
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__iter__"):
            raise ValueError(f"exclusive must be pairs of option names, got the entry {pair!r}"[:300])
        pair = tuple(pair)
        if len(pair) != 2 or not all(isinstance(n, str) for n in pair):
            raise ValueError(f"exclusive must be pairs of option names, got the entry {pair!r}"[:300])
        for name in pair:
            if name not in known:
                near = difflib.get_close_matches(name, known, 1)
                raise ValueError(f"exclusive: unknown option name {name!r}"
                                 + (f" (did you mean {near[0]!r}?)" if near else "")
                                 + f"; the model's options are {', '.join(known)}"[:400])
        if pair[0] == pair[1]:  # would forbid the option outright, not keep two apart
            raise ValueError(f"exclusive: {pair!r} names one option twice; a pair keeps two options apart")
        pairs.append(pair)
    return tuple(pairs)


def _interleaved(model: PipelineModel, stages: int, top: int, score: str, bucket: float, backend: Any,
                 in_flight: Any, max_bytes: int | None, bound: bool, exclusive: Any, chunks: int) -> Found:
    """``best_splits`` for interleaved pipelines, with each split's plan."""
    if bound or exclusive:
        what = "bound=True" if bound else "exclusive options"
        raise ValueError(f"interleave={chunks}: {what} is for plain pipelines only (interleave=1)")
    if stages * chunks > model.layers:
        raise ValueError(f"{stages} stages x {chunks} chunks need at least {stages * chunks} layers, "
                         f"the model has {model.layers}")
    found = best_interleaved(model, stages, chunks, top, score, bucket, backend, in_flight, max_bytes)
    plan = Planner(model.fronts, bucket)
    out = Found()
    out.exact, out.lower_bound = found.exact, found.lower_bound
    for i, (counts, value) in enumerate(found):
        choice = plan(model.stages(list(counts), in_flight, chunks))
        out.append((tuple(int(c) for c in counts), float(value), choice))
        report("plans", i + 1, len(found))
    return out


def interleaved_rounds(source: TupleSource, p: int, chunks: int, top: int, score: str, m: int) -> Any:
    """The certified rounds of an exact interleaved search on a :class:`TupleSource`: the tables
    hold per-stage totals, scored as a plain pipeline of ``v * M`` micro-batches for ``1f1b``
    (``(vM - 1) * slowest + sum`` ranks as the interleaved closed form)."""
    total = float(source.fastest[-1])
    rule = Slowest() if score == "slowest" else ClosedForm(chunks * m, total)
    return certified_rounds(rule, first_limit(source.fastest, p), total, top)


def interleaved_counts(found: list, source: TupleSource, p: int, chunks: int, score: str) -> list[tuple]:
    """``(counts, score)`` of an exact interleaved search's answer (per-stage totals made chunk-major
    counts; ``1f1b`` scores divided by v back to the closed form)."""
    return [(counts_of(totals, source.choice, p, chunks), value / chunks if score == "1f1b" else value)
            for totals, value in found]


def best_interleaved(model: Any, p: int, chunks: int, top: int, score: str, bucket: float, backend: Any,
                     in_flight: Any, max_bytes: int | None) -> Found:
    """``[(counts, score)]`` of the best interleaved splits (see :mod:`._interleaved`)."""
    if model.layers < p * chunks:
        raise ValueError(f"{p} stages x {chunks} chunks need at least {p * chunks} layers, "
                         f"the model has {model.layers}")
    table = model.in_flight_table(p, chunks, in_flight)
    fronts = FrontTable(model.fronts, bucket)
    fastest = fastest_prefix(model, fronts, kind_index(model), 1)
    m = model.micro_batches
    out = Found()
    if one_body_kind(model):
        if score == "simulated":  # every tuple on its own, from the closed form's best splits
            seeds = best_interleaved(model, p, chunks, max(8, 2 * top), "1f1b", bucket, backend, in_flight, max_bytes)
            most = most_layers(model, fronts, table)
            found, exact, lower = top_interleaved_simulated(model, p, chunks, top, table, fronts, fastest, most,
                                                            [list(c) for c, _ in seeds], bucket, backend,
                                                            in_flight, max_bytes)
            if not exact:  # the walk ran out of budget: the local search from its best and the closed form's
                def simulate(rows: np.ndarray) -> np.ndarray:
                    return simulated_rows(model, rows, chunks, bucket, backend, in_flight, max_bytes)
                starts = [c for c, _ in found] + [c for c, _ in seeds[:3]]
                seen = dict(local_search(top, starts, simulate, lambda rows: overflow_rows(model, rows, chunks,
                                                                                          in_flight)))
                seen.update(found)
                found = _tied(model, sorted(seen.items(), key=lambda e: (e[1], e[0])), top, bucket, backend,
                              in_flight, chunks, max_bytes)
            out.extend(found)
            out.exact, out.lower_bound = exact, min(lower, out[0][1]) if out else lower
            return out
        else:
            source = TupleSource(model, p, chunks, table, fronts, fastest)
            found = run_rounds(interleaved_rounds(source, p, chunks, top, score, m), source,
                               Solver(backend, max_bytes))
            out.extend(interleaved_counts(found, source, p, chunks, score))
        out.lower_bound = out[0][1] if out else math.nan
        return out
    # Other models: local search from several starts (not proven optimal), with a lower bound.
    starts = [even_split(model.layers, p * chunks)]
    try:
        plain = plain_search(model, p * chunks, 1, "slowest", bucket, backend, None, max_bytes)
        starts = [plain[0][0]] + starts if plain else starts
    except WorkTooLarge:  # over the work limit at this bucket: said, not dropped (the local search is more work)
        raise
    except ValueError:  # the plain search may refuse (in-flight table, size): the even start remains
        pass
    slowest = max(float(fastest[-1]) / p, float(np.diff(fastest).max(initial=0.0)))
    overflow = lambda rows: overflow_rows(model, rows, chunks, in_flight)  # noqa: E731
    if score == "simulated":  # start from the closed form's best; each stage is busy M * t_s
        closed = best_interleaved(model, p, chunks, 3, "1f1b", bucket, backend, in_flight, max_bytes)
        starts = [c for c, _ in closed] + starts

        def score_rows(rows: np.ndarray) -> np.ndarray:
            return simulated_rows(model, rows, chunks, bucket, backend, in_flight, max_bytes)
        bound = m * slowest
    else:
        def score_rows(rows: np.ndarray) -> np.ndarray:
            times = model.rank(rows, bucket, backend, in_flight, chunks, max_bytes).stage_table()
            return interleaved_score(times, score, m, chunks)
        bound = slowest if score == "slowest" else ((chunks * m - 1) * slowest + float(fastest[-1])) / chunks
    ranked = local_search(top, starts, score_rows, overflow)
    out.extend(_tied(model, ranked, top, bucket, backend, in_flight, chunks, max_bytes))
    out.exact, out.lower_bound = False, bound
    return out


def _tied(model: Any, ranked: list, top: int, bucket: float, backend: Any, in_flight: Any, chunks: int,
          max_bytes: int | None) -> list[tuple]:
    """The ``top`` best of ``ranked`` (every split seen, best first) with ties at the k-th score
    ordered by the rule of :mod:`._ties` (the stages' times of each split)."""
    if len(ranked) <= top and all(ranked[i][1] != ranked[i + 1][1] for i in range(len(ranked) - 1)):
        return ranked
    kth = ranked[min(top, len(ranked)) - 1][1]
    near = [(c, v) for c, v in ranked if v <= kth]
    times = model.rank(np.array([c for c, _ in near], dtype=np.int64), bucket, backend, in_flight, chunks,
                       max_bytes).stage_table()
    order = sorted(range(len(near)), key=lambda i: tie_key(near[i][1], times[i], near[i][0]))
    return [near[i] for i in order[:top]]
