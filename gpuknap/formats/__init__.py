"""Formats: every file gpuknap reads or writes, one module per tool.

Owns the input documents (JSON/YAML read safely, closed mappings, quantities
with units), gpuknap's own spec files (:mod:`.spec`, which also tells the other
input kinds apart), SAPP-PPB profiles (:mod:`.sapp_ppb`), Hugging Face
``config.json`` files (:mod:`.hf`, turned into models by :mod:`gpuknap.costs`),
the settings of MindFormers (:mod:`.mindformers`) and Megatron-LM
(:mod:`.megatron`) written from a plan and read back (:mod:`.framework` holds
what they share), and the splits files of ``gpuknap rank`` (:mod:`.splitfiles`).
"""
from __future__ import annotations

import os
from typing import Any

from ..search import PipelineModel, pipeline_model
from . import _mindformers_read as mindformers_read
from . import framework, hf, megatron, mindformers, sapp_ppb, splitfiles
from ._documents import MAX_FILE_BYTES, check_keys, read_document, read_text, suggest
from ._settings import looks_like_arguments, parse_document, settings_text
from ._fields import Spec
from ._model_check import check as check_stated_model
from ._model_check import megatron_model_flags
from ._units import parse_quantity
from .spec import config_from, load_spec, pipeline_shape

#: Training frameworks whose settings ``gpuknap best --emit`` writes and ``gpuknap rank --from`` reads.
EMITTERS = {"mindformers": mindformers, "megatron": megatron}
#: Option pairs each framework cannot run in one stage (MindFormers: select and comm recompute).
EXCLUSIVE = {"mindformers": mindformers.EXCLUSIVE}
#: The options each framework can run on cost-modelled models and on measured profiles.
RUNS = {"mindformers": {"costed": frozenset({"NONE", "FULL"}), "measured": frozenset(mindformers.TYPES)},
        "megatron": {"costed": frozenset(megatron.MODULES) | {"FULL"}, "measured": frozenset({"NONE", "FULL"})}}
#: The MindFormers sections that tell a configuration from a launch script.
_MF_SECTIONS = ("parallel_config", "recompute_config", "model", "runner_config")


def restrict(model: Any, framework_name: str) -> Any:
    """The model with only the options ``framework_name`` can run on it (ValueError naming a kind
    left with none): cost-modelled models keep Megatron's modules and full recompute (MindFormers:
    full recompute), measured SAPP-PPB profiles MindFormers' five options (Megatron: full recompute)."""
    if framework_name not in EMITTERS:
        raise ValueError(f"framework_name: expected one of {', '.join(EMITTERS)}, got {framework_name!r}")
    pipeline_model(model)
    runs = RUNS[framework_name]["measured" if getattr(model, "costs", None) is None else "costed"]
    role = dict(zip(model.kinds, framework.roles(model)))
    fronts = {}
    for kind in model.kind_order:
        options = model.fronts[kind]
        if role[kind] == framework.DECODER:
            options = [o for o in options if getattr(o, "name", None) in runs]
            if not options:
                names = [getattr(o, "name", o) for o in model.fronts[kind]]
                raise ValueError(f"kind {kind!r}: none of its options {names} is one {framework_name} runs "
                                 f"({', '.join(sorted(runs))})")
        fronts[kind] = options
    return PipelineModel(model.kinds, fronts, model.static, model.capacity, model.micro_batches, model.reserved,
                         costs=model.costs)


def emit(framework_name: str, model: Any, counts: Any, choice: Any = None, name: str = "",
         score: float | None = None, in_flight: Any = None, chunks: int = 1, names: Any = None, mtp: int = 0,
         notes: Any = (), model_flags: Any = ()) -> str:
    """The settings text of a split for ``framework_name``: its layers' options given as ``names``
    (model order; each an option of its layer's kind), or taken from a solved ``choice``; ``mtp``
    MTP layers follow the decoder layers; ``notes``: comment lines (a sequence of strings);
    ``model_flags``: Megatron flags of the model's experts (:func:`megatron_model_flags`)."""
    if framework_name not in EMITTERS:
        raise ValueError(f"framework_name: expected one of {', '.join(EMITTERS)}, got {framework_name!r}")
    pipeline_model(model)
    if names is None:
        if choice is None:
            raise ValueError("choice: give the split's solved choice, or its option names (names=)")
        names = model.option_names(list(counts), choice, in_flight, chunks)
    if isinstance(model_flags, (str, bytes)) or not hasattr(model_flags, "__iter__"):
        raise ValueError(f"model_flags must be a sequence of flags, got {type(model_flags).__name__}")
    plan = framework.framework_plan(model, list(counts), list(names), chunks, name, score, in_flight, mtp, notes,
                                    model_flags)
    return EMITTERS[framework_name].dump(plan)


def _config(source: str) -> Any:
    """The Hugging Face config at ``source``, or None (not one, or unreadable)."""
    try:
        data = read_document(os.fspath(source))
    except (ValueError, TypeError):
        return None
    return data if hf.is_config(data) else None


def is_config(source: str) -> bool:
    """Whether ``source`` is a readable Hugging Face config."""
    return _config(source) is not None


def mtp_layers(source: str) -> int:
    """The multi-token-prediction layers of a Hugging Face config (``num_nextn_predict_layers``), else 0."""
    data = _config(source)
    return 0 if data is None else hf.mtp_depths(data, source)


def window_tokens(source: str) -> int | None:
    """The sliding window every layer of a Hugging Face config attends with (None: none)."""
    data = _config(source)
    if data is None:
        return None
    try:
        kind = hf.check_fields(data, source)
        return hf.sliding_window(data, kind, int(data.get("num_hidden_layers") or 0), source)[0]
    except (ValueError, TypeError):
        return None


def analytic(source: str) -> bool:
    """Whether a model file is costed by gpuknap's cost model (a Hugging Face config, or a spec
    with a ``transformer`` section) rather than giving its options (False when unreadable)."""
    try:
        data = read_document(os.fspath(source))
    except (ValueError, TypeError):
        return False
    return hf.is_config(data) or (isinstance(data, dict) and "transformer" in data
                                  and "layers_description" not in data)


def stated_data_parallel(source: str) -> int | None:
    """The data-parallel size a spec's ``transformer`` section gives (its own field, else its
    preset's), None for other inputs (a Hugging Face config says nothing of the run) or when
    the section does not read (its own error comes when the spec is loaded)."""
    try:
        data = read_document(os.fspath(source))
        if not isinstance(data, dict) or "transformer" not in data or hf.is_config(data):
            return None
        return int(config_from(data["transformer"]).data_parallel)
    except (ValueError, TypeError):
        return None


def read_settings(path: str | os.PathLike) -> Any:
    """Settings read from a framework's file, told apart by content: a YAML or JSON mapping with
    MindFormers' sections is a MindFormers configuration; a text of ``--flags`` is Megatron's."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: expected a file path, got {type(path).__name__}")
    path = os.fspath(path)
    text = settings_text(path)
    try:
        data, error = parse_document(text, path), None
    except ValueError as exc:
        data, error = None, exc
        if "given twice" in str(exc):
            raise
    if isinstance(data, dict) and isinstance(data.get("MODEL_ARGS"), dict):  # Megatron's functional tests
        raise ValueError(f"{path}: MODEL_ARGS: a Megatron functional test's model_config.yaml, whose flags its "
                         "harness writes out (tests/functional_tests/shell_test_utils/_run_training.sh); gpuknap "
                         "reads the flags themselves: write them as --flag value lines of a text file")
    if isinstance(data, dict) and (any(k in data for k in _MF_SECTIONS) or not looks_like_arguments(text)):
        return mindformers_read.load_data(data, path)
    if looks_like_arguments(text):
        return megatron.load_text(text, path)
    if error is not None and any(f"{k}:" in text for k in _MF_SECTIONS):  # a MindFormers file YAML cannot read
        raise error
    raise ValueError(f"{path}: neither Megatron arguments (no --flags) nor a MindFormers configuration "
                     "(no parallel_config or model sections)" + (f"; as YAML: {error}" if error else ""))


__all__ = [
    "framework", "hf", "megatron", "mindformers", "sapp_ppb", "splitfiles", "MAX_FILE_BYTES", "check_keys",
    "read_document", "read_text", "suggest", "Spec", "parse_quantity", "config_from", "load_spec", "pipeline_shape",
    "stated_data_parallel", "check_stated_model", "megatron_model_flags",
    "EMITTERS", "EXCLUSIVE", "RUNS", "restrict", "emit", "is_config", "mtp_layers", "window_tokens", "analytic", "read_settings",
]
