"""A Megatron run's global batch and data-parallel sharding (private; read by
:mod:`._megatron_checks`).  The global batch when a schedule, a ramp or rounding sets it:
``megatron/training/arguments.py`` (a schedule refused beside ``--global-batch-size``; the
evaluation batch checked before any rounding) and
``megatron/core/num_microbatches_calculator.py`` (the step schedule's syntax and checks, and
``--decrease-batch-size-if-needed`` rounding the batch down to a multiple of micro-batch size x DP).
The optimizer and its sharding: ``--overlap-param-gather`` checked as ``arguments.py`` checks it,
then Megatron FSDP, PyTorch FSDP2 and optimizers other than Adam refused (not modelled).
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
