"""A MindFormers configuration's run keys, and the settings gpuknap does not model, refused by name.

Split from :mod:`._mindformers_read`.  The sources are MindFormers' (the mirror's ``mindformers/``):

- ``tools/register/template.py``: ``ParallelConfig`` defaults every size and ``micro_batch_num``
  to 1, ``RunnerConfig`` ``batch_size`` and ``gradient_accumulation_steps`` to 1,
  ``use_seq_parallel`` to false; ``MoEConfig`` has ``expert_num`` 1 and ``expert_model_parallel``
  None, and is applied to legacy models only (``_apply_template`` skips it for ``use_legacy: False``).
  A file that states its run (``data_parallel`` or ``model_parallel`` given) is read with those
  defaults for what it leaves out; a fragment leaves them to the command line.
- ``models/llama/llama_layer.py`` (``LlamaFeedForward``, which the legacy MoE models use for their
  experts) takes ``moe_config.expert_model_parallel`` as the experts' tensor-parallel size, None
  meaning ``model_parallel``, and refuses values other than 1 and ``model_parallel``;
  ``modules/transformer/moe.py`` (``MoEV2``) widens the experts' data parallelism by
  ``model_parallel / expert_model_parallel``: Megatron's expert tensor parallelism.
- ``trainer/base_trainer.py``: a micro-batch holds ``batch_size x micro_batch_interleave_num``
  samples; ``models/llama/llama.py``: ``seq_split_num`` > 1 cuts each micro-batch's sequence
  into pieces (sequence pipelining), which ``tools/check_rules.py`` pairs with the ``seqpipe`` and
  ``seqvpp`` schedulers of ``parallel.pipeline_config.pipeline_scheduler`` (MindSpore's default
  ``1f1b``, interleaved with ``pipeline_interleave``).
- ``parallel_core/training_graph/transformer/moe/ffn.py`` (``FFNGroupedGEMM.shard``, the only
  experts of mcore models: ``moe_module_specs.py``): the experts are split over
  ``expert_parallel`` only, never over ``model_parallel`` (Megatron's ETP 1), and
  ``expert_parallel`` divides ``data_parallel x model_parallel x context_parallel``.
- ``models/llama/llama_config.py``: ``model_config.pipeline_stage: {start_stage, stage_num,
  offset}`` replaces the offsets and, through ``LayerSetting`` (``models/utils.py``), the stage
  count when ``start_stage + stage_num <= parallel_config.pipeline_stage``; otherwise it is unused.
"""
from __future__ import annotations

from typing import Any

from ._documents import check_keys

#: parallel_config sizes read -> (run key, largest value); MindFormers' default for each is 1.
SIZES = (("data_parallel", "dp", 10**6), ("model_parallel", "tp", 4096), ("context_parallel", "cp", 4096),
         ("expert_parallel", "ep", 4096))
MOST = 10**6  # micro-batches, samples per micro-batch
#: mcore model_config names of the routed experts' count (transformer_config_utils.py maps each to
#: num_moe_experts).
MCORE_EXPERTS = ("num_moe_experts", "n_routed_experts", "num_experts", "expert_num")


#: ``MoEConfig``'s keyword arguments (``modules/transformer/moe.py``), the union over MindFormers
#: v0.6.0 to master: legacy models build ``MoEConfig(**moe_config)`` (``core/parallel_config.py``),
#: which takes no other key (no ``**kwargs``); mcore models skip the section (``template.py``).
MOE_CONFIG = ("aux_loss_factor", "aux_loss_factors", "aux_loss_types", "balance_via_topk_bias",
              "callback_moe_droprate", "capacity_factor", "cold_token_percent", "comp_comm_parallel",
              "comp_comm_parallel_degree", "cur_layer", "dispatch_global_max_bs", "enable_cold_hot_expert",
              "enable_deredundency", "enable_gmm_safe_tokens", "enable_sdrop", "ep_extend_tp", "expert_group_size",
              "expert_model_parallel", "expert_num", "first_k_dense_replace", "group_wise_a2a", "hot_expert_num",
              "max_router_load", "moe_intermediate_size", "moe_module_name", "moe_shared_expert_overlap", "n_group",
              "norm_topk_prob", "npu_nums_per_device", "num_experts_chosen", "routed_scaling_factor",
              "router_dense_type", "routing_policy", "save_token_distribution", "shared_expert_num",
              "topk_bias_update_rate", "topk_group", "topk_method", "update_step", "use_allgather_dispatcher",
              "use_fused_ops_permute", "use_fused_ops_topkrouter", "use_gating_sigmoid", "use_gmm",
              "use_shared_expert_gating", "z_loss_factor")


def check_moe_config(data: dict, path: str, legacy: bool, notes: list) -> None:
    """``moe_config``'s keys as MindFormers takes them: MoEConfig's arguments for legacy models
    (an unknown key is a TypeError there), not read at all by mcore ones (a note)."""
    moe = data.get("moe_config")
    if moe is None:
        return
    if not isinstance(moe, dict):
        raise ValueError(f"{path}: moe_config: expected a mapping")
    if not legacy:
        if moe:
            notes.append("moe_config is not read by mcore models (use_legacy: False; template.py skips it): their "
                         "experts are set in model.model_config")
        return
    for key in moe:
        if key not in MOE_CONFIG:
            try:
                check_keys({key: None}, MOE_CONFIG, "moe_config")
            except ValueError as exc:
                why = str(exc).split(";", 1)[0]
            raise ValueError(f"{path}: {why}: MindFormers builds MoEConfig(**moe_config) "
                             "(modules/transformer/moe.py), which refuses unknown keys")


def integer(value: Any, path: str, key: str, low: int, high: int) -> int:
    """``value`` as an integer from ``low`` to ``high``, or ValueError naming the file and the key."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{path}: {key}: expected an integer from {low} to {high:,}, got {value!r}"[:300])
    return value


def _switch(value: Any, path: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{path}: {key}: expected true or false, got {value!r}"[:300])
    return value


def _get(data: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


#: ``ContextParallelAlgo`` (``modules/transformer/transformer.py``): ``colossalai_cp`` (the ring
#: attention gpuknap costs) is the default.
CP_ALGOS = ("colossalai_cp", "ulysses_cp", "hybrid_cp")


def check_unmodelled(data: dict, path: str) -> None:
    """Refuse sequence pipelining, schedulers other than 1F1B and Ulysses context parallelism."""
    pc = data.get("parallel_config") or {}
    algo, key = pc.get("context_parallel_algo", "colossalai_cp"), "parallel_config.context_parallel_algo"
    if algo not in CP_ALGOS:  # ContextParallelAlgo(context_parallel_algo) raises ValueError
        raise ValueError(f"{path}: {key}: {algo!r} is not one of MindFormers' {', '.join(CP_ALGOS)} "
                         "(ContextParallelAlgo, modules/transformer/transformer.py)"[:400])
    cp, degree = pc.get("context_parallel", 1), pc.get("ulysses_degree_in_cp", 1)
    if cp != 1 and (algo == "ulysses_cp" or (algo == "hybrid_cp" and degree != 1)):  # cp 1: it takes no effect
        raise ValueError(f"{path}: {key}: {algo}" + (f" (ulysses_degree_in_cp {degree!r})" if algo == "hybrid_cp"
                                                     else "") + ": Ulysses context parallelism (all-to-all of the "
                         "heads) is not modelled; gpuknap costs the default ring, colossalai_cp"[:400])
    split = pc.get("seq_split_num", 1)
    if isinstance(split, bool) or split != 1:
        raise ValueError(f"{path}: parallel_config.seq_split_num: {split!r}: sequence pipelining (each "
                         "micro-batch's sequence cut into pieces, models/llama/llama.py) is not modelled; gpuknap "
                         "costs whole-sequence micro-batches (seq_split_num: 1)"[:400])
    pipeline = _get(data, "parallel.pipeline_config")
    if isinstance(pipeline, dict) and "pipeline_scheduler" in pipeline and pipeline["pipeline_scheduler"] != "1f1b":
        given = pipeline["pipeline_scheduler"]
        raise ValueError(f"{path}: parallel.pipeline_config.pipeline_scheduler: "
                         + ("null is not a scheduler" if given is None else f"{given!r} is not modelled")
                         + "; gpuknap costs MindSpore's default '1f1b' (interleaved with pipeline_interleave: "
                           "True)"[:400])


def model_offset(config: dict, data: dict, path: str, stages: int, legacy: bool) -> tuple:
    """``(offset, its key, notes)`` that LayerSetting takes: ``model_config.pipeline_stage``'s where
    LlamaConfig replaces ``offset`` with it, else ``model_config.offset``."""
    given, key = config.get("pipeline_stage"), "model.model_config.pipeline_stage"
    plain = (config.get("offset", 0), "model.model_config.offset", [])
    if given is None:
        return plain
    if not legacy:
        raise ValueError(f"{path}: {key}: mcore models (use_legacy: False) take it as another name of the pipeline "
                         "size (transformer_config_utils.py), not LlamaConfig's {start_stage, stage_num, offset}; "
                         "give the stages in parallel_config.pipeline_stage only")
    if not isinstance(given, dict) or not {"start_stage", "stage_num", "offset"} <= set(given):
        raise ValueError(f"{path}: {key}: expected a mapping of start_stage, stage_num and offset (LlamaConfig reads "
                         f"all three), got {given!r}"[:300])
    kind = config.get("type")
    if kind != "LlamaConfig":
        raise ValueError(f"{path}: {key}: LlamaConfig (llama_config.py) replaces the offsets and the stage count with "
                         f"it; gpuknap cannot tell what {kind!r} does with it: give model.model_config.offset instead")
    start = integer(given["start_stage"], path, f"{key}.start_stage", 0, 10**6)
    count = integer(given["stage_num"], path, f"{key}.stage_num", 0, 10**6)
    if start + count > stages:  # llama_config.py: the mapping is then unused, offset stays
        note = (f"{key} is not used: start_stage + stage_num = {start + count} is more than "
                f"parallel_config.pipeline_stage ({stages}), so LlamaConfig keeps offset")
        return plain[0], plain[1], [note]
    if count not in (0, stages):  # LayerSetting: stage_num 0 is every stage from stage 0
        raise ValueError(f"{path}: {key}: the model's layers on {count} of the {stages} stages (from stage {start}), "
                         "the others holding none, is not modelled: gpuknap lays the model over every stage")
    return given["offset"], f"{key}.offset", []


def run_keys(data: dict, config: dict, path: str, stages: int, legacy: bool) -> dict:
    """The run keys given (MindFormers' defaults for what a file stating its run leaves out), checked
    and named by their key.  With one pipeline stage MindFormers resets ``micro_batch_num`` to 1 and
    accumulates ``runner_config.gradient_accumulation_steps`` micro-batches instead
    (``base_trainer.py``), and keeps the embedding whole on every model-parallel rank unless
    ``vocab_emb_dp`` is false (it sets it false itself only with more stages:
    ``core/parallel_config.py``)."""
    pc, runner, out = data.get("parallel_config") or {}, data.get("runner_config") or {}, {}
    whole = "data_parallel" in pc or "model_parallel" in pc
    defaulted = {}  # run key -> why, for the command line's refusal of a flag that says otherwise

    def default(name: str, key: str) -> None:
        defaulted[name] = f"MindFormers' default: the file states its run but gives no {key}, template.py"

    for key, name, high in SIZES:
        if key in pc or whole:
            out[name] = integer(pc.get(key, 1), path, f"parallel_config.{key}", 1, high)
            if key not in pc:
                default(name, f"parallel_config.{key}")
    if stages > 1 and ("micro_batch_num" in pc or whole):
        out["micro_batches"] = integer(pc.get("micro_batch_num", 1), path, "parallel_config.micro_batch_num", 1, MOST)
        if "micro_batch_num" not in pc:
            default("micro_batches", "parallel_config.micro_batch_num")
    steps = runner.get("gradient_accumulation_steps")
    if stages == 1 and (steps is not None or whole):
        out["micro_batches"] = integer(1 if steps is None else steps, path,
                                       "runner_config.gradient_accumulation_steps", 1, MOST)
        if steps is None:
            default("micro_batches", "runner_config.gradient_accumulation_steps")
    if stages == 1 and (whole or "vocab_emb_dp" in pc):
        out["vocab_emb_dp"] = _switch(pc.get("vocab_emb_dp", True), path, "parallel_config.vocab_emb_dp")
    if "use_seq_parallel" in pc or whole:
        out["sequence_parallel"] = _switch(pc.get("use_seq_parallel", False), path, "parallel_config.use_seq_parallel")
    if "batch_size" in runner or whole:
        out["micro_batch"] = integer(runner.get("batch_size", 1), path, "runner_config.batch_size", 1, MOST)
        if "batch_size" not in runner:
            default("micro_batch", "runner_config.batch_size")
    # base_trainer.py: a micro-batch holds batch_size x micro_batch_interleave_num samples, which
    # MindSpore's MicroBatchInterleaved runs as that many slices, each one's communication beside the
    # next one's computation: costed as one micro-batch of them all (its activations are all kept),
    # the overlap not counted
    slices = integer(data.get("micro_batch_interleave_num", 1), path, "micro_batch_interleave_num", 1, 1024)
    if slices > 1:
        if "micro_batch" not in out:
            raise ValueError(f"{path}: micro_batch_interleave_num: {slices} multiplies runner_config.batch_size, "
                             "which the file does not give; give it")
        out["micro_batch"] *= slices
    if "seq_length" in config:
        out["seq"] = integer(config["seq_length"], path, "model.model_config.seq_length", 1, 10**7)
    if "use_flash_attention" in config or whole:  # legacy LlamaConfig defaults it to False, mcore MFModelConfig True
        out["flash_attention"] = _switch(config.get("use_flash_attention", not legacy), path,
                                         "model.model_config.use_flash_attention")
        if "use_flash_attention" not in config and legacy:
            defaulted["flash_attention"] = "legacy models default use_flash_attention to False (llama_config.py)"
    moe = data.get("moe_config")
    experts = [k for k in MCORE_EXPERTS if isinstance(config.get(k), int) and not isinstance(config.get(k), bool)
               and config[k] > 1]
    if not legacy and experts:  # parallel_core/training_graph/transformer/moe/ffn.py (FFNGroupedGEMM.shard)
        out["etp"] = 1
        defaulted["etp"] = ("mcore's grouped-GEMM experts split over expert_parallel only, never over "
                            "model_parallel (FFNGroupedGEMM.shard in moe/ffn.py)")
    # a legacy MoE file (expert_num > 1), or a block for one (gpuknap's writes expert_model_parallel alone)
    if legacy and isinstance(moe, dict) and (integer(moe.get("expert_num", 1), path, "moe_config.expert_num",
                                                     1, 10**6) > 1 or set(moe) == {"expert_model_parallel"}):
        out.update(_expert_tp(moe.get("expert_model_parallel"), out.get("tp"), path))
        if "etp" in out and moe.get("expert_model_parallel") is None:
            defaulted["etp"] = ("moe_config.expert_model_parallel not given: the experts split over model_parallel, "
                                "llama_layer.py")
    optimizer = _get(data, "parallel.enable_parallel_optimizer")
    if optimizer is not None:
        _switch(optimizer, path, "parallel.enable_parallel_optimizer")
    if optimizer is not None or whole:
        out["distributed_optimizer"] = bool(optimizer)
    _shard_size(data, out, path)
    if defaulted:
        out["defaulted"] = defaulted
    return out


def _shard_size(data: dict, run: dict, path: str) -> None:
    """``parallel.parallel_optimizer_config.optimizer_weight_shard_size``: MindSpore shards the optimizer
    over groups of that many data-parallel ranks (-1, the default: all of them); gpuknap costs it
    sharded over every data- and context-parallel rank, so only a size covering them is read."""
    key = "parallel.parallel_optimizer_config.optimizer_weight_shard_size"
    size = _get(data, key)
    if size is None or size == -1 and not isinstance(size, bool) or not run.get("distributed_optimizer"):
        return  # without the parallel optimizer nothing is sharded (refused on DP > 1 by the command)
    size = integer(size, path, key, -1, 10**6)
    ranks = run.get("dp", 1) * run.get("cp", 1) if "dp" in run else None
    if size == 0 or ranks is None or size < ranks:
        over = (f"its {ranks} data- and context-parallel ranks" if ranks is not None else
                "all data-parallel ranks (the file gives no parallel_config.data_parallel)")
        raise ValueError(f"{path}: {key}: {size}: the optimizer sharded over groups of {size} ranks is not modelled; "
                         f"gpuknap costs it sharded over {over}, as -1 (MindSpore's default) does")


def _expert_tp(value: Any, tp: int | None, path: str) -> dict:
    """The experts' tensor-parallel size of a legacy MoE model: ``expert_model_parallel``, None
    meaning ``model_parallel`` (llama_layer.py, which refuses other values than 1 and it)."""
    key = "moe_config.expert_model_parallel"
    if value is None:
        return {} if tp is None else {"etp": tp}
    value = integer(value, path, key, 1, 4096)
    if value != 1 and value != tp:
        said = (f"model_parallel ({tp})" if tp is not None else
                "parallel_config.model_parallel, which this file does not give")
        raise ValueError(f"{path}: {key}: {value}: MindFormers takes 1 or {said} here (llama_layer.py refuses "
                         "other values)")
    return {"etp": value}
