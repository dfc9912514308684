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

from ..search import PipelineModel
from . import framework, hf, megatron, mindformers, sapp_ppb, splitfiles
from ._documents import MAX_FILE_BYTES, check_keys, read_document, read_text, suggest
from ._fields import Spec
from ._units import parse_quantity
from .spec import config_from, load_spec

#: Training frameworks whose settings ``gpuknap best --emit`` writes and ``gpuknap rank --from`` reads.
EMITTERS = {"mindformers": mindformers, "megatron": megatron}
#: Option pairs each framework cannot run in one stage (the search keeps them apart).
EXCLUSIVE = {"mindformers": mindformers.EXCLUSIVE}
#: The options each framework can run (embedding and loss layers keep theirs).
RUNS = {"mindformers": frozenset(mindformers.TYPES), "megatron": frozenset(megatron.MODULES) | {"FULL"}}


def restrict(model: Any, framework_name: str) -> Any:
    """The model with only the options ``framework_name`` can run (ValueError naming a kind left
    with none)."""
    role = dict(zip(model.kinds, framework.roles(model)))
    fronts = {}
    for kind in model.kind_order:
        options = model.fronts[kind]
        if role[kind] == framework.DECODER:
            options = [o for o in options if getattr(o, "name", None) in RUNS[framework_name]]
            if not options:
                names = [getattr(o, "name", o) for o in model.fronts[kind]]
                raise ValueError(f"kind {kind!r}: none of its options {names} is one {framework_name} runs "
                                 f"({', '.join(sorted(RUNS[framework_name]))})")
        fronts[kind] = options
    return PipelineModel(model.kinds, fronts, model.static, model.capacity, model.micro_batches, model.reserved)


def emit(framework_name: str, model: Any, counts: Any, choice: Any, name: str = "", score: float | None = None,
         in_flight: Any = None, chunks: int = 1) -> str:
    """The settings text of a solved split for ``framework_name``."""
    names = model.option_names(list(counts), choice, in_flight, chunks)
    plan = framework.framework_plan(model, list(counts), names, chunks, name, score, in_flight)
    return EMITTERS[framework_name].dump(plan)


def read_settings(path: str | os.PathLike) -> Any:
    """Settings read from a framework's file, told by its content: Megatron arguments
    (``--pipeline-model-parallel-layout``), else a MindFormers YAML or JSON configuration."""
    if "--pipeline-model-parallel-layout" in read_text(os.fspath(path)):
        return megatron.load(path)
    return mindformers.load(path)


__all__ = [
    "framework", "hf", "megatron", "mindformers", "sapp_ppb", "splitfiles", "MAX_FILE_BYTES", "check_keys",
    "read_document", "read_text", "suggest", "Spec", "parse_quantity", "config_from", "load_spec",
    "EMITTERS", "EXCLUSIVE", "RUNS", "restrict", "emit", "read_settings",
]
