"""Other tools' formats, one module per tool: SAPP-PPB profiles, Hugging Face configs,
MindFormers and Megatron settings; ``framework`` holds what the settings formats share."""
from __future__ import annotations

import os
from typing import Any

from . import framework, megatron, mindformers

#: Training frameworks whose settings ``gpuknap best --emit`` writes and ``gpuknap rank --from`` reads.
EMITTERS = {"mindformers": mindformers, "megatron": megatron}
#: Option pairs each framework cannot run in one stage (the search keeps them apart).
EXCLUSIVE = {"mindformers": mindformers.EXCLUSIVE}
#: The options each framework can run (embedding and loss layers keep theirs).
RUNS = {"mindformers": frozenset(mindformers.TYPES), "megatron": frozenset(megatron.MODULES) | {"FULL"}}


def restrict(model: Any, framework_name: str) -> Any:
    """The model with only the options ``framework_name`` can run (ValueError naming a kind left
    with none)."""
    from ..model import PipelineModel

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
    from ..documents import read_text
    if "--pipeline-model-parallel-layout" in read_text(os.fspath(path)):
        return megatron.load(path)
    return mindformers.load(path)
