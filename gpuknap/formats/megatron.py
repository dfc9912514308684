"""Megatron-LM settings: a plan's complete arguments, and arguments read back and scored.

:func:`dump` writes every flag the plan depends on as a bash array (paste it into
a launch script, or append ``"${GPUKNAP_ARGS[@]}"`` to ``pretrain_gpt.py``'s
arguments): ``--num-layers``, the pipeline size and layout (virtual stages
included, ``m`` for MTP layers), the tensor, context, expert and
expert-tensor parallel sizes, sequence parallelism, micro-batch and global
batch sizes, sequence length, the distributed optimizer, grouped GEMM for MoE
layers, ``--mtp-num-layers``, and the one recompute setting of every stage;
then, as comments, the flags to remove from an existing script.  A plan no
single setting runs (it was not found by the framework-constrained search) is
written with the closest setting that fits, scored stage by stage.

:func:`parse_layout` reads ``--pipeline-model-parallel-layout`` exactly as
Megatron does (one level of ``(...)*N``, then ``x*N``, commas dropped; nested
groups and spaces refused) and :func:`load` reads a launch script's flags and
checks them as Megatron's ``validate_args`` and layout checks do.  Every rule
and its source is in docs/training_settings.md.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..search import GROUPED, Pattern, apply, decoder_kinds, framework_rule, with_grouped
from ._arguments import arguments
from ._settings import settings_text
from ._megatron_checks import WINDOW_CP_COMM, check_arguments, check_layout, conflicts, run_flags  # noqa: F401 - used by rank --from
from .framework import DECODER, EMBEDDING, LOSS, MTP, FrameworkPlan, evaluate, mismatches, roles

#: Longest layout written out (symbols and separators).
MAX_LAYOUT = 10_000_000
#: Modules gpuknap models, per option name (cost-modelled models).
MODULES = {"NONE": frozenset(), "SLCT": frozenset({"core_attn"}), "MOEACT": frozenset({"moe_act"}),
           "SLCT+MOEACT": frozenset({"core_attn", "moe_act"})}


def _repeat(match: re.Match, where: str, size: list) -> str:
    times = match.group(2)
    size[0] += len(match.group(1)) * (int(times) if len(times) <= 9 else MAX_LAYOUT + 1) - len(match.group(0))
    if size[0] > MAX_LAYOUT:
        raise ValueError(f"{where}: the layout is over {MAX_LAYOUT:,} symbols written out")
    return match.group(1) * int(times)


def parse_layout(layout: str, stages: int | None = None, where: str = "layout") -> list[str]:
    """The layers of every (virtual) stage in order, chunk-major: ``["Etttt", "ttttt", ..., "tttL"]``."""
    if not isinstance(where, str):
        raise ValueError(f"where: expected a string naming the layout, got {type(where).__name__}")
    if not isinstance(layout, str) or len(layout) > 100_000:
        raise ValueError(f"{where}: expected a layout string of at most 100,000 characters")
    if stages is not None and (isinstance(stages, bool) or not isinstance(stages, int) or stages < 1):
        raise ValueError(f"stages: expected an integer >= 1 (the pipeline size), got {stages!r}")
    size = [len(layout)]
    text = layout.replace(",", "")  # Megatron: commas are cosmetic; one level of groups, then symbols
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: _repeat(m, where, size), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: _repeat(m, where, size), text)
    bad = set(text) - set("EtmL|")
    if bad:
        why = (" (Megatron expands one level of (...)*N: nested or unclosed groups are refused)"
               if bad & set("()*") else "")
        raise ValueError(f"{where}: cannot read the layout: unexpected {''.join(sorted(bad))!r}{why}; symbols E, t, "
                         "m, L, '|' between stages, x*N and (...)*N repeat")
    segments = text.split("|")
    if stages is not None and len(segments) % stages:
        raise ValueError(f"{where}: {len(segments)} stages in the layout is not a multiple of "
                         f"--pipeline-model-parallel-size {stages}")
    return segments


def layout(plan: FrameworkPlan) -> str:
    """The layout string of a plan (runs written ``t*5``; its MTP layers before the loss)."""
    def stage(symbols: str) -> str:
        return "".join(run[0] if len(run) == 1 else f"{run[0]}*{len(run)}"
                       for run, _ in re.findall(r"((.)\2*)", symbols))
    segs = [seg.roles for seg in plan.segments]
    if not segs[0].startswith(EMBEDDING):  # Megatron's layout always names the embedding and the loss
        segs[0] = EMBEDDING + segs[0]
    last = segs[-1][:-1] if segs[-1].endswith(LOSS) else segs[-1]
    segs[-1] = last + MTP * plan.mtp + LOSS
    return "|".join(stage(s) for s in segs)


@dataclass(frozen=True)
class Settings:
    """Megatron settings: the layout's (virtual) stages and one recompute setting, and the run flags read."""

    stages: int
    segments: tuple  # symbols per (chunk, stage), chunk-major
    granularity: str | None  # None, "selective" or "full"
    modules: frozenset = frozenset()
    method: str | None = None  # "block" or "uniform" (full)
    num: int = 0  # --recompute-num-layers
    run: dict = field(default_factory=dict, compare=False)  # run flags read: name -> value
    mtp: int = 0
    notes: tuple = ()
    shape: dict = field(default_factory=dict, compare=False)  # the model's shape and experts stated

    @property
    def chunks(self) -> int:
        return len(self.segments) // self.stages

    def flags(self) -> list[str]:
        if self.granularity == "full":
            return ["--recompute-granularity full", f"--recompute-method {self.method}",
                    f"--recompute-num-layers {self.num}"]
        if self.granularity == "selective":
            return ["--recompute-granularity selective", "--recompute-modules " + " ".join(sorted(self.modules))]
        return []

    def pattern(self, model: Any) -> Pattern:
        """The recompute as a :class:`Pattern` over the model's decoder kinds."""
        dec = decoder_kinds(model)
        same = lambda name: dict.fromkeys(dec, name)  # noqa: E731
        if self.granularity == "full" and self.method == "block":
            return Pattern(("block", self.num), (same("FULL"),) * self.num, (same("NONE"),))
        if self.granularity == "full":
            return Pattern(("uniform", self.num), (), (same("FULL"),) + (same(GROUPED),) * (self.num - 1))
        if self.granularity == "selective":
            if getattr(model, "costs", None) is None:
                raise ValueError("--recompute-granularity selective: this profile's options were measured with "
                                 "MindFormers' recompute (its SLCT recomputes the MLP activation, not Megatron's "
                                 "core_attn); gpuknap cannot score Megatron's selective modules on it")
            entry = {}
            for k in dec:
                names = {getattr(o, "name", None) for o in model.fronts[k]}
                got = self.modules if "MOEACT" in names else self.modules - {"moe_act"}
                entry[k] = next(n for n, m in MODULES.items() if m == got)
            return Pattern(("selective", tuple(sorted(self.modules))), (), (entry,))
        return Pattern(("none",), (), (same("NONE"),))

    def split(self, model: Any) -> tuple[list[int], list[str]]:
        """``(counts, option names per layer)`` of these settings on ``model``, chunk-major."""
        role = roles(model)
        segs = [s.replace(MTP, "") for s in self.segments]
        if not role or role[0] != EMBEDDING:
            segs[0] = segs[0].replace(EMBEDDING, "", 1)
        if role[-1] != LOSS:
            segs[-1] = segs[-1][::-1].replace(LOSS, "", 1)[::-1]
        have, want = "".join(segs), "".join(role)
        if have != want:
            raise ValueError(f"the layout's layers ({have.count(DECODER)} decoder layers) are not the model's "
                             f"({want.count(DECODER)} decoder layers"
                             + (", an embedding first" if EMBEDDING in want else "")
                             + (", a loss last" if LOSS in want else "") + ")")
        empty = [i for i, s in enumerate(segs) if not s]
        if empty:
            c, s = divmod(empty[0], self.stages)
            raise ValueError(f"the layout's stage {s}" + (f" (virtual stage {c})" if self.chunks > 1 else "")
                             + " holds no layer gpuknap models (empty, or MTP layers only), which a gpuknap "
                             "split cannot have")
        counts = [len(s) for s in segs]
        pattern = self.pattern(model)
        return counts, apply(model, counts, [pattern] * len(counts))


def _setting(pattern: Pattern, plan: FrameworkPlan) -> Settings:
    kind, *value = pattern.setting
    segs = tuple(layout_segments(plan))
    if kind == "selective":
        return Settings(plan.stages, segs, "selective", frozenset(value[0]))
    if kind in ("block", "uniform"):
        return Settings(plan.stages, segs, "full", method=kind, num=value[0])
    return Settings(plan.stages, segs, None)


def layout_segments(plan: FrameworkPlan) -> list[str]:
    return parse_layout(layout(plan), plan.stages)


def candidates(plan: FrameworkPlan) -> list[tuple[Settings, Pattern]]:
    """Every single setting Megatron can set on the plan's model, in the search's order."""
    longest = max(seg.decoders for seg in plan.segments)
    return [(_setting(p, plan), p) for p in framework_rule(plan.model, "megatron", max(longest, 1)).patterns]


def _closest(plan: FrameworkPlan) -> tuple[Settings, Any]:
    """The setting that runs the plan exactly (and None), else the fastest that fits every stage
    (or the fastest) with its evaluation."""
    model = with_grouped(plan.model)
    scored = []
    for setting, pattern in candidates(plan):
        names = apply(model, plan.counts, [pattern] * len(plan.counts))
        if not mismatches(model, plan.counts, plan.names, names, plan.chunks):
            return setting, None
        ev = evaluate(model, plan.counts, names, plan.in_flight, plan.chunks)
        scored.append((not ev.feasible, ev.slowest, len(scored), setting, ev))
    if not scored:
        raise ValueError("no Megatron recompute setting can run this model's options")
    _, _, _, setting, ev = min(scored, key=lambda x: x[:3])
    return setting, ev


def dump(plan: FrameworkPlan) -> str:
    """The Megatron arguments of a plan made by :func:`gpuknap.formats.framework.framework_plan`:
    the setting that runs it exactly, else the closest one (fitting every stage's memory, then
    fastest), with a comment per stage."""
    if not isinstance(plan, FrameworkPlan):
        raise ValueError(f"plan: expected a FrameworkPlan (gpuknap.formats.framework.framework_plan), "
                         f"got {type(plan).__name__}")
    if plan.model is None:
        raise ValueError("plan: made without its model; megatron.dump scores settings on the model "
                         "(make it with framework.framework_plan)")
    run = plan.run
    micro = run.micro_batches if run is not None else plan.model.micro_batches
    if plan.chunks > 1 and micro % plan.stages:
        raise ValueError(f"micro_batches: Megatron's interleaved schedule runs a multiple of the pipeline size "
                         f"({plan.stages}) micro-batches in groups of that size; {micro} is not one")
    if run is not None and run.moe_without_sp:
        raise ValueError("sequence_parallel: Megatron's MoE layers refuse tensor parallelism without sequence "
                         "parallelism (MoELayer.forward raises when training so)")
    chosen, ev = _closest(plan)
    lines = [f"# gpuknap plan for {plan.name}: {plan.stages} pipeline stage{'' if plan.stages == 1 else 's'}"
             + (f" x {plan.chunks} virtual stages" if plan.chunks > 1 else "")
             + f", {plan.decoder_layers} decoder layers" + (f" + {plan.mtp} MTP" if plan.mtp else "")
             + (f", score {plan.score:.6g}" if plan.score is not None else "")]
    lines += [f"# {note}" for note in plan.notes]
    if run is not None:
        lines.append(f"# runs on {run.gpus} GPUs: TP {run.tp} x CP {run.cp} x DP {run.dp} x PP {run.pp} (Megatron "
                     f"takes the data-parallel size from the world size: launch {run.gpus} processes)")
    else:
        lines.append("# the profile was measured: keep the parallel sizes, micro-batch size and sequence it was "
                     f"measured with, and run {micro} micro-batches an iteration as planned (--global-batch-size "
                     f"{micro} x --micro-batch-size x the data-parallel size)")
    if run is not None and run.window and run.cp > 1:
        lines.append("# a sliding window with context parallelism: Transformer Engine takes it only over all_gather "
                     "or a2a exchanges (all_gather written); gpuknap costs the exchange as the p2p ring's bytes, "
                     "overlapped with the attention")
    if ev is not None:
        lines += _closest_comments(plan, ev)
    lines += ["GPUKNAP_ARGS=("] + [f"    {flag}" for flag in flags(plan, chosen)] + [")"]
    lines += [f"# {line}" for line in conflicts(plan, chosen)]
    return "\n".join(lines) + "\n"


def _closest_comments(plan: FrameworkPlan, ev: Any) -> list[str]:
    out = ["# Megatron sets one recompute for every stage, and no single setting runs this plan exactly;",
           "# the closest " + ("that fits every stage's memory" if ev.feasible else
                               "(NOTHING fits every stage's memory)") + f": slowest stage {ev.slowest:.6g}"]
    for i, seg in enumerate(plan.segments):
        c, s = divmod(i, plan.stages)
        wants = " ".join(f"{n}x{k}" for n, k in seg.options) or "no decoder layers"
        where = f"stage {s}" + (f" chunk {c}" if plan.chunks > 1 else "")
        after = ""
        if c == plan.chunks - 1:  # a stage's time and memory cover all its chunks
            fits = "fits" if ev.memory[s] <= ev.budgets[s] else "OVER budget"
            after = (f"; with these flags the stage takes {ev.times[s]:.6g}, "
                     f"{ev.memory[s] / 2**20:,.0f} / {ev.budgets[s] / 2**20:,.0f} MiB ({fits})")
        out.append(f"#   {where}: the plan wants {wants}{after}")
    return out


def flags(plan: FrameworkPlan, setting: Settings) -> list[str]:
    """Every flag of the plan's run, in Megatron's spelling."""
    run = plan.run
    out = [f"--num-layers {plan.decoder_layers}", f"--pipeline-model-parallel-size {plan.stages}",
           f'--pipeline-model-parallel-layout "{layout(plan)}"']
    if plan.mtp:
        out.append(f"--mtp-num-layers {plan.mtp}")
    out += list(plan.model_flags)  # the experts as the model has them: a whole run without them is dense
    if run is not None:
        out += run_flags(run)
    return out + setting.flags()


def load(path: str | os.PathLike) -> Settings:
    """Read the flags of a Megatron launch script or arguments file (docs/training_settings.md)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: expected a file path, got {type(path).__name__}")
    path = os.fspath(path)
    return load_text(settings_text(path), path)


def load_text(text: str, path: str) -> Settings:
    """:func:`load` of a text already read (``path`` names it in errors)."""
    args = arguments(text, path)
    values = check_arguments(args, path)
    segments = tuple(parse_layout(values["layout"], values["stages"], f"{path}: {values['layout_flag']}"))
    check_layout(segments, values, path)
    holding = [i for i, seg in enumerate(segments) if "m" in seg]
    if holding and holding[0] % values["stages"] != values["stages"] - 1:
        values["notes"].append(f"the layout places the MTP layers on pipeline stage {holding[0] % values['stages']}; "
                               "gpuknap costs them with the output layer, on the last stage")
    return Settings(values["stages"], segments, values["granularity"], frozenset(values["modules"]),
                    values["method"], values["num"] or 0, values["run"], values["mtp"], tuple(values["notes"]),
                    values["shape"])
