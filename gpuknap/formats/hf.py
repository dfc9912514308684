"""Hugging Face ``config.json`` files: dense (Llama, Mistral, Qwen2, Qwen3) and MoE (Mixtral,
Qwen2-MoE, Qwen3-MoE, DeepSeek-V2, DeepSeek-V3) decoder models.

A config gives the model's shape; how it is trained (sequence length,
micro-batch size, tensor- and data-parallel sizes) comes from the caller.
The layers then get the analytic options of :mod:`gpuknap.costs`
(Korthikanti et al.): an embedding HEAD, ``num_hidden_layers`` decoder
layers with a gated MLP and grouped-query attention, and an output TAIL.

Only the fields below are read; a config carries many others (rope, norm,
token ids, dtype) that do not change memory or time at this level, and those
are left alone.  An optional field that is absent takes transformers' default
(:mod:`._hf_fields`); a missing required or malformed field, or a size the parallel
sizes do not divide, is a ``ValueError`` naming the file and the field.  MoE
families get dense and MoE layer kinds in model order, with the options of
:mod:`gpuknap.costs`.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Mapping

from ..costs import MAX_SIZE, Architecture, Experts, LatentAttention, Training, build, fixed, parallel_problems
from ..costs import device as costs_device
from ..engine import MEGABYTE, short
from ..search import PipelineModel
from ._documents import read_document
from ._fields import DEVICE, TRAINING, Spec, check_arguments, default_reserved, device_of
from ._hf_fields import EXPERT_FIELDS, HEAD_DIM, KV_HEADS, MLA_TYPES, MOE_TYPES, NULL_KV_IS_HEADS, OPTIONAL, check_fields, config_notes

#: Fields every dense config must give.
REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
#: Fields that size a model: a file with one of them but no ``model_type`` is a config missing it.
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
#: Most decoder layers a config may give (checked before any per-layer list is built).
MAX_CONFIG_LAYERS = 100_000


def is_config(data: Any) -> bool:
    """Whether a parsed document is a Hugging Face model config (by content)."""
    return isinstance(data, Mapping) and ("model_type" in data or "architectures" in data)


def _count(data: Mapping, key: str, where: str, default: Any = None) -> int:
    value = data.get(key, default)
    if value is None:
        raise ValueError(f"{where}: {key}: missing (a Hugging Face config of this family gives it)")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {key}: expected an integer >= 1, got {value!r}")
    if value > MAX_SIZE:  # named here, by the config's own field, before the cost model sees it
        raise ValueError(f"{where}: {key}: expected an integer from 1 to {MAX_SIZE:,}, got {value:,}")
    return value


def _moe_layout(data: Mapping, kind: str, layers: int, where: str) -> list[bool]:
    """Which decoder layers are MoE layers, per family."""
    if kind == "mixtral":
        return [True] * layers
    if kind in MLA_TYPES:
        first = _optional(data, "first_k_dense_replace", where, OPTIONAL[kind]["first_k_dense_replace"])
        freq = _optional(data, "moe_layer_freq", where, OPTIONAL[kind]["moe_layer_freq"], low=1)
        if first >= layers:
            raise ValueError(f"{where}: first_k_dense_replace: {first} dense layers leave no MoE layer of the "
                             f"{layers} (num_hidden_layers)")
        # DeepSeek's modeling_deepseek.py (and vLLM's deepseek_v2.py): MoE from layer first_k_dense_replace
        # on, where the layer's own index is a multiple of moe_layer_freq
        moe = [i >= first and i % freq == 0 for i in range(layers)]
        if not any(moe):
            raise ValueError(f"{where}: first_k_dense_replace, moe_layer_freq: no layer is a MoE layer")
        return moe
    step = _optional(data, "decoder_sparse_step", where, OPTIONAL[kind]["decoder_sparse_step"], low=1)
    only = data.get("mlp_only_layers", [])
    if only is None:
        only = []
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers
                                         for i in only):
        raise ValueError(f"{where}: mlp_only_layers: expected a list of layer indices from 0 to {layers - 1}, "
                         f"got {only!r}"[:300])
    dense = set(only)
    moe = [i not in dense and (i + 1) % step == 0 for i in range(layers)]
    if not any(moe):
        raise ValueError(f"{where}: decoder_sparse_step, mlp_only_layers: no layer is a MoE layer")
    return moe


def _optional(data: Mapping, key: str, where: str, default: int, low: int = 0) -> int:
    """An optional integer field (absent: the default), refused when it is not an integer >= low:
    a null too, which transformers' classes refuse or fail on for every field read this way."""
    value = data.get(key, default)
    if value is None:
        raise ValueError(f"{where}: {key}: expected an integer >= {low}, got null (leave the field out for "
                         f"its default, {default})")
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where}: {key}: expected an integer >= {low}, got {value!r}")
    if value > MAX_SIZE:
        raise ValueError(f"{where}: {key}: expected an integer from {low} to {MAX_SIZE:,}, got {value:,}")
    return value


def architecture(data: Any, where: str) -> Architecture:
    """The :class:`gpuknap.costs.Architecture` of a dense or MoE config (``where`` names it in errors)."""
    if not is_config(data):
        raise ValueError(f"{where}: not a Hugging Face config (no 'model_type' or 'architectures')")
    kind = check_fields(data, where)
    hidden = _count(data, "hidden_size", where)
    heads = _count(data, "num_attention_heads", where)
    layers = _count(data, "num_hidden_layers", where)
    if layers > MAX_CONFIG_LAYERS:
        raise ValueError(f"{where}: num_hidden_layers: {layers:,} is over the limit of {MAX_CONFIG_LAYERS:,} layers")
    vocab = _count(data, "vocab_size", where)
    experts, moe_layers, ffn = None, (), 0
    if kind in MOE_TYPES:
        top_k = _count(data, "num_experts_per_tok", where)
        if kind in MLA_TYPES:
            experts_key, ffn_key = "n_routed_experts", "moe_intermediate_size"
            shared_ffn = _deepseek_shared(data, kind, where) * _count(data, ffn_key, where)
        elif kind == "mixtral":
            experts_key, ffn_key, shared_ffn = "num_local_experts", "intermediate_size", 0
        else:
            experts_key, ffn_key = "num_experts", "moe_intermediate_size"
            shared_ffn = _optional(data, "shared_expert_intermediate_size", where,
                                   OPTIONAL[kind].get("shared_expert_intermediate_size", 0))
        count = _count(data, experts_key, where)
        if top_k > count:
            raise ValueError(f"{where}: num_experts_per_tok: {top_k} is more than the {count} experts ({experts_key})")
        experts = Experts(experts=count, top_k=top_k, ffn=_count(data, ffn_key, where), shared_ffn=shared_ffn,
                          shared_gate=kind == "qwen2_moe")  # built whatever the shared experts' width
        moe_layers = tuple(_moe_layout(data, kind, layers, where))
        if not all(moe_layers):
            ffn = _count(data, "intermediate_size", where)
    else:
        ffn = _count(data, "intermediate_size", where)
    latent, kv_heads, head_dim = None, None, None
    if kind in MLA_TYPES:
        # absent: transformers' 1536; null: queries projected directly (DeepSeek-V2-Lite's configs)
        q_lora = data.get("q_lora_rank", OPTIONAL[kind]["q_lora_rank"])
        latent = LatentAttention(q_lora=0 if q_lora is None else _count({"q_lora_rank": q_lora}, "q_lora_rank", where),
                                 kv_lora=_count(data, "kv_lora_rank", where),
                                 nope=_count(data, "qk_nope_head_dim", where),
                                 rope=_count(data, "qk_rope_head_dim", where), v_dim=_count(data, "v_head_dim", where))
        qk = data.get("qk_head_dim")  # transformers writes it when it saves a config: nope + rope
        if qk is not None and qk != latent.nope + latent.rope:
            raise ValueError(f"{where}: qk_head_dim: {short(qk)} is not qk_nope_head_dim + qk_rope_head_dim = "
                             f"{latent.nope + latent.rope}")
    else:
        kv_heads = data.get("num_key_value_heads", KV_HEADS[kind])
        if kv_heads is None and ("num_key_value_heads" not in data or kind in NULL_KV_IS_HEADS):
            kv_heads = heads
        if kv_heads is None:  # given as null, and the family's class keeps the null
            raise ValueError(f"{where}: num_key_value_heads: null, which {kind}'s configuration class keeps (its "
                             "attention then fails); give the number of key/value heads")
        kv_heads = _count({"num_key_value_heads": kv_heads}, "num_key_value_heads", where)
        if heads % kv_heads:
            absent = "" if "num_key_value_heads" in data else f" (absent: transformers' default for {kind!r})"
            raise ValueError(f"{where}: num_key_value_heads: {kv_heads}{absent} does not divide "
                             f"num_attention_heads={heads}")
        head_dim = data.get("head_dim", HEAD_DIM.get(kind))
        if head_dim is None and kind in ("qwen3", "qwen3_moe") and "head_dim" in data:  # transformers fails on it
            absent = HEAD_DIM[kind] if kind in HEAD_DIM else "hidden_size / num_attention_heads"
            raise ValueError(f"{where}: head_dim: null, on which {kind}'s attention fails (an absent head_dim is "
                             f"{absent}); give the head dimension or leave the field out")
        if head_dim is not None:
            head_dim = _count({"head_dim": head_dim}, "head_dim", where)
        elif hidden % heads:
            raise ValueError(f"{where}: hidden_size: {hidden} is not divisible by num_attention_heads={heads}")
    mtp = mtp_depths(data, where) if kind == "deepseek_v3" else 0
    extras = biases(data, kind, where)
    window, _ = sliding_window(data, kind, layers, where)
    tied = _flag(data, "tie_word_embeddings", False, where)  # every family's class defaults it to false
    try:
        return Architecture(layers=layers, hidden=hidden, heads=heads, vocab=vocab, ffn=ffn, head_dim=head_dim,
                            kv_heads=kv_heads, gated=True, latent=latent, experts=experts, moe_layers=moe_layers,
                            tied=tied, mtp=mtp, window=window, **extras)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _deepseek_shared(data: Mapping, kind: str, where: str) -> int:
    """DeepSeek's shared experts: ``n_shared_experts``, null for none (DeepSeek's modeling code
    builds them only when it is not None); absent, DeepSeek-V3's class default 1, while for
    DeepSeek-V2 transformers (2) and DeepSeek's own class (none) disagree: refused."""
    if "n_shared_experts" not in data and kind == "deepseek_v2":
        raise ValueError(f"{where}: n_shared_experts: missing; transformers' DeepseekV2Config defaults it to 2 "
                         "and DeepSeek's own configuration_deepseek.py to none, so give it (null for none)")
    if data.get("n_shared_experts", 0) is None:
        return 0
    return _optional(data, "n_shared_experts", where, OPTIONAL["deepseek_v3"]["n_shared_experts"])


def _flag(data: Mapping, key: str, default: bool, where: str) -> bool:
    """A true/false field of a config (absent: ``default``), refused by name when it is anything else."""
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{where}: {key}: expected true or false, got {value!r}"[:300])
    return value


def biases(data: Mapping, kind: str, where: str) -> dict:
    """The projections' biases and Qwen3's per-head query/key norms, as transformers' modeling code
    builds each family (``modeling_<family>.py``): ``attention_bias`` on Q, K, V and O (Llama,
    Qwen3; DeepSeek-V3's down-projections and O), Qwen2's Q, K, V always, Qwen2-MoE's with
    ``qkv_bias`` (default true), Llama's ``mlp_bias``; Mistral and Mixtral have none."""
    out: dict = {}
    if kind in ("llama", "qwen3", "qwen3_moe", *MLA_TYPES):
        out["qkv_bias"] = out["o_bias"] = _flag(data, "attention_bias", False, where)
    if kind == "deepseek_v2" and _flag(data, "mlp_bias", False, where):  # in the class, not in DeepSeek's code
        raise ValueError(f"{where}: mlp_bias: true is not read for deepseek_v2 (DeepSeek's MLPs have no biases)")
    elif kind == "qwen2":
        out["qkv_bias"] = True
    elif kind == "qwen2_moe":
        out["qkv_bias"] = _flag(data, "qkv_bias", True, where)
    if kind == "llama":
        out["mlp_bias"] = _flag(data, "mlp_bias", False, where)
    if kind == "qwen2" and _flag(data, "use_mrope", False, where):  # Qwen2-VL's multimodal rotary embedding
        raise ValueError(f"{where}: use_mrope: true is Qwen2-VL's multimodal rotary embedding; gpuknap reads "
                         "text-only qwen2 models (false, as Qwen2.5's published configs give it)")
    if kind in ("qwen3", "qwen3_moe"):
        out["qk_norm"] = True
    return out


def mtp_depths(data: Mapping, where: str) -> int:
    """Multi-token-prediction depths (``num_nextn_predict_layers``; absent: none), costed on the
    last stage where the Megatron settings gpuknap writes place them."""
    if data.get("num_nextn_predict_layers", 0) is None:  # transformers keeps the null: no MTP layers built
        return 0
    mtp = _optional(data, "num_nextn_predict_layers", where, 0)
    if mtp > 1000:
        raise ValueError(f"{where}: num_nextn_predict_layers: expected an integer from 0 to 1,000, got {mtp:,}")
    return mtp


#: Families with sliding-window attention: transformers' default window (``sliding_window``), and
#: whether the window needs ``use_sliding_window`` (Qwen: then only on the layers from
#: ``max_window_layers`` on, or those ``layer_types`` marks ``sliding_attention``).
WINDOWED = {"mistral": (4096, False), "mixtral": (None, False), "qwen2": (4096, True), "qwen3": (4096, True),
            "qwen2_moe": (4096, True), "qwen3_moe": (4096, True)}


#: Families whose sliding layers transformers 4.51 and 5.x choose differently: 4.51 from
#: ``max_window_layers`` on; 5.x Qwen3-MoE every layer, Qwen2-MoE the even-numbered layers below
#: ``max_window_layers`` (or ``layer_types``).  Read as partial windows (refused where they matter).
UNSETTLED_WINDOWS = ("qwen2_moe", "qwen3_moe")


def sliding_window(data: Mapping, kind: str, layers: int, where: str) -> tuple[int | None, int | None]:
    """``(window, partial)``: the sliding window every decoder layer attends with (None: the whole
    sequence), or, when only some layers slide, ``(None, window)`` (transformers' configuration
    classes: Mistral's default window 4096, Mixtral's none; Qwen's only with ``use_sliding_window``,
    default false, on layers ``i >= max_window_layers`` (default 28) unless ``layer_types`` says)."""
    if kind not in WINDOWED:
        return None, None
    default, switched = WINDOWED[kind]
    if switched and not _flag(data, "use_sliding_window", False, where):
        return None, None
    window = data.get("sliding_window", default)
    if window is None:
        return None, None
    window = _count({"sliding_window": window}, "sliding_window", where)
    if not switched:
        return window, None
    if kind == "qwen3_moe" and _optional(data, "max_window_layers", where, 28) == 0:
        return window, None  # every layer slides in 4.51 (from layer 0 on) and in 5.x (always)
    if kind in UNSETTLED_WINDOWS:  # which layers slide differs between transformers versions: not guessed
        return None, window
    types = data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or any(
                t not in ("full_attention", "sliding_attention") for t in types):
            raise ValueError(f"{where}: layer_types: expected {layers} of 'full_attention' or 'sliding_attention'")
        sliding = [t == "sliding_attention" for t in types]
    else:
        first = _optional(data, "max_window_layers", where, 28)
        sliding = [i >= first for i in range(layers)]
    if all(sliding):
        return window, None
    return (None, window) if any(sliding) else (None, None)


def check_parallel(arch: Architecture, tr: Training, where: str, family: str = "") -> None:
    """The divisibility rules Megatron applies (:func:`gpuknap.costs.parallel_problems`), the same
    for every family (ValueError naming the config's field and the flag)."""
    names = EXPERT_FIELDS.get(family, ("number of experts", "expert intermediate size", "shared experts' size"))
    problem = next(parallel_problems(arch, tr), None)
    if problem is None:
        return
    kind, *data = problem
    if kind == "divides":
        group, size, dim, value = data
        flag = {"tp": "tensor-parallel (--tp)", "ep": "expert-parallel (--ep)", "etp": "expert-tensor-parallel (--etp)"}
        key = {"heads": "num_attention_heads", "ffn": "intermediate_size", "experts": names[0], "expert_ffn": names[1],
               "shared_ffn": names[2]}
        raise ValueError(f"{where}: {key[dim]}: {value} is not divisible by the {flag[group]} size {size}")
    default = " (the TP size)" if tr.expert_tensor_parallel is None else ""
    raise ValueError(f"{where}: " + {
        "kv": f"num_key_value_heads: {arch.kv} KV heads cannot be split or replicated evenly over tensor-parallel "
              f"size {tr.tp} (--tp)",
        "dense_experts": f"expert parallelism ({'--ep' if tr.ep != 1 else '--etp'}) applies to MoE models only",
        "flex_etp": "the flex dispatcher (--dispatcher flex: DeepEP, HybridEP) is costed at expert-tensor-parallel "
                    f"size 1, and it is {tr.etp}{default}; give --etp 1",
        "stage_ranks": f"expert-parallel x expert-tensor-parallel = {tr.ep * tr.etp} (--ep, --etp) must divide the "
                       f"{tr.stage_ranks} ranks of a pipeline stage (TP x CP x DP = {tr.tp} x {tr.cp} x {tr.dp}"
                       f"{'; give the data-parallel size, --dp' if tr.dp == 1 else ''})",
        "sequence": data[0] if data else ""}[kind])


def model_of(data: Any, where: str, capacity: float, micro_batches: int, reserved: float = 0.0,
             device: Any = None, **training: Any) -> PipelineModel:
    """A :class:`PipelineModel` of a parsed config on ``device`` (a preset name or Device; None for
    the default), trained as ``training`` says (keywords of :class:`gpuknap.costs.Training`, and
    ``window``: the sliding window every layer attends with as a framework's settings run it, 0 for
    the whole sequence, instead of the config's)."""
    window = training.pop("window", None)
    flash = training.pop("flash_attention", None)  # the attention kernel a framework's settings run
    arch = architecture(data, where)
    if window is not None:
        arch = replace(arch, window=window or None)
    if flash is not None:
        arch = replace(arch, flash_attention=flash)
    try:
        tr = Training(**training)
    except (TypeError, ValueError) as exc:
        message = str(exc).replace("training.", "")
        for name, (flag, _, _) in TRAINING.items():
            message = message.replace(f"{name}=", f"{name} ({flag}) ").replace(f"{name} must", f"{name} ({flag}) must")
        raise ValueError(f"{where}: {message}") from None
    check_parallel(arch, tr, where, data.get("model_type", ""))
    kind = check_fields(data, where)
    _, partial = sliding_window(data, kind, arch.layers, where)
    if partial is not None and tr.seq > partial and window is None:  # the window matters, and is not one
        if kind in UNSETTLED_WINDOWS:
            raise ValueError(f"{where}: use_sliding_window: which layers of a {kind} model slide differs between "
                             "transformers versions (4.51: from max_window_layers on; 5.x: "
                             + ("every layer" if kind == "qwen3_moe" else "alternate layers below max_window_layers")
                             + f"), so gpuknap does not guess; at --seq {tr.seq} it matters (at --seq {partial} or "
                             "less the window changes nothing)")
        raise ValueError(f"{where}: sliding_window: only some layers attend through the {partial}-token window "
                         f"(max_window_layers, layer_types), which gpuknap does not model; at --seq {tr.seq} it "
                         f"changes their attention (at --seq {partial} or less it changes nothing)")
    return build(arch, tr, costs_device(device), capacity, micro_batches, reserved)


def spec_of(data: Mapping, path: str, capacity: Any, micro_batches: Any, stages: Any, bucket: Any,
            reserved: Any, training: dict) -> Spec:
    """The :class:`Spec` of a parsed config, the keyword arguments checked already: the device's
    memory is the capacity unless one is given, and the framework's typical overhead is reserved
    unless ``reserved`` says otherwise."""
    for name, value, flag in (("micro_batches", micro_batches, "--micro-batches"), ("seq", training.get("seq"), "--seq")):
        if value is None:
            raise ValueError(f"{path}: a Hugging Face config needs {name} ({flag}): it describes the model, "
                             "not the training run")
    dev = device_of(training)
    capacity = dev.memory if capacity is None else capacity
    reserved = default_reserved(capacity) if reserved is None else reserved
    if reserved >= capacity:
        raise ValueError(f"reserved: {reserved:,.0f} bytes reserved leave nothing of the {capacity:,.0f}-byte capacity")
    keywords = {k: v for k, v in training.items() if k not in DEVICE and k != "recompute"}
    if stages is not None:
        keywords.setdefault("pipeline_parallel", stages)
    model = model_of(data, path, capacity, micro_batches, reserved, device=dev, **keywords)
    if training.get("recompute"):
        model = fixed(model, training["recompute"], where=path)
    arch = data.get("architectures")
    name = next((n for n in (data.get("_name_or_path"), arch[0] if isinstance(arch, list) and arch else None)
                 if isinstance(n, str) and n), os.path.basename(path))
    return Spec(model, stages, 1, None, MEGABYTE if bucket is None else bucket, path, name[:80], "config",
                notes=config_notes(data, training["seq"]))


def load(path: str | os.PathLike, *, micro_batches: int, seq: int, capacity: Any = None, stages: int | None = None,
         reserved: Any = None, bucket: Any = None, **training: Any) -> Spec:
    """The :class:`gpuknap.formats.Spec` of a ``config.json`` (``.model`` is a PipelineModel).

    ``micro_batches`` and ``seq`` are required: a config says nothing about the training run.
    ``capacity`` (bytes or a string with a unit) defaults to the device's memory; ``training``
    takes ``micro_batch``, the parallel sizes (``tensor_parallel``, ``expert_parallel``,
    ``expert_tensor_parallel``, ``context_parallel``, ``data_parallel``), ``sequence_parallel``,
    the device (``device``, ``gpus_per_node``, ``efficiency``, ``device_fields``) and ``recompute``.
    """
    training = dict(training, seq=seq)
    capacity, micro_batches, stages, bucket, reserved, training = check_arguments(
        capacity, micro_batches, stages, bucket, reserved, training)
    path = os.fspath(path)
    data = read_document(path)
    if not is_config(data):
        raise ValueError(f"{path}: not a Hugging Face config (no 'model_type' or 'architectures')")
    return spec_of(data, path, capacity, micro_batches, stages, bucket, reserved, training)
