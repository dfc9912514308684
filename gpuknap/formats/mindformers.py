"""MindFormers pipeline settings: ``offset`` and the recompute lists (what SAPP-PPB prints).

MindFormers (``mindformers/models/utils.py``, ``LayerSetting``) gives stage s
``num_layers // pp + offset[s]`` decoder layers (with ``pp_interleave_num:
v``, chunk c of stage s gets ``num_layers // (pp * v) + offset[c][s]``; the
offsets sum to the remainder).  Within a stage (chunk) it recomputes the
first ``recompute`` layers fully, applies selective recompute to the first
``select_recompute`` layers and communication recompute to the first
``select_comm_recompute`` layers.  gpuknap's SAPP-PPB options map onto that:

- ``recompute`` = FULL layers, ``select_recompute`` = SLCT + BOTH + FULL,
  ``select_comm_recompute`` = COMM + BOTH + FULL (per stage);
- read back, layer i of a stage runs FULL if i < recompute, BOTH if i is
  below both other counts, SLCT or COMM if below one, NONE otherwise.

So a stage cannot hold SLCT-only and COMM-only layers at once (MindFormers
would run the overlap as BOTH, with other memory): such plans are refused,
and ``gpuknap best --emit mindformers`` searches with those two kept apart.
Only plans of the five SAPP-PPB options can be written.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ..search import MAX_LAYERS
from ._documents import read_document
from .framework import DECODER, EMBEDDING, LOSS, FrameworkPlan, mismatches, roles

TYPES = ("NONE", "SLCT", "COMM", "BOTH", "FULL")
#: Options that MindFormers cannot run side by side in one stage.
EXCLUSIVE = (("SLCT", "COMM"),)


@dataclass(frozen=True)
class Settings:
    """MindFormers settings: per (chunk, stage), chunk-major, decoder layers and the three counts."""

    stages: int
    chunks: int
    num_layers: int
    decoders: tuple
    recompute: tuple
    select: tuple
    comm: tuple

    def types(self, i: int) -> list[str]:
        """The option each decoder layer of segment ``i`` runs, in order (MindFormers' prefix rule)."""
        out = []
        for j in range(self.decoders[i]):
            sel, com = j < self.select[i], j < self.comm[i]
            out.append("FULL" if j < self.recompute[i] else "BOTH" if sel and com else "SLCT" if sel
                       else "COMM" if com else "NONE")
        return out

    def split(self, model: Any) -> tuple[list[int], list[str]]:
        """``(counts, option names per layer)`` of these settings on ``model`` (its embedding on the
        first stage, its loss layer on the last), chunk-major."""
        role = roles(model)
        decoders = role.count(DECODER)
        if decoders != self.num_layers:
            raise ValueError(f"num_layers: the settings are for {self.num_layers} decoder layers, "
                             f"the model has {decoders}")
        counts, names = [], []
        last = len(self.decoders) - 1
        for i, n in enumerate(self.decoders):
            head = [model.fronts[model.kinds[0]][0].name] if i == 0 and role[0] == EMBEDDING else []
            tail = [model.fronts[model.kinds[-1]][0].name] if i == last and role[-1] == LOSS else []
            counts.append(len(head) + n + len(tail))
            names.extend(head + self.types(i) + tail)
        return counts, names


def settings(plan: FrameworkPlan) -> Settings:
    """The MindFormers settings of a plan (ValueError for what MindFormers cannot run)."""
    for name in sorted(plan.option_names()):
        if name not in TYPES:
            raise ValueError(f"option {name!r} has no MindFormers setting; MindFormers runs the SAPP-PPB "
                             f"recompute options {', '.join(TYPES)}")
    recompute, select, comm = [], [], []
    for i, seg in enumerate(plan.segments):
        c, s = divmod(i, plan.stages)
        if seg.count("SLCT") and seg.count("COMM"):
            where = f"stage {s}" + (f", chunk {c}" if plan.chunks > 1 else "")
            raise ValueError(f"{where} runs {seg.count('SLCT')} SLCT and {seg.count('COMM')} COMM layers; "
                             "MindFormers recomputes the first layers of a stage and would run them as BOTH; "
                             "search with the two kept apart (gpuknap best --emit mindformers does)")
        full = seg.count("FULL")
        recompute.append(full)
        select.append(full + seg.count("BOTH") + seg.count("SLCT"))
        comm.append(full + seg.count("BOTH") + seg.count("COMM"))
    decoders = tuple(seg.decoders for seg in plan.segments)
    out = Settings(plan.stages, plan.chunks, plan.decoder_layers, decoders, tuple(recompute), tuple(select),
                   tuple(comm))
    if plan.model is not None:  # what the first-layers rule runs, kind by kind, must be the plan
        _, ran = out.split(plan.model)
        wrong = mismatches(plan.model, plan.counts, plan.names, ran, plan.chunks)
        if wrong:
            c, s, want, got = wrong[0]
            raise ValueError(f"stage {s}" + (f" chunk {c}" if plan.chunks > 1 else "") + f": the plan runs {want}, "
                             f"but MindFormers recomputes the first layers of a stage and would run {got}; "
                             "no MindFormers setting runs this plan")
    return out


def _lists(values: tuple, stages: int, chunks: int) -> Any:
    rows = [list(values[c * stages:(c + 1) * stages]) for c in range(chunks)]
    return rows[0] if chunks == 1 else rows


def dump(plan: FrameworkPlan) -> str:
    """The settings as the YAML a MindFormers configuration takes (merge into yours)."""
    st = settings(plan)
    base = st.num_layers // (st.stages * st.chunks)
    offset = tuple(n - base for n in st.decoders)

    def show(values: tuple) -> str:
        return json.dumps(_lists(values, st.stages, st.chunks))

    lines = [f"# gpuknap plan for {plan.name}: {st.stages} pipeline stages"
             + (f" x {st.chunks} chunks" if st.chunks > 1 else "") + f", {st.num_layers} decoder layers"
             + (f", score {plan.score:.6g}" if plan.score is not None else ""),
             "# merge these keys into your MindFormers configuration",
             "parallel_config:", f"  pipeline_stage: {st.stages}",
             "model:", "  model_config:", f"    num_layers: {st.num_layers}", f"    offset: {show(offset)}"]
    if st.chunks > 1:
        lines.append(f"    pp_interleave_num: {st.chunks}")
    lines += ["recompute_config:", f"  recompute: {show(st.recompute)}", f"  select_recompute: {show(st.select)}",
              f"  select_comm_recompute: {show(st.comm)}"]
    return "\n".join(lines) + "\n"


def _section(data: Any, path: str, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            raise ValueError(f"{path}: {'.'.join(keys)}: missing")
        data = data[key]
    return data


def _per_segment(value: Any, field: str, path: str, stages: int, chunks: int, limit: tuple | None) -> tuple:
    """A count per (chunk, stage) from an int list, a [chunk][stage] list or a boolean (all of
    ``limit``); counts are kept within 0..limit as MindFormers does (no limit: as given)."""
    if isinstance(value, bool) and limit is not None:
        return tuple(limit) if value else (0,) * len(limit)
    rows = value if chunks > 1 else [value]
    if (not isinstance(rows, list) or len(rows) != chunks
            or any(not isinstance(r, list) or len(r) != stages for r in rows)):
        shape = f"{chunks} lists of {stages}" if chunks > 1 else f"a list of {stages}"
        raise ValueError(f"{path}: {field}: expected {shape} integers, got {value!r}"[:300])
    out = []
    for r in rows:
        for v in r:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{path}: {field}: expected integers, got {v!r}")
            out.append(v)
    return tuple(out) if limit is None else tuple(min(max(v, 0), cap) for v, cap in zip(out, limit))


def load(path: str | os.PathLike) -> Settings:
    """Read the pipeline and recompute settings of a MindFormers YAML (or JSON) configuration;
    its other keys are left alone."""
    path = os.fspath(path)
    data = read_document(path)
    stages = _section(data, path, "parallel_config", "pipeline_stage")
    config = _section(data, path, "model", "model_config")
    num_layers = _section(data, path, "model", "model_config", "num_layers")
    chunks = config.get("pp_interleave_num", 1)
    for field, value, high in (("parallel_config.pipeline_stage", stages, MAX_LAYERS),
                               ("model.model_config.num_layers", num_layers, MAX_LAYERS),
                               ("model.model_config.pp_interleave_num", chunks, 64)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise ValueError(f"{path}: {field}: expected an integer from 1 to {high:,}, got {value!r}")
    base = num_layers // (stages * chunks)
    offset = config.get("offset", 0)
    if isinstance(offset, int) and not isinstance(offset, bool):
        offset = [[offset] * stages for _ in range(chunks)] if chunks > 1 else [offset] * stages
    offsets = _per_segment(offset, "model.model_config.offset", path, stages, chunks, None)
    decoders = tuple(base + o for o in offsets)
    if any(n < 0 for n in decoders) or sum(decoders) != num_layers:
        raise ValueError(f"{path}: model.model_config.offset: {offset!r} does not give {num_layers} layers "
                         f"over {stages * chunks} stages (the offsets must sum to {num_layers % (stages * chunks)})")
    rc = data.get("recompute_config", {}) if isinstance(data, dict) else {}
    if not isinstance(rc, dict):
        raise ValueError(f"{path}: recompute_config: expected a mapping")
    counts = []
    for key in ("recompute", "select_recompute", "select_comm_recompute"):
        value = rc.get(key, False)
        if isinstance(value, dict):
            raise ValueError(f"{path}: recompute_config.{key}: per-pattern settings are not read; give one list")
        counts.append(_per_segment(value, f"recompute_config.{key}", path, stages, chunks, decoders))
    return Settings(stages, chunks, num_layers, decoders, *counts)
