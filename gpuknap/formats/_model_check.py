"""The model a framework's settings state, checked against the model gpuknap costs (``rank --from``).

A launch script or a MindFormers configuration states the model's shape (``--hidden-size``,
``model_config.num_heads``) and its experts (``--num-experts``, ``moe_config.num_experts_chosen``);
gpuknap costs the model it is given (a Hugging Face config, or a spec's ``transformer`` section).
Where the settings state a value (read by :mod:`._stated_shape`, Megatron's defaults included for
a whole run), it must be the model's: otherwise the plan is costed for another model than the
one the settings run, and it is refused in one line naming both values and the model's field.
What the settings do not state is not checked.  A multi-latent-attention model has no key/value
heads to compare; a model whose every layer is a MoE layer has no dense MLP width (Megatron's
``--ffn-hidden-size`` is then the experts' width unless ``--moe-ffn-hidden-size`` is given, which
:mod:`._stated_shape` reads so).
"""
from __future__ import annotations

import os
from typing import Any

from . import hf
from ._documents import read_document
from ._hf_fields import EXPERT_FIELDS, MLA_TYPES
from .spec import config_from


def _layout_fields(kind: str) -> str:
    if kind == "mixtral":
        return "every layer of a mixtral model"
    if kind in MLA_TYPES:
        return "first_k_dense_replace, moe_layer_freq"
    return "decoder_sparse_step, mlp_only_layers"


def model_facts(source: str) -> tuple[dict, str] | None:
    """``({key: (value, field)}, what)`` of a Hugging Face config or a spec's transformer section
    (``what``: how messages name it), None for other models or an unreadable file (its own error
    comes when it is loaded)."""
    try:
        data = read_document(os.fspath(source))
    except (ValueError, TypeError):
        return None
    try:
        if hf.is_config(data):
            return _config_facts(data, source), "the model config"
        if isinstance(data, dict) and "transformer" in data and "layers_description" not in data:
            cfg = config_from(data["transformer"])
            kv = ("heads", "transformer.kv_heads absent") if cfg.kv_heads is None else (cfg.kv_heads,
                                                                                       "transformer.kv_heads")
            return {"hidden": (cfg.hidden, "transformer.hidden"), "heads": (cfg.heads, "transformer.heads"),
                    "kv": kv, "ffn": (cfg.ffn, "transformer.ffn"),
                    "experts": (0, "a spec's transformer section is a dense model")}, "the spec"
    except (ValueError, TypeError):
        return None
    return None


def _config_facts(data: Any, source: str) -> dict:
    arch = hf.architecture(data, source)
    kind = data.get("model_type", "")
    out = {"hidden": (arch.hidden, "hidden_size"), "heads": (arch.heads, "num_attention_heads")}
    if arch.latent is None:
        kv = "num_key_value_heads" if "num_key_value_heads" in data else "num_key_value_heads absent"
        out["kv"] = ("heads", kv) if arch.kv == arch.heads else (arch.kv, kv)
    if arch.ffn:
        out["ffn"] = (arch.ffn, "intermediate_size")
    if arch.experts is None:
        out["experts"] = (0, "a dense model")
        return out
    names = EXPERT_FIELDS.get(kind, ("experts", "moe_intermediate_size", "shared experts"))
    e = arch.experts
    out["experts"] = (e.experts, names[0])
    out["top_k"] = (e.top_k, "num_experts_per_tok")
    out["moe_ffn"] = (e.ffn, names[1])
    shared = {"deepseek_v2": "n_shared_experts x moe_intermediate_size",
              "deepseek_v3": "n_shared_experts x moe_intermediate_size"}.get(kind, names[2] or "none in a " + kind)
    out["shared"] = (e.shared_ffn, shared)
    out["moe_layers"] = (tuple(arch.moe_layers) or (True,) * arch.layers, _layout_fields(kind))
    return out


def _pattern(layers: tuple) -> str:
    """A layer pattern as Megatron's --moe-layer-freq writes it: ``([0]*3+[1]*58)``."""
    runs, i = [], 0
    while i < len(layers):
        j = i
        while j < len(layers) and layers[j] == layers[i]:
            j += 1
        runs.append(f"[{int(layers[i])}]*{j - i}")
        i = j
    return "(" + "+".join(runs) + ")"


def _describe(key: str, value: Any, facts: dict) -> str:
    if key == "kv" and value == "heads":
        heads = facts.get("heads", (None,))[0]
        return "one key/value head per attention head" + (f" ({heads})" if heads else "")
    return {"hidden": f"hidden size {value}", "heads": f"{value} attention heads", "kv": f"{value} key/value heads",
            "ffn": f"an MLP width of {value}", "experts": f"{value} experts" if value else "no experts",
            "top_k": f"{value} experts per token", "moe_ffn": f"an expert width of {value}",
            "shared": f"a shared-expert width of {value}" if value else "no shared experts",
            "moe_layers": f"MoE layers {_pattern(value)}" if isinstance(value, tuple) else str(value)}[key]


def _layers(stated: Any, count: int, said: str) -> tuple:
    """A --moe-layer-freq value as the layers it makes MoE (gpt_layer_specs.py)."""
    if isinstance(stated, int):
        if stated < 1:
            raise ValueError(f"{said}: Megatron needs a frequency of at least 1")
        return tuple(i % stated == 0 for i in range(count))
    if len(stated) != count:
        raise ValueError(f"{said}: {len(stated)} layers in the pattern, and Megatron needs one per layer; the "
                         f"model has {count} (num_hidden_layers)")
    return tuple(bool(v) for v in stated)


def check(settings: Any, source: str) -> None:
    """Refuse the first value the settings state that is not the model's (ValueError, one line)."""
    stated = getattr(settings, "shape", None) or {}
    if not stated:
        return
    found = model_facts(source)
    if found is None:
        return
    facts, what = found
    model_experts = facts["experts"][0]
    run_experts = stated.get("experts", (None,))[0]
    for key, (value, said) in stated.items():
        if key == "ffn" and "ffn" not in facts:
            continue  # every layer a MoE layer: no dense MLP (the experts' width is moe_ffn)
        if key in ("top_k", "moe_ffn", "shared", "moe_layers") and (not model_experts or run_experts == 0):
            continue  # the experts' settings of a dense model, or of a run refused below as dense
        if key not in facts:
            continue
        have, field = facts[key]
        if key == "moe_layers":
            value = _layers(value, len(have), said)
        if key == "kv" and have == "heads" and value != "heads":
            have = facts["heads"][0]
        if value == have:
            continue
        fix = ""
        if key == "experts" and not value:
            fix = f"; add --num-experts {have}" if said.startswith("no --") else ""
        if key == "moe_layers":
            fix = f"; write --moe-layer-freq \"{_pattern(have)}\""
        raise ValueError(f"{said}: {what} has {_describe(key, have, facts)} ({field}){fix}")


def megatron_model_flags(source: str) -> list[str]:
    """The Megatron flags that build a Hugging Face config's experts as gpuknap costs them (none for
    a dense model or another input): a whole run without ``--num-experts`` is a dense model, and
    Megatron's defaults (2 experts per token, no shared experts, every layer MoE) are written out."""
    found = model_facts(source)
    if found is None or not found[0]["experts"][0]:
        return []
    facts = found[0]
    out = [f"--num-experts {facts['experts'][0]}", f"--moe-router-topk {facts['top_k'][0]}",
           f"--moe-ffn-hidden-size {facts['moe_ffn'][0]}"]
    if facts["shared"][0]:
        out.append(f"--moe-shared-expert-intermediate-size {facts['shared'][0]}")
    layers = facts["moe_layers"][0]
    if not all(layers):
        out.append(f'--moe-layer-freq "{_pattern(layers)}"')
    return out
