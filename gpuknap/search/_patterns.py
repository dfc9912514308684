"""Patterns: the per-layer recompute a training framework can express, and the tables of their segments.

A framework's recompute is a *pattern* (:class:`Pattern`): the option of a
decoder layer follows from its position among the decoder layers of its
virtual stage.  :func:`framework_rule` lists the patterns Megatron-LM and
MindFormers express on a model (see :mod:`._constrained`); :class:`Layout`
sums every segment's time and bytes under a pattern layer by layer in model
order, as :func:`gpuknap.formats.framework.evaluate` sums them, and each
segment's budget as ``PipelineModel.budget_of`` does, so that a table built
from them agrees bit for bit with settings scored back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations_with_replacement
from typing import Any

import numpy as np

from ..engine import Assignment, LayerOption, Layers, PipelineChoice, StageChoice
from ._closed_form import ClosedForm
from ._model import PipelineModel
from ._simulated_score import Simulated
from ._slowest import Slowest

FRAMEWORKS = ("megatron", "mindformers")
SCORES = ("slowest", "1f1b", "simulated")
#: A layer inside a Megatron ``uniform`` recompute group after its first: FULL's time, nothing kept.
GROUPED = "FULL-GROUPED"
#: Option names of Megatron's selective modules (gpuknap's cost model).
SELECTIVE = {("core_attn",): "SLCT", ("moe_act",): "MOEACT", ("core_attn", "moe_act"): "SLCT+MOEACT"}
#: MindFormers' levels from the first layers of a stage on (measured profiles; cost models: FULL, NONE).
CHAINS = (("FULL", "BOTH", "SLCT", "NONE"), ("FULL", "BOTH", "COMM", "NONE"))
#: Most band cells (stages x starts x lengths) one table may hold.
MAX_CELLS = 30_000_000
#: Most patterns a per-stage rule may enumerate on a model of mixed decoder kinds.
MAX_PATTERNS = 5_000


def decoder_kinds(model: Any) -> list:
    """Kinds that are decoder layers: every kind but a lone ``HEAD`` or ``TAIL`` option."""
    return [k for k in model.kind_order
            if [getattr(o, "name", None) for o in model.fronts[k]] not in (["HEAD"], ["TAIL"])]


@dataclass(frozen=True)
class Pattern:
    """Which option each decoder layer of a virtual stage runs, by its position ``p`` among them:
    ``head[p]`` for the first ``len(head)``, then ``cycle`` over and over; each entry maps a decoder
    kind to an option name.  ``setting`` says what the framework writes: ``("none",)``,
    ``("selective", modules)``, ``("block", N)``, ``("uniform", N)`` or ``("first", counts)``."""

    setting: tuple
    head: tuple
    cycle: tuple

    @property
    def slots(self) -> tuple:
        return self.head + self.cycle

    def slot(self, pos: int) -> int:
        h = len(self.head)
        return pos if pos < h else h + (pos - h) % len(self.cycle)

    def names(self) -> set:
        return {name for entry in self.slots for name in entry.values()}


@dataclass(frozen=True)
class Rule:
    """What a framework can express on a model: its ``patterns``, one for every stage or one per
    stage (``per_stage``); ``engine``: the options and exclusive pairs of the equivalent engine
    search (per-stage rules on one decoder kind), else None."""

    framework: str
    patterns: tuple
    per_stage: bool
    engine: tuple | None = None
    levels: dict = field(default_factory=dict)  # option name -> its place in a stage's order


def with_grouped(model: PipelineModel) -> PipelineModel:
    """The model with a :data:`GROUPED` option beside every decoder kind's FULL."""
    fronts = dict(model.fronts)
    for kind in decoder_kinds(model):
        full = next((o for o in fronts[kind] if getattr(o, "name", None) == "FULL"), None)
        if full is not None and not any(getattr(o, "name", None) == GROUPED for o in fronts[kind]):
            fronts[kind] = list(fronts[kind]) + [LayerOption(GROUPED, 0.0, float(full.forward_time),
                                                             float(full.backward_time),
                                                             parts=tuple(getattr(full, "parts", ())))]
    if all(fronts[k] is model.fronts[k] for k in fronts):
        return model
    return PipelineModel(model.kinds, fronts, model.static, model.capacity, model.micro_batches, model.reserved,
                         costs=model.costs)


def framework_rule(model: Any, framework: str, longest: int | None = None) -> Rule:
    """The patterns ``framework`` can express on ``model`` (``longest``: most decoder layers a
    virtual stage may hold); ValueError naming a kind when it can express none."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    dec = decoder_kinds(model)
    if not dec:
        raise ValueError("the model has no decoder layers")
    names = {k: {getattr(o, "name", None) for o in model.fronts[k]} for k in dec}
    for k in dec:  # a uniform group's later layers run FULL's time and keep nothing
        if "FULL" in names[k]:
            names[k].add(GROUPED)
    longest = sum(k in dec for k in model.kinds) if longest is None else max(int(longest), 1)
    costed = getattr(model, "costs", None) is not None

    def same(name: str) -> dict:
        return dict.fromkeys(dec, name)

    def valid(p: Pattern) -> bool:
        return all(entry[k] in names[k] for entry in p.slots for k in dec)

    out: list[Pattern] = []
    if framework == "megatron":
        out.append(Pattern(("none",), (), (same("NONE"),)))
        for mods in (SELECTIVE if costed else ()):
            entry = {k: SELECTIVE.get(tuple(m for m in mods if m != "moe_act" or "MOEACT" in names[k]), "NONE")
                     for k in dec}
            if entry != same("NONE") and all(entry != p.cycle[0] for p in out):
                out.append(Pattern(("selective", mods), (), (entry,)))
        out.append(Pattern(("uniform", 1), (), (same("FULL"),)))
        out += [Pattern(("block", n), (same("FULL"),) * n, (same("NONE"),)) for n in range(1, longest)]
        # Megatron's MTP layer refuses uniform groups of more than one layer (multi_token_prediction.py)
        mtp = getattr(getattr(model, "costs", None), "mtp", 0)
        out += [Pattern(("uniform", n), (), (same("FULL"),) + (same(GROUPED),) * (n - 1))
                for n in range(2, longest + 1) if not mtp]
        return _checked(Rule(framework, tuple(p for p in out if valid(p)), False), dec, names, "megatron")
    chains = [tuple(n for n in chain if all(n in names[k] for k in dec))
              for chain in ((("FULL", "NONE"),) if costed else CHAINS)]
    chains = list(dict.fromkeys(c for c in chains if c))
    levels = {name: i for c in chains for i, name in enumerate(c)}
    if not chains:
        raise _none_error(dec[0], names, "mindformers", "NONE, FULL" + ("" if costed else ", SLCT, COMM, BOTH"))
    if len(dec) == 1:  # one decoder kind: any multiset is a prefix order, the engine's knapsack
        usable = frozenset(n for c in chains for n in c)
        return Rule(framework, (), True, (usable, (("SLCT", "COMM"),) if {"SLCT", "COMM"} <= usable else ()), levels)
    seen: set = set()
    for chain in chains:  # every way to give a stage's first layers the chain's levels in turn
        *heavy, last = chain
        for cut in combinations_with_replacement(range(longest + 1), len(heavy)):
            sizes = np.diff((0,) + cut).tolist()
            key = tuple((name, n) for name, n in zip(heavy, sizes) if n)
            if (key, last) in seen:
                continue
            seen.add((key, last))
            head = tuple(same(name) for name, n in key for _ in range(n))
            out.append(Pattern(("first", key), head, (same(last),)))
            if len(out) > MAX_PATTERNS:
                raise ValueError(f"MindFormers' first-layers rule on this model's {len(dec)} decoder kinds would "
                                 f"try over {MAX_PATTERNS:,} settings per stage; use fewer layers per stage")
    return _checked(Rule(framework, tuple(out), True, None, levels), dec, names, "mindformers")


def _none_error(kind: Any, names: dict, who: str, runs: str) -> ValueError:
    return ValueError(f"kind {kind!r}: none of its options {sorted(map(str, names[kind]))} is one {who} runs "
                      f"({runs})")


def _checked(rule: Rule, dec: list, names: dict, who: str) -> Rule:
    if not rule.patterns:
        lacking = next((k for k in dec if not {"NONE", "FULL"} & names[k]), dec[0])
        raise _none_error(lacking, names, who, "NONE, FULL" + (", SLCT, MOEACT" if who == "megatron" else ""))
    return rule


class Layout:
    """A model's layers as arrays for the pattern tables: kind codes, decoder prefix counts, the
    distinct in-flight counts, and each segment's budget summed as ``model.budget_of`` sums it."""

    def __init__(self, model: Any, parts: int, in_flights: list):
        self.model, n = model, model.layers
        self.order = list(model.kind_order)
        code = {k: i for i, k in enumerate(self.order)}
        self.codes = np.array([code[k] for k in model.kinds], dtype=np.int64)
        dec = set(decoder_kinds(model))
        self.decoder = np.array([k in dec for k in model.kinds])
        self.D = np.concatenate(([0], np.cumsum(self.decoder))).astype(np.int64)
        self.ks = sorted(set(in_flights))
        self.width = n - parts + 1
        if len(self.ks) * n * self.width > MAX_CELLS:
            raise ValueError(f"a framework-constrained search over {n:,} layers and {parts} stages would weigh "
                             f"{len(self.ks) * n * self.width:,} segment cells (over {MAX_CELLS:,})")
        self._budget: np.ndarray | None = None

    @property
    def budget(self) -> np.ndarray:
        """Every segment's budget ``[a, d]`` (layers ``a:a+1+d``)."""
        if self._budget is None:
            self._budget = self._budgets()
        return self._budget

    def _budgets(self) -> np.ndarray:
        model, n, w = self.model, self.model.layers, self.width
        nk = len(self.order)
        prefix = np.zeros((nk, n + 1), dtype=np.int64)
        prefix[self.codes, np.arange(n) + 1] = 1
        prefix = np.cumsum(prefix, axis=1)
        nxt = np.full((nk, n + 1), n, dtype=np.int64)  # first layer of each kind at or after a
        for a in range(n - 1, -1, -1):
            nxt[:, a] = nxt[:, a + 1]
            nxt[self.codes[a], a] = a
        rank = np.argsort(nxt[:, :n].T, axis=1, kind="stable")  # [a, r]: kinds by first appearance
        a = np.arange(n)
        ends = np.minimum(a[:, None] + 1 + np.arange(w)[None, :], n)
        static = np.array([float(model.static[k]) for k in self.order])
        total = np.zeros((n, w))
        for r in range(nk):  # group by group in order of first appearance, as budget_of adds them
            kind = rank[:, r]
            count = prefix[kind[:, None], ends] - prefix[kind, a][:, None]
            total = total + count * static[kind][:, None]
        return (model.capacity - model.reserved) - total

    def values(self, pattern: Pattern) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``f[j, slot]``, ``b[j, slot]`` (forward, backward) and ``m[i, j, slot]`` (bytes at ``ks[i]``)
        of layer j running the option of each slot of ``pattern`` (other layers their only option)."""
        slots = pattern.slots
        f, b = np.empty((len(self.order), len(slots))), np.empty((len(self.order), len(slots)))
        m = np.empty((len(self.ks), len(self.order), len(slots)))
        for c, kind in enumerate(self.order):
            by_name = {getattr(o, "name", None): o for o in self.model.fronts[kind]}
            for s, entry in enumerate(slots):
                o = by_name[entry[kind]] if kind in entry else self.model.fronts[kind][0]
                f[c, s], b[c, s] = o.forward_time, o.backward_time
                m[:, c, s] = [o.memory(k) for k in self.ks]
        return f[self.codes], b[self.codes], m[:, self.codes]

    def segments(self, pattern: Pattern) -> tuple[np.ndarray, np.ndarray]:
        """Every segment's time ``[a, d]`` and bytes ``[i, a, d]`` (layers ``a:a+1+d``; ``inf`` past
        the last layer), summed layer by layer from ``a``."""
        n, w = self.model.layers, self.width
        f, b, m = self.values(pattern)
        t = f + b  # one layer's forward plus backward, then added to the running sum
        a = np.arange(n)
        times, mem = np.full((n, w), np.inf), np.full((len(self.ks), n, w), np.inf)
        acc_t, acc_m = np.zeros(n), np.zeros((len(self.ks), n))
        h, c = len(pattern.head), len(pattern.cycle)
        for d in range(w):
            j = np.minimum(a + d, n - 1)
            pos = self.D[j] - self.D[a]
            slot = np.where(pos < h, pos, h + (pos - h) % c)
            acc_t = acc_t + t[j, slot]
            acc_m = acc_m + m[:, j, slot]
            ok = a + d < n
            times[:, d] = np.where(ok, acc_t, np.inf)
            mem[:, :, d] = np.where(ok, acc_m, np.inf)
        return times, mem

    def band(self, pattern: Pattern, kidx: list) -> np.ndarray:
        """The table band ``[s, a, d]`` of one pattern: the segment's time where its bytes fit."""
        times, mem = self.segments(pattern)
        band = np.full((len(kidx), self.model.layers + 1, self.width), np.inf)
        band[:, :-1] = np.where(mem[kidx] <= self.budget[None], times[None], np.inf)
        return band

    def names(self, counts: Any, patterns: list, start: int = 0) -> list[str]:
        """Every layer's option name for segments from layer ``start`` on, segment i holding
        ``counts[i]`` layers and running ``patterns[i]``."""
        out = []
        for n, pattern in zip(counts, patterns):
            pos = 0
            for j in range(start, start + n):
                kind = self.model.kinds[j]
                if self.decoder[j]:
                    out.append(pattern.slots[pattern.slot(pos)][kind])
                    pos += 1
                else:
                    out.append(getattr(self.model.fronts[kind][0], "name", None))
            start += n
        return out


def apply(model: Any, counts: Any, patterns: Any) -> list:
    """Every layer's option name for a split whose segment i runs ``patterns[i]`` (decoder layers
    by their position in the segment; other layers their only option)."""
    dec, out, start = set(decoder_kinds(model)), [], 0
    for n, pattern in zip(counts, patterns):
        pos = 0
        for kind in model.kinds[start:start + n]:
            if kind in dec:
                out.append(pattern.slots[pattern.slot(pos)][kind])
                pos += 1
            else:
                out.append(getattr(model.fronts[kind][0], "name", None))
        start += n
    return out


def run_names(model: Any, counts: Any, names: Any, in_flight: Any = None, chunks: int = 1) -> tuple:
    """A split whose every layer runs the option named ``names[i]``: per stage its time and exact
    bytes (summed layer by layer in model order), its budget, and the :class:`PipelineChoice`
    (``FULL-GROUPED``, a later layer of a Megatron uniform group, runs FULL's time and keeps
    nothing).  ValueError for an option a kind lacks."""
    if GROUPED in names:
        model = with_grouped(model)
    counts = model.check_counts(list(counts), chunks)
    p = len(counts) // chunks
    table = model.in_flight_table(p, chunks, in_flight)
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    times, memory = [0.0] * p, [0.0] * p
    used: list[dict] = [{} for _ in range(p)]
    for c in range(chunks):
        for s in range(p):
            i = c * p + s
            for layer in range(bounds[i], bounds[i + 1]):
                kind = model.kinds[layer]
                option = next((o for o in model.fronts[kind] if getattr(o, "name", None) == names[layer]), None)
                if option is None:
                    raise ValueError(f"layer {layer} (kind {kind!r}, stage {s}) has no option named "
                                     f"{names[layer]!r}; its options: "
                                     f"{[getattr(o, 'name', o) for o in model.fronts[kind]]}")
                times[s] += option.forward_time + option.backward_time
                memory[s] += option.memory(table[s][c])
                key = (kind, table[s][c], names[layer])
                used[s][key] = (option, used[s].get(key, (option, 0))[1] + 1)
    stages = []
    for s in range(p):
        assignments = tuple(Assignment(Layers(kind, n, k), option, n) for (kind, k, _), (option, n) in used[s].items())
        stages.append(StageChoice(assignments, memory[s], times[s]))
    budgets = tuple(st.budget for st in model.stages(counts, in_flight, chunks))
    return tuple(times), tuple(memory), budgets, PipelineChoice(tuple(stages), tuple(times))


def forward_prefix(model: Any) -> tuple[np.ndarray, np.ndarray]:
    """Prefix sums over layers of each layer's least and most forward time among its options (the
    simulated score's bounds)."""
    out = []
    for pick in (min, max):
        per = {k: pick(o.forward_time for o in model.fronts[k]) for k in model.kind_order}
        out.append(np.concatenate(([0.0], np.cumsum([per[k] for k in model.kinds]))))
    return out[0], out[1]


def _score(name: str, model: Any, stage_times: Any, stages: int = 1) -> Any:
    if name == "slowest":
        return Slowest()
    if name == "1f1b":
        return ClosedForm(model.micro_batches, 0.0)
    return Simulated(model.micro_batches, stage_times, *forward_prefix(model), stages=stages)


def in_order(model: Any, counts: Any, names: list, levels: dict) -> list:
    """Names with each (virtual) stage's decoder layers of a kind in the framework's order (full
    first, then both, then one, then none), so that its first-layers rule gives them."""
    out, start = list(names), 0
    dec = set(decoder_kinds(model))
    for n in counts:
        for kind in dec:
            idx = [j for j in range(start, start + n) if model.kinds[j] == kind]
            ranked = sorted((names[j] for j in idx), key=lambda name: levels.get(name, len(levels)))
            for j, name in zip(idx, ranked):
                out[j] = name
        start += n
    return out
