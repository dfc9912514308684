"""What a framework's settings say of the model's shape and its experts (private; read by the
Megatron and MindFormers readers, checked against the model by :mod:`._model_check`).

Each reader returns ``{key: (value, said)}``: ``key`` one of :data:`KEYS`, ``value`` what the run
builds (an integer; for ``kv`` the string ``"heads"`` when it is one key/value head per attention
head; for ``moe_layers`` an integer frequency or a list of 0/1), ``said`` how the file says it,
for the refusal.  Only what the file states is read, and Megatron's defaults where a whole run
(a file launching ``pretrain_gpt.py`` and hiding no flag) runs a different model without them:

- ``megatron/training/arguments.py``: ``--num-experts`` None (or 0) builds a dense model;
  ``--moe-ffn-hidden-size`` defaults to ``--ffn-hidden-size``; ``--moe-layer-freq`` is an integer
  or a Python list expression of ``,``, digits, ``[]``, ``()``, ``+`` and ``*`` (``moe_freq_type``,
  ``_eval_pattern``), default 1.
- ``megatron/training/argument_utils.py`` (``core_transformer_config_from_args``):
  ``--num-query-groups`` counts only with ``--group-query-attention`` (else one key/value head
  per attention head); its argparse default is 1.
- ``megatron/core/transformer/transformer_config.py``: ``moe_router_topk`` 2; no shared experts
  unless ``moe_shared_expert_intermediate_size``; ``moe_expert_capacity_factor`` None (dropless; a
  negative one is None), ``moe_pad_expert_input_to_capacity`` refused without a capacity factor;
  ``moe_grouped_gemm`` False (a loop of per-expert GEMMs, SequentialMLP).
- ``megatron/core/models/gpt/gpt_layer_specs.py``: an integer frequency N makes layer ``i`` a MoE
  layer when ``i % N == 0``; a list gives every layer.
- MindFormers ``parallel_core/transformer_config_utils.py``: mcore models take each setting under
  any of its names (two of them given is refused); ``parallel_core/transformer_config.py``: a
  negative capacity factor is None (dropless).  Legacy models: ``model_config`` and
  ``moe_config`` (``MoEConfig``), whose experts are ``LlamaFeedForward`` of
  ``intermediate_size`` unless ``moe_intermediate_size``.
"""
from __future__ import annotations

import re
from typing import Any

KEYS = ("hidden", "heads", "kv", "ffn", "experts", "top_k", "moe_ffn", "shared", "moe_layers")
#: Longest --moe-layer-freq list (layers), and the characters Megatron's _eval_pattern allows.
MAX_PATTERN = 100_000
_PATTERN = re.compile(r"[,\d\[\]()+*]+")


def _refuse(path: str, line: int, flag: str, why: str) -> ValueError:
    return ValueError(f"{path}: line {line}: {flag}: {why}"[:500])


def layer_pattern(text: str, where: str) -> int | list:
    """``--moe-layer-freq`` as Megatron's ``moe_freq_type`` reads it: an integer, or a Python list
    expression (``([0]*3+[1]*58)``) evaluated here without ``eval``: lists of integers, ``+`` of
    lists or integers, ``*`` by an integer, parentheses."""
    if re.fullmatch(r"\d{1,9}", text):
        return int(text)
    if "[" not in text or not _PATTERN.fullmatch(text) or "**" in text:
        raise ValueError(f"{where}: {text[:60]!r}: expected an integer or a list expression such as "
                         "'([0]*3+[1]*58)' (Megatron's moe_freq_type)")
    tokens = re.findall(r"\d+|[\[\](),+*]", text)
    pos = [0]

    def peek() -> str | None:
        return tokens[pos[0]] if pos[0] < len(tokens) else None

    def take(want: str | None = None) -> str:
        tok = peek()
        if tok is None or (want is not None and tok != want):
            raise ValueError(f"{where}: {text[:60]!r}: cannot read the list expression")
        pos[0] += 1
        return tok

    def size(value: Any) -> None:
        if isinstance(value, list) and len(value) > MAX_PATTERN or isinstance(value, int) and value > 10**9:
            raise ValueError(f"{where}: {text[:60]!r}: over {MAX_PATTERN:,} layers")

    def atom() -> Any:
        tok = take()
        if tok == "(":
            value = expr()
            take(")")
            return value
        if tok == "[":
            items = []
            while peek() != "]":
                item = expr()
                if not isinstance(item, int):
                    raise ValueError(f"{where}: {text[:60]!r}: a list of lists is not a layer pattern")
                items.append(item)
                if peek() != "]":
                    take(",")
            take("]")
            return items
        if tok.isdigit():
            return int(tok)
        raise ValueError(f"{where}: {text[:60]!r}: cannot read the list expression")

    def term() -> Any:
        value = atom()
        while peek() == "*":
            take()
            other = atom()
            if isinstance(value, list) and isinstance(other, list):
                raise ValueError(f"{where}: {text[:60]!r}: a list times a list")
            if isinstance(value, list) and len(value) * other > MAX_PATTERN or \
                    isinstance(other, list) and len(other) * value > MAX_PATTERN:
                raise ValueError(f"{where}: {text[:60]!r}: over {MAX_PATTERN:,} layers")
            value = value * other
            size(value)
        return value

    def expr() -> Any:
        value = term()
        while peek() == "+":
            take()
            other = term()
            if isinstance(value, list) != isinstance(other, list):
                raise ValueError(f"{where}: {text[:60]!r}: a list plus an integer")
            value = value + other
            size(value)
        return value

    value = expr()
    if peek() is not None or not isinstance(value, list):
        raise ValueError(f"{where}: {text[:60]!r}: cannot read the list expression")
    if any(v not in (0, 1) for v in value):
        raise ValueError(f"{where}: {text[:60]!r}: a layer pattern holds 0 (dense) and 1 (MoE) only")
    return value


def megatron(args: dict, path: str, whole: bool, integer: Any) -> dict:
    """The shape and experts a Megatron run states (``integer(args, flag, path, low)`` reads a flag)."""
    out: dict = {}
    for flag, key in (("--hidden-size", "hidden"), ("--num-attention-heads", "heads"), ("--ffn-hidden-size", "ffn")):
        value = integer(args, flag, path)
        if value is not None:
            out[key] = (value, f"{flag} {value}")
    groups = integer(args, "--num-query-groups", path)
    if "--group-query-attention" in args:
        out["kv"] = (groups or 1, f"--num-query-groups {groups}" if groups else
                     "--group-query-attention without --num-query-groups (Megatron's default, 1 group)")
    elif groups is not None:
        out["kv"] = ("heads", f"--num-query-groups {groups} without --group-query-attention (Megatron then runs one "
                              "key/value head per attention head)") if whole else (groups, f"--num-query-groups {groups}")
    experts = integer(args, "--num-experts", path, 0)
    if experts is not None:
        out["experts"] = (experts, f"--num-experts {experts}" + (" (Megatron: no experts)" if not experts else ""))
    elif whole:
        out["experts"] = (0, "no --num-experts (Megatron then builds a dense model)")
    moe = bool(experts)
    top_k = integer(args, "--moe-router-topk", path)
    if top_k is not None:
        out["top_k"] = (top_k, f"--moe-router-topk {top_k}")
    elif whole and moe:
        out["top_k"] = (2, "no --moe-router-topk (Megatron's default, 2 experts per token)")
    width = integer(args, "--moe-ffn-hidden-size", path)
    if width is not None:
        out["moe_ffn"] = (width, f"--moe-ffn-hidden-size {width}")
    elif whole and moe and "ffn" in out:
        out["moe_ffn"] = (out["ffn"][0], f"no --moe-ffn-hidden-size (Megatron's experts then take --ffn-hidden-size "
                                         f"{out['ffn'][0]})")
    shared = integer(args, "--moe-shared-expert-intermediate-size", path)
    if shared is not None:
        out["shared"] = (shared, f"--moe-shared-expert-intermediate-size {shared}")
    elif whole and moe:
        out["shared"] = (0, "no --moe-shared-expert-intermediate-size (Megatron then builds no shared experts)")
    if "--moe-layer-freq" in args:
        (text,), line = args["--moe-layer-freq"]
        out["moe_layers"] = (layer_pattern(text.strip("'\""), f"{path}: line {line}: --moe-layer-freq"),
                             f"--moe-layer-freq {text}")
    elif whole and moe:
        out["moe_layers"] = (1, "no --moe-layer-freq (Megatron's default, 1: every layer a MoE layer)")
    _capacity(args, path, whole, experts)
    if whole and moe and "--moe-grouped-gemm" not in args:
        line = args["--num-experts"][1]
        raise _refuse(path, line, "--num-experts", f"{experts} without --moe-grouped-gemm: Megatron then runs the "
                      "experts one GEMM after another (SequentialMLP), which gpuknap does not model (it costs grouped "
                      "GEMM); add --moe-grouped-gemm")
    return out


def _capacity(args: dict, path: str, whole: bool, experts: int | None) -> None:
    """A capacity factor (tokens dropped, or padded to capacity) refused as not modelled."""
    if whole and not experts:  # a dense run: Megatron uses none of them
        return
    factor = None
    if "--moe-expert-capacity-factor" in args:
        (text,), line = args["--moe-expert-capacity-factor"]
        try:
            factor = float(text)
        except ValueError:
            raise _refuse(path, line, "--moe-expert-capacity-factor", f"expected a number, got {text[:40]!r}") from None
        if factor >= 0:  # transformer_config.py: a negative factor is None, dropless
            policy = args.get("--moe-token-drop-policy", (["probs"], 0))[0][0]
            pad = " padded to capacity (--moe-pad-expert-input-to-capacity)" if \
                "--moe-pad-expert-input-to-capacity" in args else ""
            raise _refuse(path, line, "--moe-expert-capacity-factor", f"{text}: each expert takes at most {text} x its "
                          f"share of the tokens, the rest dropped (--moe-token-drop-policy {policy}){pad}, which "
                          "gpuknap does not model (it costs dropless MoE); remove it")
    if "--moe-pad-expert-input-to-capacity" in args:
        raise _refuse(path, args["--moe-pad-expert-input-to-capacity"][1], "--moe-pad-expert-input-to-capacity",
                      "Megatron refuses it without a capacity factor (transformer_config.py: "
                      "moe_expert_capacity_factor must be set)")


#: MindFormers mcore names of each setting (transformer_config_utils.py), and legacy names.
MCORE = {"hidden": ("hidden_size",), "heads": ("num_heads", "num_attention_heads"),
         "kv": ("n_kv_heads", "num_key_value_heads", "num_query_groups"), "ffn": ("intermediate_size", "ffn_hidden_size"),
         "experts": ("expert_num", "n_routed_experts", "num_experts", "num_moe_experts"),
         "top_k": ("num_experts_chosen", "num_experts_per_tok", "moe_router_topk"),
         "moe_ffn": ("moe_intermediate_size", "moe_ffn_hidden_size"),
         "shared": ("moe_shared_expert_intermediate_size",),
         "capacity": ("capacity_factor", "moe_expert_capacity_factor")}
LEGACY = {"hidden": ("hidden_size",), "heads": ("num_heads",), "kv": ("n_kv_heads",),
          "ffn": ("intermediate_size", "ffn_hidden_size")}
LEGACY_MOE = {"experts": "expert_num", "top_k": "num_experts_chosen", "moe_ffn": "moe_intermediate_size"}
#: model.model_config keys read here (for the misspelling check), and MindFormers' own keys close to
#: the keys read there (its encoder-decoder and classification models' configurations).
MODEL_KEYS = tuple(sorted({k for names in (*MCORE.values(), *LEGACY.values()) for k in names}))
MODEL_KNOWN = ("decoder_intermediate_size", "decoder_num_attention_heads", "encoder_attention_heads",
               "decoder_num_hidden_layers", "num_labels")


def _whole_number(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**9:
        raise ValueError(f"{where}: expected an integer >= 0, got {value!r}"[:300])
    return value


def mindformers(data: dict, config: dict, path: str, legacy: bool) -> dict:
    """The shape and experts a MindFormers configuration states (the keys it gives only: mcore
    models may take the rest from ``pretrained_model_dir``)."""
    out: dict = {}
    for key, names in (LEGACY if legacy else MCORE).items():
        given = [n for n in names if config.get(n) is not None]
        if len(given) > 1 and not legacy:
            raise ValueError(f"{path}: model.model_config: {' and '.join(given)} name one setting (MindFormers "
                             "refuses it given twice); keep one")
        if not given:
            continue
        where = f"model.model_config.{given[0]}"
        if key == "capacity":
            factor = config[given[0]]
            if isinstance(factor, bool) or not isinstance(factor, (int, float)):
                raise ValueError(f"{path}: {where}: expected a number, got {factor!r}"[:300])
            if factor >= 0:  # parallel_core/transformer_config.py: a negative factor is None, dropless
                raise ValueError(f"{path}: {where}: {factor}: each expert takes at most {factor} x its share of the "
                                 "tokens, the rest dropped, which gpuknap does not model (it costs dropless MoE); "
                                 "remove it")
            continue
        value = _whole_number(config[given[0]], f"{path}: {where}")
        out[key] = (0 if key == "experts" and value == 1 else value, f"{where}: {value}")  # 1 expert: no MoE
    moe = data.get("moe_config")
    if legacy and isinstance(moe, dict):
        for key, name in LEGACY_MOE.items():
            if moe.get(name) is not None:
                value = _whole_number(moe[name], f"{path}: moe_config.{name}")
                out[key] = (0 if key == "experts" and value == 1 else value, f"moe_config.{name}: {value}")
        if out.get("experts", (0,))[0] and "moe_ffn" not in out and "ffn" in out:  # llama_layer.py
            out["moe_ffn"] = (out["ffn"][0], f"{out['ffn'][1]} (the experts' width, without "
                                             "moe_config.moe_intermediate_size)")
    return out
