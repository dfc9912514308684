"""A solved split as training frameworks see it, and settings scored back on a model.

Frameworks place an embedding (``E``), decoder layers (``t``) and a loss or
output head (``L``) on pipeline stages, and set recompute per decoder layer.
A model's kind plays the embedding when its only option is named ``HEAD``
(SAPP-PPB HEAD entries, the analytic ``embedding``), the loss when it is
``TAIL``; every other kind is a decoder layer.  The embedding must be the
model's first layer and the loss its last.

:class:`FrameworkPlan` holds, per (chunk, stage) in chunk-major order, the
roles of its layers and how many of its decoder layers run each option;
:func:`evaluate` scores a split whose every layer's option is given (settings
read from a framework's file) on the model, stage by stage, in exact bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..schedule import plan_options
from ..search import pipeline_model, run_names

EMBEDDING, DECODER, LOSS, MTP = "E", "t", "L", "m"


@dataclass(frozen=True)
class Run:
    """How a cost-modelled plan is trained, as gpuknap assumed it (the sizes a framework must be
    told): tensor, context, expert and expert-tensor parallel sizes, data-parallel replicas,
    pipeline stages, sequence length, samples per micro-batch, micro-batches per iteration,
    sequence parallelism, the distributed optimizer, whether the model has MoE layers, and the
    sliding window its attention was costed with (keys a query attends to; None: all), whether
    TP communication was costed overlapped with the GEMMs (Megatron's ``--tp-comm-overlap``), and
    the MoE token dispatcher costed (``alltoall`` or ``flex``), and whether attention was costed as
    flash attention (scores never stored)."""

    tp: int
    cp: int
    ep: int
    etp: int
    dp: int
    pp: int
    seq: int
    micro_batch: int
    micro_batches: int
    sequence_parallel: bool
    distributed_optimizer: bool
    moe: bool
    window: int | None = None
    tp_comm_overlap: bool = False
    dispatcher: str = "alltoall"
    flash_attention: bool = True

    @property
    def global_batch(self) -> int:
        """Samples per iteration: micro-batches x micro-batch size x data-parallel replicas."""
        return self.micro_batches * self.micro_batch * self.dp

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def moe_without_sp(self) -> bool:
        """MoE layers with TP > 1 and no sequence parallelism, which both frameworks refuse."""
        return self.moe and self.tp > 1 and not self.sequence_parallel


def run_of(model: Any, stages: int) -> Run | None:
    """The :class:`Run` of a cost-modelled model split into ``stages`` (None for measured profiles)."""
    costs = getattr(model, "costs", None)
    tr = getattr(costs, "training", None)
    if tr is None:
        return None
    moe = costs.moe  # from the expert parameters: a fixed recompute (--recompute full) leaves no MOEACT option
    return Run(tr.tp, tr.cp, tr.ep, tr.etp, tr.dp, stages, tr.seq, tr.micro_batch, model.micro_batches,
               bool(tr.sequence_parallel), bool(tr.distributed_optimizer), moe, getattr(costs, "window", None),
               bool(tr.tp_comm_overlap), tr.dispatcher, bool(getattr(costs, "flash_attention", True)))


def roles(model: Any) -> list[str]:
    """``E``, ``t`` or ``L`` per layer (see the module docstring); ValueError if misplaced."""
    role_of = {}
    for kind in model.kind_order:
        names = [getattr(o, "name", None) for o in model.fronts[kind]]
        role_of[kind] = EMBEDDING if names == ["HEAD"] else LOSS if names == ["TAIL"] else DECODER
    out = [role_of[k] for k in model.kinds]
    for i, r in enumerate(out):
        if r == EMBEDDING and i != 0:
            raise ValueError(f"layer {i} is an embedding (kind {model.kinds[i]!r}) but not the model's first layer")
        if r == LOSS and i != len(out) - 1:
            raise ValueError(f"layer {i} is a loss/output layer (kind {model.kinds[i]!r}) but not the model's last")
    return out


@dataclass(frozen=True)
class Segment:
    """One (chunk, stage): its layers' roles in order and its decoder layers' option counts."""

    roles: str
    options: tuple  # ((option name, count), ...) over decoder layers, in order of first use

    @property
    def decoders(self) -> int:
        return self.roles.count(DECODER)

    def count(self, name: str) -> int:
        return dict(self.options).get(name, 0)


@dataclass(frozen=True)
class FrameworkPlan:
    """A split for a framework: ``stages`` x ``chunks`` segments, chunk-major, and its score."""

    name: str
    stages: int
    chunks: int
    segments: tuple
    score: float | None = None
    model: Any = field(default=None, repr=False, compare=False)  # the model, for checks and scoring
    names: tuple = field(default=(), repr=False, compare=False)  # every layer's option, model order
    in_flight: Any = field(default=None, repr=False, compare=False)
    run: Run | None = None  # how it is trained (cost-modelled models)
    mtp: int = 0  # multi-token-prediction layers after the last decoder layer (costed with the output layer)
    notes: tuple = ()  # comment lines for the settings (the search that found the plan, its cost)
    model_flags: tuple = ()  # Megatron flags of the model's experts (formats.megatron_model_flags)

    @property
    def decoder_layers(self) -> int:
        return sum(seg.decoders for seg in self.segments)

    @property
    def counts(self) -> list[int]:
        return [len(seg.roles) for seg in self.segments]

    def segment(self, chunk: int, stage: int) -> Segment:
        return self.segments[chunk * self.stages + stage]

    def option_names(self) -> set:
        return {name for seg in self.segments for name, _ in seg.options}


def framework_plan(model: Any, counts: Sequence[int], names: Sequence[str], chunks: int = 1, name: str = "",
                   score: float | None = None, in_flight: Any = None, mtp: int = 0,
                   notes: Sequence[str] = (), model_flags: Sequence[str] = ()) -> FrameworkPlan:
    """The :class:`FrameworkPlan` of a split whose layers run ``names`` (model order); ``mtp``
    multi-token-prediction layers follow the last decoder layer (frameworks place them; the cost
    model counts them with the output layer, on the last stage); ``notes`` become comment lines."""
    pipeline_model(model)
    counts = model.check_counts(list(counts), chunks)
    if isinstance(names, (str, bytes)) or not isinstance(names, (Sequence, np.ndarray)):
        raise ValueError(f"names must be a sequence of option names, one per layer, got {type(names).__name__}")
    if len(names) != model.layers:
        raise ValueError(f"names: {len(names)} option names for a model of {model.layers} layers")
    plan_options(model, counts, names, chunks)  # each name an option of its layer's kind
    if isinstance(notes, (str, bytes)) or not hasattr(notes, "__iter__"):
        raise ValueError(f"notes must be a sequence of comment lines, got {type(notes).__name__}")
    if isinstance(mtp, bool) or not isinstance(mtp, int) or not 0 <= mtp <= 1000:
        raise ValueError(f"mtp: expected an integer from 0 to 1,000 MTP layers, got {mtp!r}")
    role = roles(model)
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    segments = []
    for i in range(len(counts)):
        layers = range(bounds[i], bounds[i + 1])
        used: dict[str, int] = {}
        for j in layers:
            if role[j] == DECODER:
                used[names[j]] = used.get(names[j], 0) + 1
        segments.append(Segment("".join(role[j] for j in layers), tuple(used.items())))
    p = len(counts) // chunks
    return FrameworkPlan(str(name), p, chunks, tuple(segments), score, model, tuple(names), in_flight,
                         run_of(model, p), mtp, tuple(str(n) for n in notes), tuple(str(f) for f in model_flags))



@dataclass(frozen=True)
class Evaluation:
    """Settings scored on a model: per stage its time, exact bytes and budget, and the
    same as a :class:`PipelineChoice` (for the reports)."""

    counts: tuple
    times: tuple
    memory: tuple
    budgets: tuple
    choice: Any

    @property
    def feasible(self) -> bool:
        return all(m <= b for m, b in zip(self.memory, self.budgets))

    @property
    def slowest(self) -> float:
        return max(self.times)


def evaluate(model: Any, counts: Sequence[int], names: Sequence[str], in_flight: Any = None,
             chunks: int = 1) -> Evaluation:
    """Score a split whose every layer runs the option named ``names[i]``: stage times and
    exact bytes against each stage's budget (ValueError for an option a kind lacks).  A layer inside
    Megatron's uniform recompute group (``FULL-GROUPED``) runs FULL's time and keeps nothing."""
    counts = model.check_counts(counts, chunks)
    times, memory, budgets, choice = run_names(model, counts, names, in_flight, chunks)
    return Evaluation(tuple(counts), times, memory, budgets, choice)


def mismatches(model: Any, counts: Sequence[int], plan_names: Sequence[str], names: Sequence[str],
               chunks: int = 1) -> list[tuple]:
    """Where running ``names`` differs from the plan ``plan_names``: ``(chunk, stage, wanted, got)``
    per segment whose layers, taken kind by kind, run other options (order within a kind is free)."""
    out = []
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    p = len(counts) // chunks
    for i in range(len(counts)):
        layers = range(bounds[i], bounds[i + 1])
        want = sorted((str(model.kinds[j]), plan_names[j]) for j in layers)
        got = sorted((str(model.kinds[j]), names[j]) for j in layers)
        if want != got:
            out.append((i // p, i % p, _show(want), _show(got)))
    return out


def _show(pairs: list) -> str:
    seen: dict = {}
    for pair in pairs:
        seen[pair] = seen.get(pair, 0) + 1
    return " ".join(f"{kind}/{name}x{n}" for (kind, name), n in seen.items())
