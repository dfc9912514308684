"""Megatron-LM's and MindFormers' rules, written for the tests from the frameworks' own sources (not from
gpuknap's readers): each check names the file it comes from.  The tests cannot run the frameworks; they
run an emitted block through these checks and lay its layers out as the framework would.

Megatron (NVIDIA/Megatron-LM):
- ``megatron/training/arguments.py``: the parser (no abbreviations) and ``validate_args``;
- ``megatron/core/transformer/transformer_config.py``: the recompute and layout checks;
- ``megatron/core/transformer/pipeline_parallel_layer_layout.py``: the layout string and its checks;
- ``megatron/core/recompute.py``: which layers of a transformer block block/uniform recompute;
- ``megatron/core/pipeline_parallel/schedules.py``: the interleaved schedule's micro-batch groups.

MindFormers (mindspore-lab/mindformers):
- ``mindformers/models/utils.py`` and ``parallel_core/training_graph/transformer/utils.py``: ``LayerSetting``;
- ``mindformers/parallel_core/transformer_config_utils.py``: the mcore conversion of the model config;
- ``mindformers/core/parallel_config.py``, ``tools/register/template.py``: where the sections go, closed keys;
- ``mindformers/tools/check_rules.py`` and ``models/modeling_utils.py``: list lengths, layers per stage.
"""
from __future__ import annotations

import re
import shlex

import numpy as np

SWITCHES = {"--sequence-parallel", "--use-distributed-optimizer", "--moe-grouped-gemm",
            "--no-overlap-p2p-communication",  # store_false into overlap_p2p_comm: the overlap is on by default
            "--recompute-activations", "--account-for-embedding-in-pipeline-split",
            "--account-for-loss-in-pipeline-split", "--overlap-grad-reduce", "--overlap-param-gather",
            "--tp-comm-overlap",
            "--bf16"}  # model_parallel_config.py (bf16): without it or --fp16 Megatron trains in fp32
INTS = {"--num-layers", "--pipeline-model-parallel-size", "--tensor-model-parallel-size", "--context-parallel-size",
        "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--micro-batch-size", "--global-batch-size",
        "--seq-length", "--mtp-num-layers", "--recompute-num-layers", "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers", "--num-layers-per-virtual-pipeline-stage",
        "--num-virtual-stages-per-pipeline-rank",
        # the experts (arguments.py --num-experts; the others TransformerConfig fields through ArgumentGroupFactory)
        "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size"}
#: ``--moe-layer-freq``: arguments.py ``moe_freq_type``, an integer or a Python list expression.
STRINGS = {"--pipeline-model-parallel-layout", "--recompute-granularity", "--recompute-method",
           "--moe-token-dispatcher-type", "--moe-layer-freq"}
#: ``--moe-token-dispatcher-type``: made by arguments.py's ``ArgumentGroupFactory(TransformerConfig)`` from the
#: field's ``Literal`` (transformer_config.py, ``moe_token_dispatcher_type``, default allgather).
CHOICES = {"--recompute-granularity": ("full", "selective"), "--recompute-method": ("block", "uniform"),
           "--moe-token-dispatcher-type": ("allgather", "alltoall", "flex")}
MODULES = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts", "gdn_norm_out",
           "gdp_in_proj", "gdp_qkv", "mhc"}


def megatron_args(text: str) -> dict:
    """The flags of the ``GPUKNAP_ARGS=( ... )`` array as Megatron's parser stores them (defaults as
    in arguments.py: unset integers None, switches False, modules None)."""
    words = shlex.split(text, comments=True)
    argv = words[words.index("GPUKNAP_ARGS=(") + 1:words.index(")")]
    ns: dict = {f: False for f in SWITCHES}
    ns.update({f: None for f in INTS | STRINGS | {"--recompute-modules"}})
    i = 0
    while i < len(argv):
        flag = argv[i]
        assert flag in ns, f"arguments.py: Megatron's parser does not know {flag}"
        if flag in SWITCHES:
            ns[flag], i = True, i + 1
        elif flag == "--recompute-modules":
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            ns[flag], i = argv[i + 1:j], j
        else:
            value = argv[i + 1]
            if flag in INTS:
                value = int(value)
            if flag in CHOICES:
                assert value in CHOICES[flag], f"arguments.py: {flag} choices {CHOICES[flag]}"
            ns[flag], i = value, i + 2
    return ns


def expand_layout(text: str) -> list[str]:
    """pipeline_parallel_layer_layout.py ``parse_str_to_list``: commas dropped, one pass of
    ``(...)*N`` then one of ``x*N``, then every character must be E, L, t or m, stages split by |."""
    text = text.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    stages = text.split("|")
    for stage in stages:
        for ch in stage:
            assert ch in "ELtm", f"pipeline_parallel_layer_layout.py: invalid layer character {ch!r}"
    return stages


def megatron_validate(ns: dict, world_size: int) -> dict:
    """validate_args, TransformerConfig and the layout's checks; returns derived sizes."""
    pp, tp, cp = ns["--pipeline-model-parallel-size"] or 1, ns["--tensor-model-parallel-size"] or 1, \
        ns["--context-parallel-size"] or 1
    assert world_size % (tp * pp * cp) == 0, "arguments.py: world size divisible by TP x PP x CP"
    dp = world_size // (tp * pp * cp)
    set_vpp = [ns["--num-layers-per-virtual-pipeline-stage"], ns["--num-virtual-stages-per-pipeline-rank"],
               ns["--pipeline-model-parallel-layout"]]
    assert sum(x is not None for x in set_vpp) <= 1, "arguments.py: at most one virtual-stage setting"
    if ns["--overlap-param-gather"]:
        assert ns["--use-distributed-optimizer"] and ns["--overlap-grad-reduce"], \
            "arguments.py: --overlap-param-gather only with the distributed optimizer and --overlap-grad-reduce"
    if ns["--tp-comm-overlap"]:
        assert ns["--sequence-parallel"], "arguments.py: --tp-comm-overlap needs sequence parallelism"
    layout = ns["--pipeline-model-parallel-layout"]
    assert layout is not None
    stages = expand_layout(layout)
    assert len(stages) % pp == 0, "arguments.py: layout length divisible by the pipeline size"
    vpp = len(stages) // pp
    if vpp > 1:
        overlap = not ns["--no-overlap-p2p-communication"]
        assert pp > 2 or (overlap and pp > 1), "arguments.py: interleaving needs PP > 2 (or > 1 with the overlap)"
    assert ns["--decoder-first-pipeline-num-layers"] is None and ns["--decoder-last-pipeline-num-layers"] is None \
        and not ns["--account-for-embedding-in-pipeline-split"] and not ns["--account-for-loss-in-pipeline-split"], \
        "transformer_config.py: no other layout arguments beside a layout"
    gran = "selective" if ns["--recompute-activations"] else ns["--recompute-granularity"]
    method, num, modules = ns["--recompute-method"], ns["--recompute-num-layers"], ns["--recompute-modules"]
    if gran == "selective":
        assert method is None, "arguments.py: no recompute method with selective granularity"
        assert num is None, "transformer_config.py: recompute_num_layers must be None for selective"
        mods = ["core_attn"] if modules is None else modules
        assert set(mods) <= MODULES, "transformer_config.py: allowed modules"
        assert "moe_act" not in mods or ns["--moe-grouped-gemm"], \
            "transformer_config.py: moe_act in recompute_modules is only supported with moe_grouped_gemm"
    elif gran == "full":
        assert method in ("block", "uniform"), "transformer_config.py: full recompute needs block or uniform"
        assert num is not None, "transformer_config.py: full recompute needs recompute_num_layers"
    flat = "".join(stages)  # validate_layer_layout
    assert flat[0] == "E" and flat.count("E") == 1, "layout: embedding first, once"
    assert flat[-1] == "L" and flat.count("L") == 1, "layout: loss last, once"
    assert flat.count("t") == ns["--num-layers"], "layout: decoder layers match num_layers"
    mtp = ns["--mtp-num-layers"]
    assert flat.count("m") == (mtp or 0), "layout: MTP layers match mtp_num_layers"
    if "m" in flat:
        assert "t" not in flat[flat.index("m"):], "layout: decoder layers before MTP layers"
        grid = [[stages[v * pp + r] for v in range(vpp)] for r in range(pp)]
        for r in range(pp):
            assert all("m" not in grid[r][v] for v in range(vpp - 1)), "layout: MTP in the rank's last vstage"
            if "m" in grid[r][-1]:
                assert grid[r][-1].count("m") == mtp, "layout: all MTP layers in one virtual stage"
    mbs, gbs = ns["--micro-batch-size"], ns["--global-batch-size"]
    micro_batches = None
    if mbs is not None:
        gbs = mbs * dp if gbs is None else gbs
        assert gbs % (mbs * dp) == 0, "num_microbatches_calculator: global batch divisible by mbs x dp"
        micro_batches = gbs // (mbs * dp)
        if vpp > 1:  # schedules.py: groups of PP micro-batches, the last group full or >= PP
            assert micro_batches >= pp and (micro_batches % pp == 0), "schedules.py: M a multiple of PP"
    return {"pp": pp, "vpp": vpp, "dp": dp, "tp": tp, "cp": cp, "stages": stages, "micro_batches": micro_batches,
            "granularity": gran, "method": method, "num": num,
            "modules": (["core_attn"] if modules is None else modules) if gran == "selective" else [],
            "etp": ns["--expert-tensor-parallel-size"] or tp,
            "sequence_parallel": ns["--sequence-parallel"] and tp > 1}


def megatron_layers(derived: dict, model) -> tuple[list, list]:
    """``(counts, names)`` of the model run as Megatron lays it out: chunk-major segments, and per
    decoder layer the recompute of its transformer block (recompute.py: block = the first N layers
    checkpointed one by one; uniform = groups of N checkpointed together, one saved input each)."""
    roles = {"HEAD": "E", "TAIL": "L"}
    names_of = {k: [o.name for o in model.fronts[k]] for k in model.kind_order}
    layer, counts, names = 0, [], []
    for stage in derived["stages"]:
        n = 0
        pos = 0
        for ch in stage:
            if ch == "m":
                continue  # MTP layers are not in gpuknap's model
            kind = model.kinds[layer]
            opts = names_of[kind]
            if ch in "EL":
                assert roles.get(opts[0]) == ch
                names.append(opts[0])
            else:
                g, method, num = derived["granularity"], derived["method"], derived["num"]
                if g == "full" and method == "block":
                    names.append("FULL" if pos < num else "NONE")
                elif g == "full":
                    names.append("FULL" if pos % num == 0 else "FULL-GROUPED")
                elif g == "selective":
                    mods = set(derived["modules"]) if "MOEACT" in opts else set(derived["modules"]) - {"moe_act"}
                    names.append({frozenset(): "NONE", frozenset({"core_attn"}): "SLCT",
                                  frozenset({"moe_act"}): "MOEACT",
                                  frozenset({"core_attn", "moe_act"}): "SLCT+MOEACT"}[frozenset(mods)])
                else:
                    names.append("NONE")
                pos += 1
            layer += 1
            n += 1
        counts.append(n)
    assert layer == model.layers
    return counts, names


PARALLEL_KEYS = {"data_parallel", "model_parallel", "context_parallel", "expert_parallel", "pipeline_stage",
                 "micro_batch_num", "seq_split_num", "use_seq_parallel", "optimizer_shard",
                 "gradient_aggregation_group", "vocab_emb_dp", "context_parallel_algo", "ulysses_degree_in_cp",
                 "mem_coeff"}
RECOMPUTE_KEYS = {"recompute", "select_recompute", "parallel_optimizer_comm_recompute", "select_comm_recompute",
                  "mp_comm_recompute", "recompute_slice_activation", "select_recompute_exclude",
                  "select_comm_recompute_exclude"}
#: transformer_config_utils.py: model_config keys that name one TransformerConfig field.
MCORE_ALIASES = [("num_layers", "num_hidden_layers"), ("mtp_depth", "num_nextn_predict_layers", "mtp_num_layers"),
                 ("pp_interleave_num", "virtual_pipeline_model_parallel_size")]


def _format(value, layer_list: np.ndarray) -> np.ndarray:
    """LayerSetting._format_recompute_list."""
    v, pp = layer_list.shape
    if isinstance(value, bool):
        return layer_list.copy() if value else np.zeros_like(layer_list)
    if all(isinstance(x, (int, bool)) for x in value):  # check_rules.py: at most pp entries
        assert len(value) <= pp, "check_rules.py: recompute list no longer than pipeline_stage"
        res = np.zeros_like(layer_list)
        by_stage = layer_list.sum(axis=0)
        for j, num in enumerate(value):
            num = min(2**31 - 1 if num is True else int(num), by_stage[j])
            while num:
                for i in range(v):
                    if not num:
                        break
                    if res[i, j] < layer_list[i, j]:
                        res[i, j] += 1
                        num -= 1
        return res
    out = np.zeros_like(layer_list)
    for i, row in enumerate(value):
        for j, x in enumerate(row):
            out[i, j] = (layer_list[i, j] if x else 0) if isinstance(x, bool) else min(x, layer_list[i, j])
    return out


def mindformers_layers(cfg: dict, model, mcore: bool) -> tuple[list, list]:
    """``(counts, names)`` of the model as MindFormers' LayerSetting lays out a configuration (legacy
    models, or mcore ones with ``use_legacy: False``)."""
    pc, mc, rc = cfg["parallel_config"], cfg["model"]["model_config"], cfg.get("recompute_config", {})
    assert set(pc) <= PARALLEL_KEYS and set(rc) <= RECOMPUTE_KEYS, "template.py: closed sections"
    if mcore:  # transformer_config_utils.py: each TransformerConfig field given once
        for names in MCORE_ALIASES:
            assert sum(k in mc for k in names) <= 1, f"mcore conversion: {names} given twice"
        assert "recompute" not in mc, "mcore conversion: recompute comes from parallel_config.recompute"
    interleave = cfg.get("parallel", {}).get("pipeline_config", {}).get("pipeline_interleave", False)
    v = mc.get("pp_interleave_num", 1) if interleave else 1
    pp, num_layers = pc["pipeline_stage"], mc["num_layers"]
    mtp = mc.get("mtp_depth", 0)
    total = num_layers + mtp
    assert num_layers >= pp, "modeling_utils.py: num_layers >= pipeline_stage"
    assert not interleave or v * pp <= num_layers, "modeling_utils.py: pp * pp_interleave_num <= num_layers"
    offset = np.array(mc.get("offset", 0), np.int32)
    assert offset.ndim < 1 or offset.shape[-1] == pp, "LayerSetting: offset.shape[-1] == pp"
    assert offset.ndim < 2 or offset.shape[-2] == v, "LayerSetting: offset.shape[-2] == pp_interleave_num"
    assert offset.sum() == total % (pp * v), "LayerSetting: offsets sum to the remainder"
    layer_list = np.ones((v, pp), np.int32) * (total // (pp * v)) + np.broadcast_to(offset, (v, pp))
    starts = np.concatenate(([0], np.cumsum(layer_list.reshape(-1))))[:-1].reshape(v, pp)
    full = _format(rc.get("recompute", False), layer_list)
    source = rc if not mcore else mc
    select = _format(source.get("select_recompute", False), layer_list)
    comm = _format(source.get("select_comm_recompute", False), layer_list)
    names, counts = [], []
    kinds_names = [[o.name for o in model.fronts[k]] for k in model.kinds]
    head = kinds_names[0] == ["HEAD"]
    tail = kinds_names[-1] == ["TAIL"]
    layer = 1 if head else 0
    for c in range(v):
        for s in range(pp):
            n = 0
            for pos in range(layer_list[c, s]):
                if starts[c, s] + pos >= num_layers:
                    continue  # an MTP layer: not in gpuknap's model
                f = pos < full[c, s]
                sel, com = (not f) and pos < select[c, s], (not f) and pos < comm[c, s]
                names.append("FULL" if f else "BOTH" if sel and com else "SLCT" if sel else "COMM" if com
                             else "NONE")
                n += 1
                layer += 1
            counts.append(n)
    counts[0] += head
    counts[-1] += tail
    out = ([kinds_names[0][0]] if head else []) + names + ([kinds_names[-1][0]] if tail else [])
    return counts, out
