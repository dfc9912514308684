"""A Megatron run's global batch and data-parallel sharding (private; read by
:mod:`._megatron_checks`).  The global batch when a schedule, a ramp or rounding sets it:
``megatron/training/arguments.py`` (a schedule refused beside ``--global-batch-size``; the
evaluation batch checked before any rounding) and
``megatron/core/num_microbatches_calculator.py`` (the step schedule's syntax and checks, and
``--decrease-batch-size-if-needed`` rounding the batch down to a multiple of micro-batch size x DP).
The optimizer and its sharding: ``--overlap-param-gather`` checked as ``arguments.py`` checks it,
then Megatron FSDP, PyTorch FSDP2 and optimizers other than Adam refused (not modelled).
Precision, offloading and kernels (:func:`precision`): a whole run without ``--bf16`` or
``--fp16`` trains in fp32 (``arguments.py``, ``params_dtype``); fp16 without fp32 gradient
accumulation, bf16 gradients, low-precision optimizer state, FP8/FP4, CPU offloading and attention
that stores its scores are refused as not modelled.
"""
from __future__ import annotations

#: The optimizer gpuknap's cost model steps (Adam's moments and master weights; Megatron's default).
OPTIMIZER = "adam"
#: ``--optimizer``'s choices in arguments.py.
OPTIMIZERS = ("adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon")


def refuse(args: dict, flag: str, path: str, why: str) -> None:
    """A flag the file gives, refused naming its line."""
    if flag in args:
        raise ValueError(f"{path}: line {args[flag][1]}: {flag}: {why}")


def batches(args: dict, run: dict, notes: list, path: str) -> None:
    """The global batch when a schedule, a ramp or rounding sets it (whole run or fragment)."""
    schedule = "--step-batch-size-schedule"
    if schedule in args and "--global-batch-size" in args:  # arguments.py 698-701
        refuse(args, schedule, path, "Megatron refuses it beside --global-batch-size (arguments.py)")
    if schedule in args:  # num_microbatches_calculator.py: the batch follows the schedule, step by step
        run["global_batch"] = _largest_batch(args, path)
        run["global_batch_flag"] = f"{schedule}'s largest batch"
        notes.append(f"{schedule}: costed at its largest global batch, {run['global_batch']} (the phase with the "
                     "most micro-batches in flight)")
    if "--decrease-batch-size-if-needed" in args:  # num_microbatches_calculator.py: rounded down (_round)
        if schedule in args:
            refuse(args, "--decrease-batch-size-if-needed", path, "Megatron refuses it beside "
                    "--step-batch-size-schedule (num_microbatches_calculator.py)")
        # arguments.py then checks the evaluation batch (the global batch unless given) divides as it is
        run["round_batch"] = "eval" if "--eval-global-batch-size" in args else "refused"
    if "--rampup-batch-size" in args and "--global-batch-size" in args:  # deprecated; ramps to the batch
        notes.append("--rampup-batch-size: costed at the global batch the ramp ends at (--global-batch-size; "
                     "recent Megatron ignores the ramp, older versions shrink only the first iterations)")


def _number(text: str) -> float:
    """num_microbatches_calculator.py's ``_parse_numeric_value``: a number, K/M/B/T multiplying it."""
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if scale != 1 else text) * scale)


def _largest_batch(args: dict, path: str) -> int:
    """The largest global batch of ``--step-batch-size-schedule "THRESHOLD:BS THRESHOLD:BS ..."``
    (spaces or commas between steps), checked as num_microbatches_calculator.py checks it."""
    (text,), line = args["--step-batch-size-schedule"]
    where = f"{path}: line {line}: --step-batch-size-schedule"
    steps = []
    for entry in text.replace(",", " ").split():
        threshold, colon, batch = entry.partition(":")
        try:
            steps.append((_number(threshold), _number(batch)))
        except (ValueError, OverflowError):
            colon = ""
        if not colon:
            raise ValueError(f"{where}: {entry[:40]!r} is not THRESHOLD:BATCH (e.g. '0:768 250B:1536')")
    steps.sort()
    if not steps or steps[0][0] != 0:
        raise ValueError(f"{where}: Megatron needs a first step at threshold 0 (num_microbatches_calculator.py)")
    if any(a[0] == b[0] for a, b in zip(steps, steps[1:])):
        raise ValueError(f"{where}: Megatron needs strictly increasing thresholds (num_microbatches_calculator.py)")
    if any(batch < 1 for _, batch in steps):
        raise ValueError(f"{where}: Megatron needs every batch to be positive (num_microbatches_calculator.py)")
    return max(batch for _, batch in steps)


def sharding(args: dict, path: str, whole: bool) -> None:
    """The optimizer and the data-parallel sharding, checked as arguments.py checks them, then
    those gpuknap does not model refused."""
    optimizer = args["--optimizer"][0][0] if "--optimizer" in args else OPTIMIZER
    if "--overlap-param-gather" in args and whole:  # arguments.py 1024-1029
        if not ({"--use-distributed-optimizer", "--use-megatron-fsdp"} & set(args) or optimizer == "dist_muon"):
            refuse(args, "--overlap-param-gather", path, "Megatron gathers parameters overlapped only with "
                    "--use-distributed-optimizer, --use-megatron-fsdp or --optimizer dist_muon (arguments.py "
                    "asserts it)")
        if "--overlap-grad-reduce" not in args:
            refuse(args, "--overlap-param-gather", path, "Megatron gathers parameters overlapped only with "
                    "--overlap-grad-reduce (arguments.py asserts it)")
    why = ("is not modelled: gpuknap costs Megatron's distributed optimizer (--use-distributed-optimizer), whose "
           "sharding, buckets and overlap differ")
    refuse(args, "--use-megatron-fsdp", path, "Megatron FSDP (by default it also shards parameters and gradients, "
                                               "--data-parallel-sharding-strategy optim_grads_params) " + why)
    refuse(args, "--use-torch-fsdp2", path, "PyTorch FSDP2 " + why)
    if optimizer not in OPTIMIZERS:
        refuse(args, "--optimizer", path, f"{optimizer}: not one of Megatron's optimizers ({', '.join(OPTIMIZERS)}; "
                                          "arguments.py), whose parser refuses it")
    if optimizer != OPTIMIZER:
        refuse(args, "--optimizer", path, f"{optimizer}: gpuknap costs Adam's state and step (Megatron's default, "
                                           f"--optimizer {OPTIMIZER}); other optimizers are not modelled")


#: Precision-aware optimizer dtypes (arguments.py, "Args of precision-aware optimizer"): gpuknap
#: costs fp32 main gradients, main parameters and Adam moments, each flag's default.
FP32_ONLY = ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype")
#: TransformerConfig.attention_backend (transformer/enums.py AttnBackend) and the backends that
#: never store the attention scores (what gpuknap costs: docs/costs.md, flash attention).
ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto")
STORES_SCORES = ("unfused", "local")
TRANSFORMER_IMPLS = ("transformer_engine", "local", "inference_optimized")


def precision(args: dict, path: str, whole: bool) -> None:
    """Precision, offloading and kernel flags that change memory or time, refused unless gpuknap's
    cost model runs them as it costs: bf16 parameters with fp32 gradients, main parameters and Adam
    moments on the device, activations on the device, attention that stores no scores."""
    if "--bf16" in args and "--fp16" in args:  # arguments.py asserts not both
        refuse(args, "--fp16", path, "Megatron refuses it beside --bf16 (arguments.py asserts one of them)")
    if whole and "--bf16" not in args and "--fp16" not in args:
        raise ValueError(f"{path}: neither --bf16 nor --fp16: Megatron then trains in fp32 (arguments.py: "
                         "params_dtype is torch.float unless one is given), which gpuknap does not model (it costs "
                         "bf16 weights and activations with fp32 gradients); add --bf16")
    if "--fp16" in args and "--accumulate-allreduce-grads-in-fp32" not in args:
        refuse(args, "--fp16", path, "Megatron then keeps and reduces the gradients in fp16 (arguments.py forces "
                                     "fp32 gradients only under --bf16), which gpuknap does not model (it costs "
                                     "fp32 gradients); use --bf16, or add --accumulate-allreduce-grads-in-fp32")
    refuse(args, "--grad-reduce-in-bf16", path, "keeps and reduces the gradients in bf16 (arguments.py turns fp32 "
                                                "accumulation off), which gpuknap does not model (it costs fp32 "
                                                "gradients)")
    for flag in FP32_ONLY:
        if flag in args and args[flag][0][0] != "fp32":
            refuse(args, flag, path, f"{args[flag][0][0]}: not modelled; gpuknap costs fp32 main gradients, main "
                                     "parameters and Adam moments (the default, fp32)")
    for flag in ("--fp8-format", "--fp4-format"):
        refuse(args, flag, path, f"{args[flag][0][0] if flag in args else ''}: {flag[2:5].upper()} training "
                                 "(Transformer Engine's low-precision GEMMs and their weight copies) is not "
                                 "modelled; gpuknap costs bf16 GEMMs")
    refuse(args, "--optimizer-cpu-offload", path, "keeps optimizer state on the CPU and steps it there, which "
                                                  "gpuknap does not model (it costs the optimizer on the device)")
    offloaded = "offloads activations to the CPU, which gpuknap does not model (it keeps every saved activation " \
                "on the device)"
    if "--cpu-offloading-num-layers" in args and args["--cpu-offloading-num-layers"][0][0] not in ("0", "+0"):
        refuse(args, "--cpu-offloading-num-layers", path, f"{args['--cpu-offloading-num-layers'][0][0]}: Megatron then "
                                                          f"{offloaded} (arguments.py sets cpu_offloading)")
    refuse(args, "--fine-grained-activation-offloading", path, offloaded)
    if "--attention-backend" in args:
        backend = args["--attention-backend"][0][0]
        if backend not in ATTENTION_BACKENDS:
            refuse(args, "--attention-backend", path, f"{backend!r} is not one of Megatron's "
                                                      f"({', '.join(ATTENTION_BACKENDS)}; transformer/enums.py)")
        if backend in STORES_SCORES:
            refuse(args, "--attention-backend", path, f"{backend}: stores the attention scores and softmax (no "
                                                      "flash attention), which gpuknap does not model; use flash, "
                                                      "fused or auto (the default)")
    if "--transformer-impl" in args:
        impl = args["--transformer-impl"][0][0]
        if impl not in TRANSFORMER_IMPLS:
            refuse(args, "--transformer-impl", path, f"{impl!r} is not one of Megatron's "
                                                     f"({', '.join(TRANSFORMER_IMPLS)}; transformer_config.py)")
        if impl != "transformer_engine":
            refuse(args, "--transformer-impl", path, f"{impl}: Megatron's own layers (local attention stores the "
                                                     "scores; no fused kernels) are not modelled; gpuknap costs "
                                                     "Transformer Engine's, the default")


def default_layout(layers: int, pp: int, mtp: int, first: int | None, last: int | None, embedding: bool,
                   loss: bool, per_virtual: int | None, virtual: int | None, where: str) -> str:
    """The layout Megatron runs without ``--pipeline-model-parallel-layout`` (``E``, ``t``, ``m``, ``L``
    and ``|`` as :func:`gpuknap.formats.megatron.parse_layout` reads them), checked as Megatron
    checks it: ``arguments.py`` (``validate_args``: the virtual-stage size from
    ``--num-layers-per-virtual-pipeline-stage`` or ``--num-virtual-stages-per-pipeline-rank``,
    divisibility), ``transformer_config.py`` (``__post_init__``: the uneven first/last stage checks)
    and ``transformer_block.py`` (``get_num_layers_to_build``: layers per pipeline rank, divided over
    its virtual stages, one less on the first (last) virtual stage of the first (last) rank when the
    embedding (loss) is accounted for).  ``layers`` decoder layers, ``pp`` pipeline ranks, ``mtp``
    MTP layers (built with the loss, on the last stage); ``first``/``last``
    ``--decoder-first/last-pipeline-num-layers``; ``embedding``/``loss`` the account-for flags."""
    def fail(why: str) -> ValueError:
        return ValueError(f"{where}: {why}")

    uneven = first is not None or last is not None
    extra = int(embedding) + int(loss)
    if uneven and extra:  # transformer_config.py
        raise fail("Megatron refuses --decoder-first/last-pipeline-num-layers beside "
                   "--account-for-embedding/loss-in-pipeline-split (transformer_config.py)")
    vp = None
    if per_virtual is not None and virtual is not None:  # arguments.py: at most one of the three
        raise fail("Megatron refuses --num-layers-per-virtual-pipeline-stage beside "
                   "--num-virtual-stages-per-pipeline-rank (arguments.py)")
    if per_virtual is not None:  # arguments.py validate_args
        if uneven:
            raise fail("Megatron refuses --num-layers-per-virtual-pipeline-stage with --decoder-first/last-pipeline-"
                       "num-layers: use --num-virtual-stages-per-pipeline-rank (arguments.py)")
        if (layers + extra) % pp:
            raise fail(f"{layers + extra} layers are not divisible by --pipeline-model-parallel-size {pp} "
                       "(arguments.py asserts it)")
        if (layers + extra) // pp % per_virtual:
            raise fail(f"{(layers + extra) // pp} layers per pipeline stage are not divisible by "
                       f"--num-layers-per-virtual-pipeline-stage {per_virtual} (arguments.py asserts it)")
        vp = (layers + extra) // pp // per_virtual
    elif virtual is not None:
        vp = virtual
    if vp == 1:  # arguments.py: one virtual stage is none
        vp = None
    if uneven and pp == 1:  # the one rank is first and last: it builds the last count if given, else the first
        only = last if last is not None else first
        if only != layers:
            raise fail(f"one pipeline stage builds --decoder-{'last' if last is not None else 'first'}-pipeline-num-"
                       f"layers {only} layers, and the model has {layers} (--num-layers)")
        per_rank = [only]
    elif uneven:  # transformer_config.py __post_init__ (uneven PP)
        middle, left = layers, pp
        for name, n in (("first", first), ("last", last)):
            if n is None:
                continue
            if n <= 0:
                raise fail(f"--decoder-{name}-pipeline-num-layers {n}: Megatron needs it larger than 0")
            if vp is not None and n % vp:
                raise fail(f"--decoder-{name}-pipeline-num-layers {n} is not divisible by the {vp} virtual stages "
                           "per rank (transformer_config.py)")
            middle, left = middle - n, left - 1
        if bool(middle) != bool(left) or left < 0:
            raise fail(f"{middle} decoder layers left for {max(left, 0)} middle pipeline stages (transformer_config.py "
                       "needs layers for every middle stage and none without one)")
        if left and middle % left:
            raise fail(f"{middle} middle layers are not divisible by the {left} middle pipeline stages "
                       "(transformer_config.py)")
        per_rank = [middle // left if left else 0] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        if (layers + extra) % pp:
            raise fail(f"{layers + extra} layers" + (" (the embedding and loss counted)" if extra else "")
                       + f" are not divisible by --pipeline-model-parallel-size {pp} (arguments.py asserts it; without "
                       "a layout Megatron splits them evenly)")
        per_rank = [(layers + extra) // pp] * pp
    chunks = vp or 1  # at PP 1 Megatron refuses virtual stages (arguments.py; check_layout says so)
    if any(n % chunks for n in per_rank):
        raise fail(f"{next(n for n in per_rank if n % chunks)} layers on a pipeline rank are not "
                   f"divisible by its {chunks} virtual stages (transformer_config.py, transformer_block.py)")
    segments = []
    for c in range(chunks):
        for s in range(pp):
            n = per_rank[s] // chunks - (embedding and c == 0 and s == 0) - (loss and c == chunks - 1 and s == pp - 1)
            if n < 0:  # transformer_block.py asserts it
                raise fail("not enough layers in the " + ("first" if c == 0 and s == 0 else "last")
                           + " virtual pipeline stage for the " + ("embedding" if c == 0 and s == 0 else "loss")
                           + " it accounts for (transformer_block.py)")
            segments.append(("E" if c == s == 0 else "") + "t" * n
                            + ("m" * mtp + "L" if c == chunks - 1 and s == pp - 1 else ""))
    return "|".join(segments)
