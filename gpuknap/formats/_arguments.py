"""Megatron-LM's command-line flags, read from a launch script or an arguments file.

A launch script is read as the shell would split it into words: lines joined
at a trailing backslash, comments dropped, quotes removed, one command at a time
(bash arrays such as ``GPT_ARGS=( ... )``, on one line or several, string
variables holding flags such as ``GPT_ARGS="--num-layers 32 ..."`` (read where
they are defined, as an unquoted ``$GPT_ARGS`` passes them), and ``torchrun ...
\\`` continuations all work).  A comment line inside a continued command ends
it, as in the shell; flags after it would not reach Megatron, and are refused.
Only the flags in :data:`READ` are interpreted; every other word is
left alone, except a flag that is not one of them but close to one (a
misspelling Megatron's parser would refuse as unrecognized, and that gpuknap
would otherwise ignore): it is refused with the flag it resembles.  Megatron's
own flags that happen to be close to a read one are listed in :data:`KNOWN`.

Megatron's parser takes the last of a flag given twice; gpuknap refuses it,
since it cannot know which was meant.  A value written as a shell variable
(``$TP``) is refused: gpuknap reads what the file says.
"""
from __future__ import annotations

import re
import shlex

from ._settings import misspelt

#: Flags read, and how many words each takes: 0 a switch, 1 one value, "*" any number of names.
READ = {
    "--pipeline-model-parallel-size": 1, "--pipeline-model-parallel-layout": 1, "--num-layers": 1,
    "--recompute-granularity": 1, "--recompute-method": 1, "--recompute-num-layers": 1,
    "--recompute-modules": "*", "--recompute-activations": 0,
    "--tensor-model-parallel-size": 1, "--context-parallel-size": 1, "--expert-model-parallel-size": 1,
    "--expert-tensor-parallel-size": 1, "--sequence-parallel": 0, "--micro-batch-size": 1,
    "--global-batch-size": 1, "--seq-length": 1, "--use-distributed-optimizer": 0, "--moe-grouped-gemm": 0,
    "--mtp-num-layers": 1, "--no-overlap-p2p-communication": 0, "--encoder-seq-length": 1,
    # read to be refused: they conflict with a layout, or change what gpuknap models
    "--decoder-first-pipeline-num-layers": 1, "--decoder-last-pipeline-num-layers": 1,
    "--account-for-embedding-in-pipeline-split": 0, "--account-for-loss-in-pipeline-split": 0,
    "--num-layers-per-virtual-pipeline-stage": 1, "--num-virtual-stages-per-pipeline-rank": 1,
    "--distribute-saved-activations": 0, "--moe-layer-recompute": 0, "--hybrid-layer-pattern": 1,
    "--model-parallel-size": 1,
}
#: Megatron's own flags close to a read one (found in its argument definitions), left alone.
KNOWN = {
    "--eval-global-batch-size", "--eval-micro-batch-size", "--rl-inference-expert-model-parallel-size",
    "--rl-inference-pipeline-model-parallel-size", "--rl-inference-tensor-model-parallel-size",
    "--encoder-num-layers", "--decoder-num-layers", "--decoder-seq-length",
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
}
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


_ARRAY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\(")
_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=(.*)", re.S)


def words(text: str, path: str) -> list[tuple[str, int]]:
    """The shell words of a text with their line numbers (continuations joined, comments dropped,
    quoted strings over several lines kept whole), with the words of bash arrays and of string
    variables holding flags (``ARGS="--a 1 --b"``) read where they are defined."""
    out: list[tuple[str, int]] = []
    lines = re.split(r"\r?\n", text)
    joined, first = "", None
    for number, line in enumerate(lines, 1):
        if first is None:
            first = number
        if joined and line.lstrip().startswith("#") and number < len(lines) \
                and lines[number].lstrip().startswith("-") and _closed(joined):
            raise ValueError(f"{path}: line {number}: this comment ends the command continued from line {first} "
                             f"(the shell ends it there), so the flags from line {number + 1} on are not passed "
                             "to it; move the comment out of the command")
        if line.endswith("\\") and not line.endswith("\\\\"):
            joined += line[:-1] + " "
            continue
        joined += line
        try:
            split = shlex.split(joined, comments=True)
        except ValueError as exc:
            if "closing quotation" in str(exc) and number < len(lines):  # a quoted string goes on
                joined += "\n"
                continue
            raise ValueError(f"{path}: line {first}: cannot split the line into words ({exc})") from None
        _no_bare_pipes(joined, split, path, first)
        out += [(w, first) for w in _expanded(split)]
        joined, first = "", None
    return out


def _no_bare_pipes(text: str, split: list[str], path: str, line: int) -> None:
    """Refuse a word with an unquoted ``|`` in it (a layout written without quotes): the shell
    would cut the command there and pipe it into the rest."""
    piped = [w for w in split if "|" in w and w.strip("|")]
    if not piped:
        return
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = set(lexer)
    except ValueError:
        return
    for word in piped:
        if word not in tokens:
            raise ValueError(f"{path}: line {line}: {word!r}: the shell reads an unquoted '|' as a pipe and "
                             f"cuts the command there; quote it ('{word}')")


def _closed(text: str) -> bool:
    """Whether ``text`` ends outside any quoted string."""
    try:
        shlex.split(text)
    except ValueError:
        return False
    return True


def _expanded(split: list[str]) -> list[str]:
    """The words of one command as the flags they pass: ``NAME=(--a 1`` ... ``x)`` (a bash array
    on one or more lines) without its brackets, and a string variable's flags split at spaces
    (as an unquoted ``$NAME`` is, quotes inside kept)."""
    out = []
    for word in split:
        if _ARRAY.match(word):
            word = word[word.index("(") + 1:]
        elif _ASSIGN.fullmatch(word) and re.search(r"(^|\s)--[a-z]", _ASSIGN.fullmatch(word).group(1)):
            out += _ASSIGN.fullmatch(word).group(1).split()
            continue
        if word.endswith(")") and not word.endswith("\\)") and "(" not in word:
            word = word[:-1]
        if word:
            out.append(word)
    return out


def arguments(text: str, path: str) -> dict[str, tuple[list[str], int]]:
    """The read flags of a text: ``{flag: (values, line)}`` (see the module docstring)."""
    tokens = words(text, path)
    out: dict[str, tuple[list[str], int]] = {}
    i = 0
    while i < len(tokens):
        word, line = tokens[i]
        i += 1
        if not word.startswith("--") or word == "--":
            continue
        flag, eq, value = word.partition("=")
        if flag in NOT_FLAGS:
            raise ValueError(f"{path}: line {line}: {flag} is not a Megatron flag (its parser refuses it): "
                             f"{NOT_FLAGS[flag]}")
        if flag not in READ:
            near = misspelt(flag, READ, KNOWN)
            if near is not None:
                raise ValueError(f"{path}: line {line}: unknown flag {flag} (did you mean {near}?); Megatron would "
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
            if i >= len(tokens) or tokens[i][0].startswith("--"):
                raise ValueError(f"{path}: line {line}: {flag}: the value is missing")
            values = [tokens[i][0]]
            i += 1
        else:  # names up to the next flag, in this command
            values = []
            while i < len(tokens) and tokens[i][1] == line and _NAME.fullmatch(tokens[i][0]):
                values.append(tokens[i][0])
                i += 1
            if not values:  # argparse's nargs="+"
                raise ValueError(f"{path}: line {line}: {flag}: Megatron needs at least one name after it")
        for v in values:
            if "$" in v or "`" in v:
                raise ValueError(f"{path}: line {line}: {flag} {v}: a shell variable; gpuknap reads values written "
                                 "in the file (write the number, or run the script with `bash -x` to see it)")
        out[flag] = (values, line)
    return out
