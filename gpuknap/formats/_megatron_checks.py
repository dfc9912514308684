"""Megatron-LM's rules for the flags gpuknap writes and reads, in its own words (sources in
docs/training_settings.md):

- ``megatron/training/arguments.py`` (``validate_args``): at most one of the layout and the two
  virtual-stage flags; an interleaved schedule needs more than two pipeline stages, or more than
  one with its p2p overlap (on unless ``--no-overlap-p2p-communication``); ``--seq-length`` is
  ``--encoder-seq-length`` when only that is given; ``--recompute-activations`` means selective recompute;
  selective recompute takes no method; ``--distribute-saved-activations`` needs full recompute
  with a method; the expert tensor-parallel size defaults to the tensor-parallel size; sequence
  parallelism is turned off when the tensor-parallel size is 1; the old ``--model-parallel-size``
  must not be set; the flags are spelt exactly (the parser allows no abbreviations);
  ``--window-size`` is a tuple of integers written ``L,R`` or ``(L,R)``; the global batch is
  micro-batch size x DP when not given; ``--overlap-param-gather`` needs ``--overlap-grad-reduce``
  and the distributed optimizer, Megatron FSDP or ``dist_muon``.  ``model_parallel_config.py``:
  TP, CP and EP default to 1, the micro-batch group per virtual stage to the pipeline size.
- ``megatron/core/transformer/utils.py`` (``get_sliding_window_causal_mask``): with a window
  ``(L, R)`` query ``i`` attends to keys ``i - L`` to ``i + R``; a causal model with ``R = 0``
  attends to ``L + 1`` keys (a Hugging Face ``sliding_window`` of ``W`` keys is ``W - 1,0``);
  ``-1`` is an unbounded side (``transformer_config.py``); ``--window-attn-skip-freq`` makes some
  layers attend to the whole sequence.  Transformer Engine (``check_set_window_size``) runs a
  causal model's ``(L, R)`` as ``(L, 0)``, and refuses a window with context parallelism over
  ``p2p``, Megatron's default ``--cp-comm-type`` (only ``a2a`` and ``all_gather`` take one).
- ``megatron/core/transformer/transformer_config.py``: full recompute needs a method (block or
  uniform) and a number of layers, selective recompute no number; the selective modules Megatron
  knows, and ``moe_act`` only with ``--moe-grouped-gemm``; the first/last-stage layer counts and
  the account-for-embedding/loss flags cannot be set with a layout.
- ``megatron/core/transformer/pipeline_parallel_layer_layout.py``: one embedding first and one
  loss last; the decoder layers number ``--num-layers`` and the MTP layers ``--mtp-num-layers``;
  MTP layers come after every decoder layer, in the last virtual stage of their pipeline rank,
  all in one virtual stage.
"""
from __future__ import annotations

import math

import re
from typing import Any

from . import _stated_shape
from ._arguments import LAUNCH, UNSEEN
from ._megatron_run import batches, default_layout, precision, refuse, sharding

#: Flags Megatron refuses beside a layout (arguments.py and transformer_config.py).
LAYOUT_CONFLICTS = ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
#: Selective modules Megatron knows (transformer_config.py) and those gpuknap's cost model has.
KNOWN_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                 "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc")
MODELLED_MODULES = ("core_attn", "moe_act")
#: Run flags read: flag -> (key, kind).
RUN = {"--tensor-model-parallel-size": ("tp", int), "--context-parallel-size": ("cp", int),
       "--expert-model-parallel-size": ("ep", int), "--expert-tensor-parallel-size": ("etp", int),
       "--micro-batch-size": ("micro_batch", int), "--global-batch-size": ("global_batch", int),
       "--seq-length": ("seq", int), "--sequence-parallel": ("sequence_parallel", bool),
       "--use-distributed-optimizer": ("distributed_optimizer", bool), "--moe-grouped-gemm": ("grouped_gemm", bool)}


#: Sizes Megatron takes when a whole run leaves their flag out (model_parallel_config.py: TP 1 line 55,
#: CP 1 line 100, EP 1 line 127); ETP is then TP (arguments.py 587-588), read by the command.
DEFAULT_SIZES = {"tp": 1, "cp": 1, "ep": 1}
#: Why a whole run's value is what it is when the file does not write it (named by refusals).
DEFAULTED = {"tp": "no --tensor-model-parallel-size: Megatron's default, 1",
             "cp": "no --context-parallel-size: Megatron's default, 1",
             "ep": "no --expert-model-parallel-size: Megatron's default, 1",
             "micro_batches": "no --global-batch-size: Megatron sets it to micro-batch size x data-parallel size "
                              "in arguments.py, one micro-batch per iteration"}


#: Context-parallel exchanges Transformer Engine runs (``attn_forward_func_with_cp``); only the
#: ``a2a`` and ``all_gather`` ones take a sliding window.
CP_COMM_TYPES = ("p2p", "a2a", "all_gather", "a2a+p2p")
WINDOW_CP_COMM = ("a2a", "all_gather")
#: A window at least this long covers any sequence gpuknap accepts (``--seq`` at most 10,000,000).
MAX_WINDOW = 10**7


def _int(args: dict, flag: str, path: str, low: int = 1) -> int | None:
    if flag not in args:
        return None
    values, line = args[flag]
    if not re.fullmatch(r"\d{1,9}", values[0]) or int(values[0]) < low:
        raise ValueError(f"{path}: line {line}: {flag}: expected an integer >= {low}, got {values[0]!r}")
    return int(values[0])


#: Megatron's token dispatchers (TransformerConfig.moe_token_dispatcher_type; allgather the default).
DISPATCHERS = ("allgather", "alltoall", "flex")


def _choice(args: dict, flag: str, path: str, choices: tuple) -> str | None:
    if flag not in args:
        return None
    values, line = args[flag]
    if values[0] not in choices:
        raise ValueError(f"{path}: line {line}: {flag}: expected {' or '.join(choices)}, got {values[0]!r}")
    return values[0]


def _window(args: dict, path: str) -> tuple[int, bool] | None:
    """Keys a query attends to under ``--window-size`` (0: the whole sequence) and whether
    Transformer Engine takes it for a sliding window (any ``L >= 0``); None when not given;
    read as Megatron's ``tuple_type`` parses it and Transformer Engine runs it on a causal model
    (``check_set_window_size``: ``(L, R)`` with ``L >= 0`` runs as ``(L, 0)``, ``(-1, -1)`` as
    ``(-1, 0)``)."""
    if "--window-size" not in args:
        return None
    values, line = args["--window-size"]
    where = f"{path}: line {line}: --window-size"
    try:
        left, right = (int(part) for part in values[0].strip("()").split(","))
    except ValueError:
        raise ValueError(f"{where}: expected two integers LEFT,RIGHT (keys before and after a query), "
                         f"got {values[0]!r}"[:300]) from None
    if left < -1 or right < -1 or (left == -1 and right > 0):
        raise ValueError(f"{where}: a causal model's window is LEFT,0 with LEFT >= 0 (LEFT + 1 keys), or -1,0 "
                         f"for the whole sequence; got {values[0]!r}"[:300])
    return (0 if left == -1 or left >= MAX_WINDOW else left + 1), left >= 0


def check_arguments(args: dict, path: str) -> dict:
    """The values of the flags read, checked as Megatron checks them."""
    refuse(args, "--hybrid-layer-pattern", path, "a hybrid (Mamba) model's pattern; gpuknap reads GPT layouts")
    refuse(args, "--hybrid-override-pattern", path, "a hybrid (Mamba) model's pattern (the deprecated name of "
                                                     "--hybrid-layer-pattern, arguments.py); gpuknap reads GPT layouts")
    refuse(args, "--model-parallel-size", path, "no longer valid in Megatron; use --tensor-model-parallel-size")
    if "--window-size" in args:  # without a window the frequency changes nothing
        refuse(args, "--window-attn-skip-freq", path, "some layers then attend to the whole sequence and others "
                                                       "through the window, which gpuknap does not model")
    if "--pipeline-model-parallel-layout" in args:
        for flag in LAYOUT_CONFLICTS:
            refuse(args, flag, path, "Megatron refuses it beside --pipeline-model-parallel-layout (the layout sets "
                                      "every stage and virtual stage); remove it")
    num_layers = _int(args, "--num-layers", path)
    if num_layers is None:
        raise ValueError(f"{path}: --num-layers: missing (Megatron checks the layout's decoder layers against it)")
    notes = []
    granularity = _choice(args, "--recompute-granularity", path, ("full", "selective"))
    if "--recompute-activations" in args:  # arguments.py: the old switch means selective recompute
        granularity = "selective"
    method = _choice(args, "--recompute-method", path, ("block", "uniform"))
    num = _int(args, "--recompute-num-layers", path)
    modules = args.get("--recompute-modules", (["core_attn"], 0))[0]
    refuse(args, "--moe-layer-recompute", path, "recomputes whole MoE layers, which gpuknap does not model")
    refuse(args, "--distribute-saved-activations", path, "spreads saved inputs over TP ranks, which gpuknap "
                                                          "does not model")
    if granularity == "selective":
        refuse(args, "--recompute-method", path, "Megatron takes no recompute method with selective recompute")
        refuse(args, "--recompute-num-layers", path, "Megatron takes no number of layers with selective recompute")
        unknown = [m for m in modules if m not in KNOWN_MODULES]
        if unknown:
            raise ValueError(f"{path}: --recompute-modules: {unknown} are not Megatron modules "
                             f"({', '.join(KNOWN_MODULES)})")
        other = [m for m in modules if m not in MODELLED_MODULES]
        if other:
            raise ValueError(f"{path}: --recompute-modules: {other} are not modelled (gpuknap models "
                             f"{' and '.join(MODELLED_MODULES)})")
        if "moe_act" in modules and "--moe-grouped-gemm" not in args:
            raise ValueError(f"{path}: --recompute-modules moe_act: Megatron runs it only with --moe-grouped-gemm")
        if not modules:
            granularity = None
    elif granularity == "full":
        if method is None or num is None:
            missing = "--recompute-method" if method is None else "--recompute-num-layers"
            raise ValueError(f"{path}: --recompute-granularity full: {missing} is missing (Megatron needs a method, "
                             "block or uniform, and a number of layers)")
    elif method is not None or num is not None or "--recompute-modules" in args:
        notes.append("--recompute-method/-num-layers/-modules without --recompute-granularity: Megatron "
                     "recomputes nothing")
        method, num, modules = None, None, []
    run: dict[str, Any] = {}
    # the file states the run, not a fragment of it: it gives TP, or launches Megatron's training program,
    # and passes no word it cannot see into (which may hold any flag)
    whole = ("--tensor-model-parallel-size" in args or LAUNCH in args) and UNSEEN not in args
    if UNSEEN in args and ("--tensor-model-parallel-size" in args or LAUNCH in args):
        word, line = args[UNSEEN][0][0], args[UNSEEN][1]
        notes.append(f"line {line}: {word[:40]} passes words gpuknap cannot see, so the settings are read as a "
                     "fragment: what they do not say comes from the spec and the command line, not Megatron's "
                     "defaults")
    for flag, (key, kind) in RUN.items():
        if flag in args:
            run[key] = True if kind is bool else _int(args, flag, path)
        elif whole and key in ("sequence_parallel", "distributed_optimizer"):
            run[key] = False  # a switch a whole run leaves out is off: Megatron's default
    if whole and "--micro-batch-size" not in args:  # arguments.py validate_args asserts it
        raise ValueError(f"{path}: --micro-batch-size: missing; Megatron refuses a run without it (arguments.py: "
                         "assert args.micro_batch_size is not None)")
    if whole:
        _defaults(args, run, notes, path)
    batches(args, run, notes, path)
    if "--cp-comm-type" in args:  # read to check a window against it (every type is costed as the p2p ring)
        types, line = args["--cp-comm-type"]
        wrong = [t for t in types if t not in CP_COMM_TYPES] or ([] if types else ["(none)"])
        if wrong:
            raise ValueError(f"{path}: line {line}: --cp-comm-type: {wrong[0]!r} is not one of Transformer Engine's "
                             f"{', '.join(CP_COMM_TYPES)}")
        if len(types) not in (1, num_layers):  # transformer_config.py: one per layer, or one for all
            raise ValueError(f"{path}: line {line}: --cp-comm-type: {len(types)} types; Megatron takes one for every "
                             f"layer or one per layer (--num-layers {num_layers})")
        run["cp_comm"] = tuple(types)
        if "a2a+p2p" in types and "--hierarchical-context-parallel-sizes" not in args:
            raise ValueError(f"{path}: line {line}: --cp-comm-type a2a+p2p: Megatron needs "
                             "--hierarchical-context-parallel-sizes with it (arguments.py asserts it)")
    if "--hierarchical-context-parallel-sizes" in args:  # arguments.py: their product is the CP size
        sizes, line = args["--hierarchical-context-parallel-sizes"]
        product = math.prod(int(v) for v in sizes)
        if product != run.get("cp", 1):
            raise ValueError(f"{path}: line {line}: --hierarchical-context-parallel-sizes {' '.join(sizes)}: Megatron "
                             f"needs their product ({product}) to be the context-parallel size ({run.get('cp', 1)})")
    if "--tp-comm-overlap" in args:  # arguments.py asserts sequence parallelism with it
        if whole and "--sequence-parallel" not in args:
            refuse(args, "--tp-comm-overlap", path, "Megatron overlaps TP communication only with "
                                                     "--sequence-parallel (arguments.py asserts it)")
        run["tp_comm_overlap"] = True
    elif whole:
        run["tp_comm_overlap"] = False
    dispatcher = _choice(args, "--moe-token-dispatcher-type", path, DISPATCHERS)
    if dispatcher is not None or whole:  # transformer_config.py: allgather unless given
        run["moe_dispatcher"] = dispatcher or "default"
    sharding(args, path, whole)
    precision(args, path, whole)
    if whole:  # said by the command, which knows whether the run has data parallelism
        run["overlap_grad_reduce"] = "--overlap-grad-reduce" in args
    window = _window(args, path)
    if window is not None:
        run["window"], run["sliding"] = window
    elif whole:  # a whole run without --window-size attends to the whole sequence
        run["window"] = 0
    if "--encoder-seq-length" in args:  # arguments.py: one is the other, and only one may be given
        refuse(args, "--seq-length", path, "Megatron refuses it beside --encoder-seq-length (one is the other)")
        run["seq"] = _int(args, "--encoder-seq-length", path)
    mtp = _int(args, "--mtp-num-layers", path, low=0) or 0
    if mtp and granularity == "full" and method == "uniform" and num != 1:
        refuse(args, "--recompute-num-layers", path, f"{num} with --recompute-method uniform and --mtp-num-layers: "
                "Megatron's MTP layer recomputes only groups of 1 (multi_token_prediction.py asserts "
                "recompute_num_layers == 1)")
    stages = _int(args, "--pipeline-model-parallel-size", path) or 1
    if "--pipeline-model-parallel-layout" in args:
        layout, flag = args["--pipeline-model-parallel-layout"][0][0], "--pipeline-model-parallel-layout"
    else:  # Megatron's split without a layout (transformer_block.py get_num_layers_to_build)
        flag = "the split Megatron runs without --pipeline-model-parallel-layout"
        layout = default_layout(num_layers, stages, mtp, _int(args, "--decoder-first-pipeline-num-layers", path),
                                _int(args, "--decoder-last-pipeline-num-layers", path),
                                "--account-for-embedding-in-pipeline-split" in args,
                                "--account-for-loss-in-pipeline-split" in args,
                                _int(args, "--num-layers-per-virtual-pipeline-stage", path),
                                _int(args, "--num-virtual-stages-per-pipeline-rank", path), f"{path}: {flag}")
    return {"stages": stages, "layout": layout, "layout_flag": flag, "num_layers": num_layers, "mtp": mtp,
            "granularity": granularity, "modules": list(modules) if granularity == "selective" else [],
            "method": method if granularity == "full" else None, "num": num if granularity == "full" else 0,
            "run": run, "overlap": "--no-overlap-p2p-communication" not in args, "notes": notes,
            "group": _group(args, path), "shape": _stated_shape.megatron(args, path, whole, _int)}


def _defaults(args: dict, run: dict, notes: list, path: str) -> None:
    """The sizes a whole run leaves at Megatron's defaults, and why (``run["defaulted"]``)."""
    run["defaulted"] = {}
    for key, value in DEFAULT_SIZES.items():
        if key not in run:
            run[key] = value
            run["defaulted"][key] = DEFAULTED[key]
    if "--tensor-model-parallel-size" not in args:
        notes.append(f"{args[LAUNCH][0][0]} is launched without --tensor-model-parallel-size: costed with "
                     "Megatron's default, TP 1")
    if "--expert-tensor-parallel-size" not in args:  # arguments.py 587-588: ETP is then TP
        run["etp_is_tp"] = True
    if "--step-batch-size-schedule" not in args and "--global-batch-size" not in args:  # arguments.py 702-704
        run["micro_batches"] = 1
        run["defaulted"]["micro_batches"] = DEFAULTED["micro_batches"]
        notes.append("no --global-batch-size: Megatron sets it to micro-batch size x data-parallel size "
                     "(arguments.py), so one micro-batch per iteration is costed")


def _group(args: dict, path: str) -> tuple[int, int] | None:
    """``--microbatch-group-size-per-virtual-pipeline-stage`` and its line (None when not given)."""
    flag = "--microbatch-group-size-per-virtual-pipeline-stage"
    return None if flag not in args else (_int(args, flag, path), args[flag][1])


def check_layout(segments: tuple, values: dict, path: str) -> None:
    """Megatron's layout checks (pipeline_parallel_layer_layout.py and the interleaving rule)."""
    where = f"{path}: {values.get('layout_flag', '--pipeline-model-parallel-layout')}"
    p, flat = values["stages"], "".join(segments)
    v = len(segments) // p
    if not flat.startswith("E") or flat.count("E") != 1:
        raise ValueError(f"{where}: Megatron needs exactly one embedding (E), the first layer")
    if not flat.endswith("L") or flat.count("L") != 1:
        raise ValueError(f"{where}: Megatron needs exactly one loss (L), the last layer")
    if flat.count("t") != values["num_layers"]:
        raise ValueError(f"{where}: {flat.count('t')} decoder layers (t), but --num-layers {values['num_layers']}")
    if flat.count("m") != values["mtp"]:
        raise ValueError(f"{where}: {flat.count('m')} MTP layers (m), but --mtp-num-layers "
                         f"{values['mtp'] or 'is not set'}")
    if "m" in flat:
        if "t" in flat[flat.index("m"):]:
            raise ValueError(f"{where}: Megatron places MTP layers (m) after every decoder layer")
        holding = [i for i, seg in enumerate(segments) if "m" in seg]
        if len(holding) > 1 or holding[0] // p != v - 1:
            raise ValueError(f"{where}: Megatron keeps all MTP layers (m) in one virtual stage, the last of its "
                             "pipeline rank")
    group = values.get("group")
    if v > 1 and group is not None and group[0] != p:  # model_parallel_config.py 567-568: the default is P
        why = ("Megatron's interleaved schedule refuses a group smaller than the pipeline size (schedules.py)"
               if group[0] < p else f"a group of {group[0]} warms up (v - 1) x {group[0]} forwards, not (v - 1) x {p} "
               "(schedules.py), more micro-batches in flight than rank --from costs")
        raise ValueError(f"{path}: line {group[1]}: --microbatch-group-size-per-virtual-pipeline-stage {group[0]}: "
                         f"gpuknap costs Megatron's default group, the pipeline size ({p}); {why}; remove it or set "
                         "it to the pipeline size")
    if v > 1 and not (p > 2 or (values["overlap"] and p > 1)):
        raise ValueError(f"{where}: {v} virtual stages per rank: Megatron's interleaved schedule needs more than 2 "
                         "pipeline stages, or more than 1 with its p2p overlap (on unless --no-overlap-p2p-communication)")


def run_flags(run: Any) -> list[str]:
    """The parallel sizes, batch, sequence and optimizer flags of a run."""
    out = [f"--tensor-model-parallel-size {run.tp}"]
    if run.sequence_parallel and run.tp > 1:  # Megatron turns it off itself at TP 1
        out.append("--sequence-parallel")
        if run.tp_comm_overlap:
            out.append("--tp-comm-overlap")
    out.append(f"--context-parallel-size {run.cp}")
    # flex refuses EP x ETP = 1 (moe/token_dispatcher.py), where no token travels and alltoall costs the same
    dispatcher = run.dispatcher if run.ep * run.etp > 1 else "alltoall"
    if run.moe:  # grouped GEMM: the experts' matrices as the cost model runs them; moe_act needs it
        out += [f"--expert-model-parallel-size {run.ep}", f"--expert-tensor-parallel-size {run.etp}",
                "--moe-grouped-gemm", f"--moe-token-dispatcher-type {dispatcher}"]  # the dispatcher costed
        if dispatcher == "flex":  # DeepEP, Megatron's default flex backend (HybridEP costs the same)
            out.append("--moe-flex-dispatcher-backend deepep")
    out += [f"--micro-batch-size {run.micro_batch}", f"--global-batch-size {run.global_batch}",
            f"--seq-length {run.seq}", "--bf16"]  # bf16 weights, fp32 gradients: what the cost model costs
    if run.distributed_optimizer:
        out.append("--use-distributed-optimizer")
    if run.dp * run.cp > 1 or run.tp * run.cp * run.dp > run.ep * run.etp:  # the costs overlap DP communication
        out.append("--overlap-grad-reduce")
        if run.distributed_optimizer:  # arguments.py: the parameter gather needs both of these
            out.append("--overlap-param-gather")
    if run.window:  # a causal window of W keys: the query and W - 1 before it
        out.append(f"--window-size {run.window - 1},0")
        if run.cp > 1:  # Transformer Engine refuses a window over p2p, Megatron's default exchange
            out.append("--cp-comm-type all_gather")
    return out  # interleaving on 2 stages needs the p2p overlap: on unless --no-overlap-p2p-communication


def conflicts(plan: Any, setting: Any) -> list[str]:
    """Comment lines: the flags an existing script must drop for these to hold."""
    run = plan.run
    drop = list(LAYOUT_CONFLICTS) + ["--recompute-activations", "--moe-layer-recompute",
                                     "--distribute-saved-activations"]
    if run is not None and not (run.sequence_parallel and run.tp > 1):
        drop.append("--sequence-parallel")
    if run is not None and not run.distributed_optimizer:
        drop.append("--use-distributed-optimizer")
    if run is not None and not (run.tp_comm_overlap and run.sequence_parallel and run.tp > 1):
        drop.append("--tp-comm-overlap")
    if not plan.mtp:
        drop.append("--mtp-num-layers")
    if run is not None:
        drop += ["--window-attn-skip-freq"] + ([] if run.window else ["--window-size"])
    lines = ["remove from your script (Megatron refuses them beside a layout, or they change this run):"]
    for i in range(0, len(drop), 3):
        lines.append("  " + " ".join(drop[i:i + 3]))
    lines.append("  and every other --recompute-* flag: the recompute flags above replace yours"
                 if setting.flags() else "  and every --recompute-* flag: this plan recomputes nothing")
    return lines
