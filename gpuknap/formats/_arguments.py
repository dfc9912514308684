"""Megatron-LM's command-line flags, read from a launch script or an arguments file.

A launch script is read as the shell would pass its words (:mod:`._shell`: continuation lines,
comments, quotes, bash arrays and string variables passed where they are used, a comment that
ends a continued command and an unquoted ``|`` refused).
Only the flags in :data:`READ` are interpreted; every other word is
left alone, except a flag that is not one of them but close to one (a
misspelling Megatron's parser would refuse as unrecognized, and that gpuknap
would otherwise ignore): it is refused with the flag it resembles.  Megatron's
own flags that happen to be close to a read one are listed in :data:`KNOWN`.

Megatron's parser takes the last of a flag given twice; gpuknap refuses it,
since it cannot know which was meant.  A value written as a shell variable
the file does not set (``$TP`` from the environment) is refused: gpuknap reads what the file says.
"""
from __future__ import annotations

import re

from ._settings import misspelt
from ._shell import words

#: Flags read, and how many words each takes: 0 a switch, 1 one value, "*" any number of names.
READ = {
    "--pipeline-model-parallel-size": 1, "--pipeline-model-parallel-layout": 1, "--num-layers": 1,
    "--recompute-granularity": 1, "--recompute-method": 1, "--recompute-num-layers": 1,
    "--recompute-modules": "*", "--recompute-activations": 0,
    "--tensor-model-parallel-size": 1, "--context-parallel-size": 1, "--expert-model-parallel-size": 1,
    "--expert-tensor-parallel-size": 1, "--sequence-parallel": 0, "--micro-batch-size": 1,
    "--global-batch-size": 1, "--seq-length": 1, "--use-distributed-optimizer": 0, "--moe-grouped-gemm": 0,
    "--mtp-num-layers": 1, "--no-overlap-p2p-communication": 0, "--encoder-seq-length": 1, "--window-size": 1,
    "--cp-comm-type": "*", "--hierarchical-context-parallel-sizes": "*", "--tp-comm-overlap": 0, "--overlap-grad-reduce": 0, "--overlap-param-gather": 0,
    "--moe-token-dispatcher-type": 1,
    # read to be refused: they conflict with a layout, or change what gpuknap models
    "--decoder-first-pipeline-num-layers": 1, "--decoder-last-pipeline-num-layers": 1,
    "--account-for-embedding-in-pipeline-split": 0, "--account-for-loss-in-pipeline-split": 0,
    "--num-layers-per-virtual-pipeline-stage": 1, "--num-virtual-stages-per-pipeline-rank": 1,
    "--distribute-saved-activations": 0, "--moe-layer-recompute": 0, "--hybrid-layer-pattern": 1,
    "--model-parallel-size": 1, "--window-attn-skip-freq": 1, "--hybrid-override-pattern": 1,
    "--microbatch-group-size-per-virtual-pipeline-stage": 1, "--optimizer": 1, "--use-megatron-fsdp": 0,
    "--use-torch-fsdp2": 0, "--step-batch-size-schedule": 1, "--rampup-batch-size": "*",
    "--decrease-batch-size-if-needed": 0, "--eval-global-batch-size": 1,
    # precision, offloading and kernels: read to refuse what the cost model does not model (_megatron_run.py)
    "--bf16": 0, "--fp16": 0, "--fp8-format": 1, "--fp4-format": 1, "--grad-reduce-in-bf16": 0,
    "--accumulate-allreduce-grads-in-fp32": 0, "--main-grads-dtype": 1, "--main-params-dtype": 1,
    "--exp-avg-dtype": 1, "--exp-avg-sq-dtype": 1, "--use-precision-aware-optimizer": 0,
    "--optimizer-cpu-offload": 0, "--cpu-offloading-num-layers": 1,
    "--fine-grained-activation-offloading": 0, "--attention-backend": 1, "--transformer-impl": 1,
    # the model's shape and experts: checked against the model costed (_stated_shape.py, _model_check.py)
    "--hidden-size": 1, "--ffn-hidden-size": 1, "--num-attention-heads": 1, "--num-query-groups": 1,
    "--group-query-attention": 0, "--num-experts": 1, "--moe-router-topk": 1, "--moe-ffn-hidden-size": 1,
    "--moe-shared-expert-intermediate-size": 1, "--moe-layer-freq": 1, "--moe-expert-capacity-factor": 1,
    "--moe-pad-expert-input-to-capacity": 0, "--moe-token-drop-policy": 1,
}
#: Recompute flags of older Megatron versions, which Megatron now refuses (``--checkpoint-activations``
#: is defined only for ``arguments.py`` to exit on it; the others are no longer defined): their
#: meaning, and what to write instead.
DEPRECATED = {
    "--checkpoint-activations": "older Megatron's full recompute of every layer; Megatron now exits on it "
                                "(arguments.py validate_args): write --recompute-granularity full "
                                "--recompute-method uniform --recompute-num-layers 1",
    "--checkpoint-num-layers": "older Megatron's layers per recompute group (with --checkpoint-activations); no "
                               "longer a flag: write --recompute-num-layers with --recompute-granularity full "
                               "and --recompute-method",
    "--activations-checkpoint-method": "older Megatron's full recompute method; no longer a flag: write "
                                       "--recompute-granularity full --recompute-method (uniform or block)",
    "--activations-checkpoint-num-layers": "older Megatron's full recompute layer count; no longer a flag: write "
                                           "--recompute-num-layers with --recompute-granularity full",
    "--distribute-checkpointed-activations": "the old name of --distribute-saved-activations (no longer a flag), "
                                             "which gpuknap does not model",
}
#: A word naming one of Megatron's training programs: a file that runs one is a whole launch.
LAUNCH = "(launch)"
#: The first word passed that gpuknap cannot see into: a variable the file does not set, standing
#: where flags may be (``$EXTRA_ARGS``, ``"$@"``, ``${ARGS[@]}`` of a sourced file); not a flag's value.
UNSEEN = "(unseen)"
_PROGRAM = re.compile(r"pretrain_[a-z0-9_]+\.py")
#: A word that is only a variable's expansion (``$X``, ``${X}``, ``${X[@]}``, ``$@``, ``$1``): it may hold flags.
_WHOLE_REFERENCE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|[@*0-9]|\{[A-Za-z_0-9@*#:?=+-][^}]*\})")
#: Words that end a program's arguments (the next command's, a pipe's or a redirection's follow).
_CONTROL = frozenset({"|", "||", "&&", ";", "&", "|&"})
_REDIRECT = re.compile(r"\d*(?:>>?|<|&>|>&)")
#: Megatron's own flags close to a read one (found in its argument definitions), left alone.
KNOWN = {
    "--eval-global-batch-size", "--eval-micro-batch-size", "--rl-inference-expert-model-parallel-size",
    "--rl-inference-pipeline-model-parallel-size", "--rl-inference-tensor-model-parallel-size",
    "--encoder-num-layers", "--decoder-num-layers", "--decoder-seq-length",
    # TransformerConfig's TP-overlap fields and the overlap's config file, beside --tp-comm-overlap
    "--tp-comm-overlap-cfg", "--tp-comm-overlap-ag", "--tp-comm-overlap-rs", "--tp-comm-overlap-rs-dgrad",
    "--tp-comm-overlap-disable-qkv", "--tp-comm-overlap-disable-fc1", "--tp-comm-bulk-wgrad", "--tp-comm-bulk-dgrad",
    "--tp-comm-split-ag", "--tp-comm-split-rs", "--tp-comm-bootstrap-backend",
    "--no-tp-comm-overlap-ag", "--no-tp-comm-overlap-rs", "--no-tp-comm-bulk-wgrad", "--no-tp-comm-bulk-dgrad",
    "--no-tp-comm-split-ag", "--no-tp-comm-split-rs",
    # arguments.py: the FP8/FP4 parameter all-gathers (2012-2016), beside --overlap-param-gather
    "--fp8-param-gather", "--fp4-param-gather",
    # arguments.py: deprecated, ignored with a warning on a GPT model (the non-hybrid branch of validate_args)
    "--mtp-hybrid-override-pattern",
    # beside the precision, offloading and kernel flags read to be refused (arguments.py and the configs
    # its flags come from: model_parallel_config.py, transformer_config.py, the checkpoint and DDP configs)
    "--ckpt-format", "--kitchen-attention-backend",
    # MoE flags beside the experts' flags read (transformer_config.py fields; --moe-token-dropping of older versions)
    "--moe-expert-rank-capacity-factor", "--moe-router-dtype", "--moe-router-group-topk",
    "--moe-shared-expert-glu-interleave-size", "--moe-token-dropping",
}
#: Names that look like Megatron flags but are not (its parser refuses them), with what to write.
NOT_FLAGS = {
    "--overlap-p2p-comm": "the p2p overlap is on by default (--no-overlap-p2p-communication turns it off)",
    # fields of Megatron's configs that arguments.py excludes from its command line
    "--virtual-pipeline-model-parallel-size": "the layout sets the virtual stages "
                                              "(or --num-virtual-stages-per-pipeline-rank)",
    "--num-layers-in-first-pipeline-stage": "the flag is --decoder-first-pipeline-num-layers",
    "--num-layers-in-last-pipeline-stage": "the flag is --decoder-last-pipeline-num-layers",
    "--use-layer-wise-distributed-optimizer": "Megatron sets it from the optimizer it runs",
    "--sequence-length": "the flag is --seq-length",
    # TransformerConfig and DDP fields arguments.py keeps off its command line (its exclude list; no DDP factory)
    "--cpu-offloading": "Megatron turns activation offloading on with --cpu-offloading-num-layers N",
    "--cpu-offloading-activations": "Megatron offloads activations with --cpu-offloading-num-layers N",
    "--cpu-offloading-weights": "Megatron sets it itself", "--cpu-offloading-double-buffering": "Megatron sets it itself",
    "--params-dtype": "--bf16 or --fp16 set the parameters' type", "--param-dtype": "--bf16 or --fp16 set it",
    "--grad-reduce-in-fp32": "gradients are reduced in fp32 under --bf16 by default (--grad-reduce-in-bf16 "
                             "turns that off)",
}
#: What argparse takes for a negative number rather than a flag (``_negative_number_matcher``).
_NUMBER = re.compile(r"-\d+|-\d*\.\d+")
_NAME = re.compile(r"[a-z_][a-z0-9_+]*")  # module names, exchange types (a2a+p2p)
#: Flags taking integers rather than names.
SIZE_LISTS = ("--hierarchical-context-parallel-sizes", "--rampup-batch-size")
_SIZES = (re.compile(r"\+?\d[\d_]*"), "an integer")


def arguments(text: str, path: str) -> dict[str, tuple[list[str], int]]:
    """The read flags of a text: ``{flag: (values, line)}`` (see the module docstring)."""
    tokens = words(text, path, ends=True)  # (None, line) ends each command
    out: dict[str, tuple[list[str], int]] = {}
    unseen: list[tuple[str, int, bool]] = []  # words that may hold flags; whether after the program's name
    running = False  # the command so far names the program (pretrain_gpt.py): its words are the program's
    i = 0
    while i < len(tokens):
        word, line = tokens[i]
        before = tokens[i - 1][0] if i else None
        i += 1
        running = running and word is not None and word not in _CONTROL and not _REDIRECT.match(word)
        if word is not None and _PROGRAM.fullmatch(word.rsplit("/", 1)[-1]):
            out.setdefault(LAUNCH, ([word], line))  # the file runs pretrain_gpt.py (or another pretrain_*.py)
            running = True
        elif word is not None and (_WHOLE_REFERENCE.fullmatch(word) or word.startswith(("`", "$("))) and (
                "@" in word or "*" in word or before is None or not before.startswith("--") or "=" in before
                or before in READ) and not (before and _REDIRECT.match(before)):  # after a read flag, a switch
            unseen.append((word, line, running))  # the launcher's own ($DISTRIBUTED_ARGS to torchrun) aside
        if word is None or not word.startswith("--") or word == "--":
            continue
        flag, eq, value = word.partition("=")
        if flag in DEPRECATED:
            raise ValueError(f"{path}: line {line}: {flag}: {DEPRECATED[flag]}")
        if flag in NOT_FLAGS:
            raise ValueError(f"{path}: line {line}: {flag} is not a Megatron flag (its parser refuses it): "
                             f"{NOT_FLAGS[flag]}")
        if flag not in READ:
            near = misspelt(flag, READ, KNOWN)
            if near is not None:
                shown = flag if flag.isprintable() and flag == flag.strip() else repr(flag)  # a quoted space shows
                raise ValueError(f"{path}: line {line}: unknown flag {shown} (did you mean {near}?); Megatron would "
                                 "refuse it and gpuknap would ignore it")
            continue
        if flag in out:
            raise ValueError(f"{path}: line {line}: {flag} is given twice (also at line {out[flag][1]}); Megatron "
                             "takes the last silently: keep one")
        arity = READ[flag]
        if arity == 0:
            if eq:
                raise ValueError(f"{path}: line {line}: {flag} is a switch and takes no value, got {value!r}")
            values: list[str] = []
        elif eq:
            values = [value]
        elif arity == 1:
            if i >= len(tokens) or tokens[i][0] is None or tokens[i][0].startswith("--"):
                raise ValueError(f"{path}: line {line}: {flag}: the value is missing")
            values = [tokens[i][0]]
            after = tokens[i + 1][0] if i + 1 < len(tokens) else None
            if flag == "--step-batch-size-schedule" and after is not None and ":" in after and not after.startswith("-"):
                raise ValueError(f"{path}: line {line}: {flag} {values[0]} {after[:20]}: Megatron's parser takes one "
                                 "word and refuses the next; quote the schedule")
            if values[0].startswith("-") and not _NUMBER.fullmatch(values[0]):
                raise ValueError(f"{path}: line {line}: {flag} {values[0]}: Megatron's parser takes {values[0]!r} after "
                                 f"a space for a flag (argparse before Python 3.14); write {flag}={values[0]}")
            i += 1
        else:  # argparse's nargs="+": every word up to the next flag or the command's end (lines of an array too)
            values = []
            while i < len(tokens) and tokens[i][0] is not None and not tokens[i][0].startswith("-"):
                values.append(tokens[i][0])
                i += 1
            if not values:
                raise ValueError(f"{path}: line {line}: {flag}: Megatron needs at least one name after it")
            pattern, what = _SIZES if flag in SIZE_LISTS else (_NAME, "a name (lowercase letters, digits, _ and +)")
            wrong = [v for v in values if not pattern.fullmatch(v) and "$" not in v and "`" not in v]
            if wrong:
                raise ValueError(f"{path}: line {line}: {flag}: got {wrong[0]!r}, not {what}; Megatron's parser "
                                 "takes every word up to the next flag")
        for v in values:
            if "$" in v or "`" in v:
                raise ValueError(f"{path}: line {line}: {flag} {v}: a shell variable; gpuknap reads values written "
                                 "in the file (write the number, or run the script with `bash -x` to see it)")
        out[flag] = (values, line)
    passed = [(w, at) for w, at, after in unseen if after or LAUNCH not in out]
    if passed:  # may hold flags: the run is not all in the file
        out[UNSEEN] = ([passed[0][0]], passed[0][1])
    return out
