"""Reading a MindFormers configuration back: the pipeline split, the recompute counts and the run.

The rules are MindFormers' own (docs/training_settings.md has each with its source):

- ``parallel_config``, ``recompute_config`` and ``runner_config`` are closed mappings in
  MindFormers' config template (``tools/register/template.py``): an unknown key is refused,
  with the nearest known one.  The top of the file and ``model.model_config`` are open: a key
  close to one gpuknap reads is refused as misspelt (``offest``, ``pp_interleave_nun``).
- ``LayerSetting`` (legacy ``models/utils.py``; mcore
  ``parallel_core/training_graph/transformer/utils.py``) takes ``pp_interleave_num`` only when
  ``parallel.pipeline_config.pipeline_interleave`` is true, else one chunk; ``offset`` is a number,
  a list of ``pipeline_stage`` or ``[pp_interleave_num][pipeline_stage]`` lists, and its elements
  sum to ``(num_layers + mtp) % (pipeline_stage * pp_interleave_num)``; the MTP layers
  (``mtp_depth``, mcore also ``mtp_num_layers`` or ``num_nextn_predict_layers``) are the last
  layers, counted with the decoder layers; a recompute value is a switch, a list of
  ``pipeline_stage`` counts (spread over the chunks one layer at a time, ``_alloc_recompute_layer``)
  or ``[chunk][stage]`` counts, each kept within the stage's layers; a layer recomputed fully
  takes no select or comm recompute.
- legacy models read the three lists from ``recompute_config``; mcore models (``use_legacy:
  False``) read ``recompute`` from there and ``select_recompute`` and ``select_comm_recompute``
  from ``model.model_config`` (``parallel_core/transformer_config_utils.py`` converts only
  ``recompute`` from the recompute configuration).
- ``tools/check_rules.py``: a flat recompute list has at most ``pipeline_stage`` entries;
  ``models/modeling_utils.py``: at least as many layers as stages (times chunks when interleaved).
- the run keys, MindFormers' defaults for a file that states its run, the experts' tensor-parallel
  size, interleaved micro-batches and the settings refused as not modelled (sequence pipelining,
  schedulers other than 1F1B, LlamaConfig's ``pipeline_stage`` over part of the pipeline) are in
  :mod:`._mindformers_checks`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..search import MAX_LAYERS
from ._documents import check_keys
from ._mindformers_checks import check_moe_config, check_unmodelled, model_offset, run_keys
from ._mindformers_checks import integer as _integer
from ._settings import check_misspelt, parse_document, settings_text
from ._stated_shape import MODEL_KEYS, MODEL_KNOWN
from ._stated_shape import mindformers as stated_shape
from .framework import DECODER, EMBEDDING, LOSS, roles

TYPES = ("NONE", "SLCT", "COMM", "BOTH", "FULL")
#: Options that MindFormers cannot run side by side in one stage.
EXCLUSIVE = (("SLCT", "COMM"),)


def runs(model: Any) -> tuple:
    """The options MindFormers runs on a model: SAPP-PPB's five on measured profiles, FULL and NONE
    on cost-modelled ones (their SLCT is Megatron's core attention, not MindFormers' select)."""
    return TYPES if getattr(model, "costs", None) is None else ("NONE", "FULL")


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
    mtp: int = 0
    run: dict = field(default_factory=dict, compare=False)  # run keys read: name -> value
    notes: tuple = ()
    shape: dict = field(default_factory=dict, compare=False)  # the model's shape and experts stated

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
        allowed = set(runs(model))
        counts, names = [], []
        last = len(self.decoders) - 1
        for i, n in enumerate(self.decoders):
            head = [model.fronts[model.kinds[0]][0].name] if i == 0 and role[0] == EMBEDDING else []
            tail = [model.fronts[model.kinds[-1]][0].name] if i == last and role[-1] == LOSS else []
            used = self.types(i)
            wrong = sorted(set(used) - allowed)
            if wrong:
                raise ValueError(f"the settings run {wrong} on this model, whose options are gpuknap's cost model "
                                 "(its SLCT is Megatron's core attention, not MindFormers' select recompute of the "
                                 "MLP activation): gpuknap scores MindFormers' full recompute only here")
            counts.append(len(head) + n + len(tail))
            names.extend(head + used + tail)
        return counts, names



#: MindFormers' config template: the keys of the closed sections.
PARALLEL_CONFIG = ("data_parallel", "model_parallel", "context_parallel", "expert_parallel", "pipeline_stage",
                   "micro_batch_num", "seq_split_num", "use_seq_parallel", "optimizer_shard",
                   "gradient_aggregation_group", "vocab_emb_dp", "context_parallel_algo", "ulysses_degree_in_cp",
                   "mem_coeff")
RECOMPUTE_CONFIG = ("recompute", "select_recompute", "parallel_optimizer_comm_recompute", "select_comm_recompute",
                    "mp_comm_recompute", "recompute_slice_activation", "select_recompute_exclude",
                    "select_comm_recompute_exclude")
RUNNER_CONFIG = ("batch_size", "epochs", "sink_mode", "sink_size", "gradient_accumulation_steps", "num_classes",
                 "stop_step")
#: Sections read at the top of the file, and names of MindFormers' own close to them.
TOP = ("parallel_config", "recompute_config", "model", "parallel", "runner_config", "use_legacy", "swap_config",
       "moe_config", "micro_batch_interleave_num")
TOP_KNOWN = ("use_parallel", "mode")
#: Keys read in model.model_config.
MODEL_CONFIG = ("num_layers", "num_hidden_layers", "offset", "pp_interleave_num", "virtual_pipeline_model_parallel_size",
                "mtp_depth", "mtp_num_layers",
                "num_nextn_predict_layers", "seq_length", "select_recompute", "select_comm_recompute", "recompute",
                "pipeline_stage") + MODEL_KEYS


def _section(data: Any, path: str, dotted: str, required: bool = True) -> Any:
    for key in dotted.split("."):
        if not isinstance(data, dict) or key not in data:
            if not required:
                return None
            raise ValueError(f"{path}: {dotted}: missing")
        data = data[key]
    return data


def _per_segment(value: Any, field_: str, path: str, stages: int, chunks: int, layers: list) -> tuple:
    """A recompute value as a count per (chunk, stage), as LayerSetting formats it."""
    if isinstance(value, bool):
        return tuple(layers) if value else (0,) * len(layers)
    if isinstance(value, dict) or (isinstance(value, list) and value and all(isinstance(x, str) for x in value)):
        raise ValueError(f"{path}: {field_}: per-pattern settings are not read; give counts per stage")
    if not isinstance(value, list):
        raise ValueError(f"{path}: {field_}: expected true/false or a list of counts, got {value!r}"[:300])
    if all(isinstance(x, int) for x in value):  # a count per stage, spread over its chunks a layer at a time
        if len(value) > stages:
            raise ValueError(f"{path}: {field_}: {len(value)} counts for {stages} stages (MindFormers refuses more)")
        out = [0] * len(layers)
        for s, n in enumerate(value):
            if n < 0:
                raise ValueError(f"{path}: {field_}[{s}]: {n} is negative (MindFormers spreads a count over the "
                                 "chunks one layer at a time and never ends on a negative one)")
            n = min(10**9 if n is True else int(n), sum(layers[c * stages + s] for c in range(chunks)))
            while n:
                for c in range(chunks):
                    i = c * stages + s
                    if n and out[i] < layers[i]:
                        out[i], n = out[i] + 1, n - 1
        return tuple(out)
    if len(value) != chunks or any(not isinstance(r, (list, bool)) or (isinstance(r, list) and len(r) != stages)
                                   for r in value):
        raise ValueError(f"{path}: {field_}: expected {stages} counts or {chunks} lists of {stages}, "
                         f"got {value!r}"[:300])
    out = []
    for c, row in enumerate(value):
        for s in range(stages):
            i = c * stages + s
            x = row if isinstance(row, bool) else row[s]
            if not isinstance(x, int):
                raise ValueError(f"{path}: {field_}[{c}][{s}]: expected an integer or true/false, got {x!r}")
            if x < 0:  # as a flat list's: a negative count is a mistake, not "none"
                raise ValueError(f"{path}: {field_}[{c}][{s}]: {x} is negative; give 0 for no layer")
            out.append(layers[i] if x is True else 0 if x is False else min(x, layers[i]))
    return tuple(out)


def load(path: str | os.PathLike) -> Settings:
    """Read a MindFormers YAML (or JSON) configuration's pipeline, recompute and run keys."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: expected a file path, got {type(path).__name__}")
    path = os.fspath(path)
    return load_data(parse_document(settings_text(path), path), path)


def load_data(data: Any, path: str) -> Settings:
    """:func:`load` of a document already parsed (``path`` names it in errors)."""
    if not isinstance(data, dict):
        raise ValueError(f"{path}: parallel_config.pipeline_stage: missing (not a MindFormers configuration)")
    check_misspelt(data, TOP, TOP_KNOWN, path)
    if "base_config" in data:  # MindFormerConfig._file2dict merges the files it names under this one
        raise ValueError(f"{path}: base_config: MindFormers merges the files it names into this one, and gpuknap "
                         "reads one file: merge them into it (or give the merged configuration)")
    for name, keys in (("parallel_config", PARALLEL_CONFIG), ("recompute_config", RECOMPUTE_CONFIG),
                       ("runner_config", RUNNER_CONFIG)):
        section = data.get(name, {})
        if section is None and name == "recompute_config":  # MindFormers then takes its defaults: none
            section = {}
        if not isinstance(section, dict):
            raise ValueError(f"{path}: {name}: expected a mapping")
        try:
            check_keys(section, keys, name)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc} (MindFormers refuses unknown keys here)") from None
    if _section(data, path, "swap_config.swap", False):
        raise ValueError(f"{path}: swap_config.swap: with swap, MindFormers reads the recompute lists as layer "
                         "indices; gpuknap reads counts per stage")
    check_unmodelled(data, path)
    stages = _integer(_section(data, path, "parallel_config.pipeline_stage"), path, "parallel_config.pipeline_stage",
                      1, MAX_LAYERS)
    config = _section(data, path, "model.model_config")
    if not isinstance(config, dict):
        raise ValueError(f"{path}: model.model_config: expected a mapping")
    check_misspelt(config, MODEL_CONFIG, MODEL_KNOWN, f"{path}: model.model_config")
    legacy = data.get("use_legacy", True)
    if not isinstance(legacy, bool):
        raise ValueError(f"{path}: use_legacy: expected true or false, got {legacy!r}")
    given = [k for k in ("num_layers", "num_hidden_layers") if k in config]
    if not given or (len(given) > 1 and not legacy):
        raise ValueError(f"{path}: model.model_config.num_layers: " + ("missing" if not given else
                         "given twice (num_layers and num_hidden_layers name one setting in mcore models)"))
    num_layers = _integer(config[given[0]], path, f"model.model_config.{given[0]}", 1, MAX_LAYERS)
    mtp_keys = [k for k in (("mtp_depth",) if legacy else ("mtp_depth", "mtp_num_layers", "num_nextn_predict_layers"))
                if k in config]
    if len(mtp_keys) > 1:
        raise ValueError(f"{path}: model.model_config: {' and '.join(mtp_keys)} name one setting; keep one")
    mtp = _integer(config[mtp_keys[0]], path, f"model.model_config.{mtp_keys[0]}", 0, 1000) if mtp_keys else 0
    interleave = _section(data, path, "parallel.pipeline_config.pipeline_interleave", False)
    # mcore's TransformerConfig takes virtual_pipeline_model_parallel_size as another name of
    # pp_interleave_num (parallel_core/transformer_config_utils.py)
    vpp_keys = [k for k in ("pp_interleave_num",) + (() if legacy else ("virtual_pipeline_model_parallel_size",))
                if config.get(k) is not None]
    if len(vpp_keys) > 1:
        raise ValueError(f"{path}: model.model_config: {' and '.join(vpp_keys)} name one setting; keep one")
    vpp = vpp_keys[0] if vpp_keys else "pp_interleave_num"
    chunks = config.get(vpp, 1)
    chunks = _integer(chunks, path, f"model.model_config.{vpp}", 1, 64) if chunks is not None else 1
    notes = []
    check_moe_config(data, path, legacy, notes)
    if chunks > 1 and interleave is not True:  # LayerSetting takes one chunk without pipeline_interleave
        notes.append(f"{vpp} {chunks} is not used: parallel.pipeline_config.pipeline_interleave is "
                     "not true")
        chunks = 1
    total = num_layers + mtp
    if total < stages * chunks:
        raise ValueError(f"{path}: model.model_config.num_layers: {num_layers} layers" + (f" + {mtp} MTP" if mtp else "")
                         + f" for {stages} stages x {chunks} chunks (MindFormers needs at least one layer each)")
    offset, offset_key, more = model_offset(config, data, path, stages, legacy)
    notes += more
    layers = _layers(offset, path, stages, chunks, total, offset_key)
    rc = data.get("recompute_config") or {}
    lists = {"recompute": rc.get("recompute", False)}
    for key in ("select_recompute", "select_comm_recompute"):
        lists[key] = rc.get(key, False) if legacy else config.get(key, False)
        if legacy:
            continue
        given = rc.get(key, False) not in (False, None, 0, [])
        if key in config:  # r1.6 reads it; r1.7 and later refuse it beside recompute_config's
            notes.append(f"model.model_config.{key} read as MindFormers r1.6 reads it for mcore models (use_legacy: "
                         f"False); r1.7 and later read recompute_config.{key} instead and refuse this one "
                         "(transformer_config_utils.py: multiple configurations)")
        elif given:  # r1.7 and later read it (transformer_config_utils.py maps the recompute dict); r1.6 does not
            lists[key] = rc[key]
            notes.append(f"recompute_config.{key} read as MindFormers r1.7 and later read it for mcore models "
                         "(use_legacy: False); r1.6 ignores it (it reads model.model_config's)")
    for key in ("select_recompute_exclude", "select_comm_recompute_exclude"):
        if rc.get(key, False) not in (False, None, [], {}):
            raise ValueError(f"{path}: recompute_config.{key}: exclusions from select recompute are not modelled")
    if not legacy and "recompute" in config:
        raise ValueError(f"{path}: model.model_config.recompute: mcore models take recompute from "
                         "recompute_config and refuse it given twice")
    counts = {k: _per_segment(v, f"{'recompute_config' if k == 'recompute' or legacy else 'model.model_config'}"
                              f".{k}", path, stages, chunks, layers) for k, v in lists.items()}
    decoders = list(layers)
    decoders[-1] -= mtp  # the MTP layers are the last layer ids
    if decoders[-1] < 0:
        raise ValueError(f"{path}: {offset_key}: the last stage holds {layers[-1]} layers, fewer "
                         f"than the {mtp} MTP layers, which gpuknap places on it")
    clamp = [tuple(min(x, d) for x, d in zip(counts[k], decoders)) for k in lists]
    run = run_keys(data, config, path, stages, legacy)
    if data.get("micro_batch_interleave_num", 1) != 1:
        notes.append(f"micro_batch_interleave_num {data['micro_batch_interleave_num']}: each micro-batch holds "
                     f"{run['micro_batch']} samples, costed as one (the slices' communication overlap not counted)")
    if stages > 1 and "micro_batches" in run.get("defaulted", {}):
        notes.append("no parallel_config.micro_batch_num: MindFormers' default, one micro-batch per iteration "
                     "(template.py), is costed")
    return Settings(stages, chunks, num_layers, tuple(decoders), *clamp, mtp, run,
                    tuple(notes), stated_shape(data, config, path, legacy))


def _layers(offset: Any, path: str, stages: int, chunks: int, total: int, field_: str) -> list:
    """Layers per (chunk, stage) from ``offset`` (key ``field_``), checked as LayerSetting checks it."""
    rows = offset if isinstance(offset, list) else None
    flat = ([offset] if not isinstance(offset, list) else
            [x for r in offset for x in (r if isinstance(r, list) else [r])])
    if any(isinstance(x, bool) or not isinstance(x, int) for x in flat):
        raise ValueError(f"{path}: {field_}: expected integers, got {offset!r}"[:300])
    nested = rows is not None and any(isinstance(r, list) for r in rows)
    if rows is not None and ((not nested and len(rows) != stages) or (nested and (
            len(rows) != chunks or any(not isinstance(r, list) or len(r) != stages for r in rows)))):
        shape = f"{chunks} lists of {stages}" if nested else f"{stages} integers"
        hint = ("; for [chunk][stage] offsets set parallel.pipeline_config.pipeline_interleave: True and "
                "model.model_config.pp_interleave_num" if nested and chunks == 1 else "")
        raise ValueError(f"{path}: {field_}: expected {shape}, got {offset!r}"[:300] + hint)
    if sum(flat) != total % (stages * chunks):
        raise ValueError(f"{path}: {field_}: {offset!r} sums to {sum(flat)}; MindFormers needs the remainder of "
                         f"{total} layers over {stages * chunks} stages, {total % (stages * chunks)}")
    base = total // (stages * chunks)
    per = ([rows[c][s] for c in range(chunks) for s in range(stages)] if nested else
           [(rows[s] if rows is not None else offset) for _ in range(chunks) for s in range(stages)])
    layers = [base + o for o in per]
    if any(n < 0 for n in layers) or sum(layers) != total:
        raise ValueError(f"{path}: {field_}: {offset!r} does not give {total} layers over {stages} stages x "
                         f"{chunks} chunks (a stage would hold {min(layers)} layers, or they sum to {sum(layers)})")
    return layers
