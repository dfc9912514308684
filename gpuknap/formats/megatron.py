"""Megatron-Core settings: ``--pipeline-model-parallel-layout`` and the recompute flags.

The layout (Megatron-Core's custom pipeline layout) lists every pipeline
stage's layers, virtual stage 0 of every stage first, then virtual stage 1,
..., stages split by ``|``: ``E`` the embedding, ``t`` a decoder layer, ``m``
an MTP layer, ``L`` the loss; ``x*N`` repeats a symbol, ``(...)*N`` a
pattern, commas are ignored, empty stages are allowed.

Recompute has one setting for every stage: ``--recompute-granularity
selective --recompute-modules ...`` (each decoder layer recomputes the same
modules: ``core_attn`` is SLCT, ``moe_act`` MOEACT, both SLCT+MOEACT; dense
layers have no ``moe_act``), or ``--recompute-granularity full
--recompute-method block --recompute-num-layers N`` (the first N layers of
every virtual stage run FULL, the others NONE).  A plan that wants anything
else (counts that differ between stages, SAPP-PPB's COMM and BOTH) is
written with the closest setting that fits every stage's memory, and a
comment per stage with what the plan wanted and what the setting gives.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import Any

from ._documents import read_text
from .framework import (
    DECODER,
    EMBEDDING,
    LOSS,
    FrameworkPlan,
    evaluate,
    mismatches,
    roles,
)

#: Selective modules per option name.
MODULES = {"NONE": frozenset(), "SLCT": frozenset({"core_attn"}), "MOEACT": frozenset({"moe_act"}),
           "SLCT+MOEACT": frozenset({"core_attn", "moe_act"})}
_NAME_OF = {modules: name for name, modules in MODULES.items()}


#: Longest layout written out (symbols and separators).
MAX_LAYOUT = 10_000_000


def _repeat(part: str, times: str, where: str) -> str:
    if len(times) > 9 or len(part) * int(times) > MAX_LAYOUT:
        raise ValueError(f"{where}: the layout repeats {part!r} {times} times, over {MAX_LAYOUT:,} symbols")
    return part * int(times)


def _expand(text: str, where: str) -> str:
    """The layout with every repetition written out and commas and spaces dropped."""
    text = text.replace(",", "").replace(" ", "")
    pattern = re.compile(r"\(([^()]*)\)\*(\d+)")
    for _ in range(1000):  # innermost parentheses first
        new = pattern.sub(lambda m: _repeat(m.group(1), m.group(2), where), text)
        if new == text:
            break
        text = new
        if len(text) > MAX_LAYOUT:
            raise ValueError(f"{where}: the layout is over {MAX_LAYOUT:,} symbols written out")
    text = re.sub(r"([EtmL])\*(\d+)", lambda m: _repeat(m.group(1), m.group(2), where), text)
    if len(text) > MAX_LAYOUT:
        raise ValueError(f"{where}: the layout is over {MAX_LAYOUT:,} symbols written out")
    bad = set(text) - set("EtmL|")
    if bad:
        raise ValueError(f"{where}: cannot read the layout: unexpected {''.join(sorted(bad))!r} "
                         "(symbols E, t, m, L; '|' between stages; x*N and (...)*N repeat)")
    return text


def parse_layout(layout: str, stages: int | None = None, where: str = "layout") -> list[str]:
    """The layers of every (virtual) stage, in order: ``["Etttt", "ttttt", ..., "tttL"]``."""
    if not isinstance(layout, str) or len(layout) > 100_000:
        raise ValueError(f"{where}: expected a layout string")
    segments = _expand(layout, where).split("|")
    if stages is not None and len(segments) % stages:
        raise ValueError(f"{where}: {len(segments)} stages in the layout is not a multiple of "
                         f"--pipeline-model-parallel-size {stages}")
    return segments


def layout(plan: FrameworkPlan) -> str:
    """The layout string of a plan (runs of a symbol written ``t*5``)."""
    def stage(symbols: str) -> str:
        return "".join(run[0] if len(run) == 1 else f"{run[0]}*{len(run)}"
                       for run, _ in re.findall(r"((.)\2*)", symbols))
    return "|".join(stage(seg.roles) for seg in plan.segments)


@dataclass(frozen=True)
class Settings:
    """Megatron settings: the layout's stages and one recompute setting."""

    stages: int
    segments: tuple  # roles per (chunk, stage), chunk-major
    granularity: str | None  # None, "selective" or "full"
    modules: frozenset = frozenset()
    full_layers: int = 0  # block method: the first N layers of each virtual stage

    @property
    def chunks(self) -> int:
        return len(self.segments) // self.stages

    def flags(self) -> list[str]:
        if self.granularity == "full":
            return ["--recompute-granularity full", "--recompute-method block",
                    f"--recompute-num-layers {self.full_layers}"]
        if self.granularity == "selective":
            return ["--recompute-granularity selective", "--recompute-modules " + " ".join(sorted(self.modules))]
        return []

    def option(self, position: int, options: list[str]) -> str:
        """The option a decoder layer at ``position`` in its virtual stage runs (its kind has ``options``)."""
        if self.granularity == "full":
            return "FULL" if position < self.full_layers else "NONE"
        if self.granularity == "selective":
            applicable = self.modules if "MOEACT" in options else self.modules - {"moe_act"}
            return _NAME_OF[frozenset(applicable)]
        return "NONE"

    def split(self, model: Any) -> tuple[list[int], list[str]]:
        """``(counts, option names per layer)`` of these settings on ``model``, chunk-major."""
        have = "".join(self.segments)
        if "m" in have:
            raise ValueError("the layout has MTP layers (m), which gpuknap does not model")
        if have != "".join(roles(model)):
            raise ValueError(f"the layout's layers ({have.count(DECODER)} decoder layers"
                             f"{', E' if EMBEDDING in have else ''}{', L' if LOSS in have else ''}) are not the "
                             f"model's (an embedding first, {roles(model).count(DECODER)} decoder layers, a loss last)")
        if any(not seg for seg in self.segments):
            raise ValueError("the layout has an empty stage, which a split of gpuknap cannot have")
        counts, names, layer = [], [], 0
        for seg in self.segments:
            counts.append(len(seg))
            position = 0
            for symbol in seg:
                options = [getattr(o, "name", None) for o in model.fronts[model.kinds[layer]]]
                if symbol == DECODER:
                    names.append(self.option(position, options))
                    position += 1
                else:
                    names.append(options[0])
                layer += 1
        return counts, names


def candidates(plan: FrameworkPlan) -> list[Settings]:
    """Every single setting worth trying for a plan's split: none, each selective module set,
    and full recompute of the first N layers for every N up to the longest virtual stage."""
    segs = tuple(s.roles for s in plan.segments)
    out = [Settings(plan.stages, segs, None)]
    out += [Settings(plan.stages, segs, "selective", m) for m in MODULES.values() if m]
    out += [Settings(plan.stages, segs, "full", full_layers=n)
            for n in range(1, max(s.decoders for s in plan.segments) + 1)]
    return out


def dump(plan: FrameworkPlan) -> str:
    """The Megatron flags of a plan (made by :func:`framework_plan`, which keeps its model): the
    setting that runs it exactly, else the closest one (fitting every stage's memory, then
    fastest), with a comment per stage."""
    model, plan_names, in_flight = plan.model, plan.names, plan.in_flight
    if model is None:
        raise ValueError("megatron.dump needs a plan made by framework_plan (it scores settings on the model)")
    lines = [f"# gpuknap plan for {plan.name}: {plan.stages} pipeline stages"
             + (f" x {plan.chunks} virtual stages" if plan.chunks > 1 else "")
             + f", {plan.decoder_layers} decoder layers (--num-layers {plan.decoder_layers})"
             + (f", score {plan.score:.6g}" if plan.score is not None else "")]
    scored = []
    for option in candidates(plan):
        try:
            counts, names = option.split(model)
            if not mismatches(model, counts, plan_names, names, option.chunks):  # runs the plan exactly
                scored = [(False, 0.0, option, None)]
                break
            ev = evaluate(model, counts, names, in_flight, option.chunks)
        except ValueError:  # the model has no option for this setting
            continue
        scored.append((not ev.feasible, ev.slowest, option, ev))
    if not scored:
        raise ValueError("no Megatron recompute setting can run this model's options")
    _, _, chosen, ev = min(scored, key=lambda x: x[:2])
    if ev is not None:
        lines.append("# Megatron sets one recompute for every stage, and no single setting runs this plan exactly;")
        lines.append("# the closest " + ("that fits every stage's memory" if ev.feasible else
                                         "(NOTHING fits every stage's memory)") + f": slowest stage {ev.slowest:.6g}")
        for i, seg in enumerate(plan.segments):
            c, s = divmod(i, plan.stages)
            wants = " ".join(f"{n}x{k}" for n, k in seg.options) or "no decoder layers"
            where = f"stage {s}" + (f" chunk {c}" if plan.chunks > 1 else "")
            if c == plan.chunks - 1:  # a stage's time and memory cover all its chunks
                fits = "fits" if ev.memory[s] <= ev.budgets[s] else "OVER budget"
                after = (f"; with these flags the stage takes {ev.times[s]:.6g}, "
                         f"{ev.memory[s] / 2**20:,.0f} / {ev.budgets[s] / 2**20:,.0f} MiB ({fits})")
            else:
                after = ""
            lines.append(f"#   {where}: the plan wants {wants}{after}")
    lines.append(f"--pipeline-model-parallel-size {plan.stages}")
    lines.append(f'--pipeline-model-parallel-layout "{layout(plan)}"')
    lines += chosen.flags()
    return "\n".join(lines) + "\n"


def load(path: str | os.PathLike) -> Settings:
    """Read the pipeline and recompute flags from a file of Megatron arguments (a launch script
    or an arguments file); other flags are left alone."""
    path = os.fspath(path)
    try:
        words = shlex.split(read_text(path), comments=True)
    except ValueError as exc:
        if str(exc).startswith(path):
            raise
        raise ValueError(f"{path}: cannot read the arguments ({exc})") from None
    args: dict[str, list[str]] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            key, _, value = word.partition("=")
            values = [value] if value else []
            for nxt in words[i + 1:]:
                if value or nxt.startswith("--"):
                    break
                values.append(nxt)
            args[key] = values
    def one(key: str, default: Any = None) -> Any:
        values = args.get(key)
        if values is None:
            if default is None:
                raise ValueError(f"{path}: {key}: missing")
            return default
        if len(values) != 1:
            raise ValueError(f"{path}: {key}: expected one value, got {values!r}")
        return values[0]
    try:
        stages = int(one("--pipeline-model-parallel-size"))
    except ValueError as exc:
        raise ValueError(str(exc) if "missing" in str(exc) else
                         f"{path}: --pipeline-model-parallel-size: expected an integer") from None
    if not 1 <= stages <= MAX_LAYOUT:
        raise ValueError(f"{path}: --pipeline-model-parallel-size: expected an integer >= 1, got {stages}")
    segments = tuple(parse_layout(one("--pipeline-model-parallel-layout"), stages,
                                  f"{path}: --pipeline-model-parallel-layout"))
    granularity = args.get("--recompute-granularity", [None])[0]
    if granularity == "full":
        method = one("--recompute-method", "uniform")
        n = one("--recompute-num-layers", "1")
        if not n.isdigit():
            raise ValueError(f"{path}: --recompute-num-layers: expected an integer, got {n!r}")
        n = int(n) if method == "block" else max(len(s) for s in segments)  # uniform: every layer recomputed
        return Settings(stages, segments, "full", full_layers=n)
    if granularity == "selective":
        modules = frozenset(args.get("--recompute-modules", ["core_attn"]))
        unknown = modules - {"core_attn", "moe_act"}
        if unknown:
            raise ValueError(f"{path}: --recompute-modules: {sorted(unknown)} are not modelled "
                             "(gpuknap models core_attn and moe_act)")
        return Settings(stages, segments, "selective", modules)
    if granularity is not None:
        raise ValueError(f"{path}: --recompute-granularity: expected full or selective, got {granularity!r}")
    return Settings(stages, segments, None)
