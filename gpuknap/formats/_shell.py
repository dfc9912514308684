"""A launch script's words as the shell passes them (private; :mod:`._arguments` reads flags from them).

The text is cut into commands as bash would: lines joined at a trailing backslash, quoted
strings kept whole over several lines, comments dropped; a comment line inside a continued
command ends it (bash ends the command there), so flags on the lines after it would never
reach the program, and are refused.  Variables are followed as far as a reader can without
running the script:

- a bash array (``ARGS=( ... )`` on one line or several) or a string variable
  (``ARGS="--a 1 --b"``) is stored where it is assigned, its words split at spaces as an
  unquoted ``$ARGS`` passes them (quotes inside kept), references inside the value expanded;
- its words are passed where it is referenced as a word of its own (``$ARGS``, ``${ARGS}``,
  ``"${ARGS[@]}"``), the first time only; a variable never referenced passes nothing, unless
  the file runs no program: a block of definitions (as ``best --emit megatron`` writes one)
  passes the variables holding flags, as written;
- a variable set inside an ``if`` or ``case`` block is refused where it is used: which
  branch runs is not in the file; a variable the file does not set stays a ``$word``;
- ``echo`` and ``printf`` commands pass nothing.

A word with an unquoted ``|`` (a layout written without quotes) is refused: the shell would
cut the command there and pipe it into the rest.
"""
from __future__ import annotations

import re
import shlex

_ARRAY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=\((.*)", re.S)
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
_REFERENCE = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)(?:\[[@*]\])?\})")
_FLAG = re.compile(r"(^|\s)--[a-z]")
#: Commands whose words are printed, not passed.
_PRINTERS = ("echo", "printf")
#: Commands whose words are assignments.
_DECLARERS = ("export", "local", "declare", "readonly")
#: First words that run no program themselves.
_KEYWORDS = _DECLARERS + ("if", "then", "else", "elif", "fi", "case", "esac", "set", "source", ".", "[", "[[",
                          "test", "for", "do", "done", "while", ")", "(", "{", "}")


def _punctuated(text: str, chars: str) -> list[str] | None:
    """The shell words of ``text`` with unquoted runs of ``chars`` split off as words of their own
    (None when the text does not split)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=chars)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:
        return None


def _closes_paren(text: str, split: list[str]) -> bool:
    """Whether ``text`` ends with an unquoted ``)`` (an array's end; a quoted ``'(1, 0)'`` is a word)."""
    tokens = _punctuated(text, "()")
    if tokens is None:
        return bool(split) and split[-1].endswith(")")
    return bool(tokens) and tokens[-1].endswith(")") and not tokens[-1].strip("()")


def commands(text: str, path: str) -> list[tuple[list[str], int, bool]]:
    """The commands of a text, each its shell words, its first line and whether it ends with an
    unquoted ``)``."""
    out: list[tuple[list[str], int, bool]] = []
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
        out.append((split, first, _closes_paren(joined, split)))
        joined, first = "", None
    return out


def words(text: str, path: str) -> list[tuple[str, int]]:
    """The words a script passes, with the line each was written on (the module docstring)."""
    out: list[tuple[str, int]] = []
    stored: dict[str, list[tuple[str, int]]] = {}
    passed: set[str] = set()
    uncertain: dict[str, int] = {}  # variables set inside if / case blocks: the line
    array: tuple[str, list] | None = None  # an array being defined over several lines
    depth = 0  # if / case blocks open
    ran = False  # a command other than assignments (a program run)

    def expand(word: str, line: int) -> list[tuple[str, int]]:
        found = _REFERENCE.fullmatch(word)
        name = None if found is None else found.group(1) or found.group(2)
        if name not in stored:  # a plain word, or a variable the file does not set (refused if read)
            return [(word, line)]
        if name in uncertain:
            raise ValueError(f"{path}: line {line}: {word} is set inside an if or case block (line "
                             f"{uncertain[name]}); which branch runs is not in the file: write what the run uses")
        if any(_FLAG.search(w) for w, _ in stored[name]):  # flags: passed once, as they are run once
            if name in passed:
                return []
            passed.add(name)
        return stored[name]

    def store(name: str, values: list[str], line: int) -> None:
        if depth:
            uncertain[name] = line
        held: list[tuple[str, int]] = []
        for v in values:
            held += expand(v, line) if _REFERENCE.fullmatch(v) else [(v, line)]
        stored[name] = held
        passed.discard(name)

    for split, line, closing in commands(text, path):
        if array is not None:  # the lines of an array defined over several
            name, held = array
            held += [w[:-1] if closing and i == len(split) - 1 else w for i, w in enumerate(split)]
            if closing:
                store(name, [w for w in held if w], line)
                array = None
            continue
        if split and split[0] in ("if", "case"):
            depth += 1
        if any(w in ("fi", "esac") or w.rstrip(";") in ("fi", "esac") for w in split):
            depth = max(depth - 1, 0)
        if split and split[0] in _PRINTERS:
            continue
        ran = ran or bool(split) and not _ASSIGN.fullmatch(split[0]) and split[0] not in _KEYWORDS
        rest = split[1:] if split and split[0] in _DECLARERS else split
        defined = _ARRAY.fullmatch(rest[0]) if rest else None
        if defined is not None:
            held = [defined.group(2)] + rest[1:]
            if closing:
                held[-1] = held[-1][:-1]
                store(defined.group(1), [w for w in held if w], line)
            else:
                array = (defined.group(1), [w for w in held if w])
            continue
        assigned = _ASSIGN.fullmatch(rest[0]) if len(rest) == 1 else None
        if assigned is not None:
            store(assigned.group(1), assigned.group(2).split(), line)
            continue
        for word in split:
            out += expand(word, line)
    if not ran:  # only definitions: a block of them (as gpuknap writes one), read as written
        for held in stored.values():
            if any(_FLAG.search(w) for w, _ in held):
                out += held
    return out


def _no_bare_pipes(text: str, split: list[str], path: str, line: int) -> None:
    """Refuse a word with an unquoted ``|`` in it."""
    piped = [w for w in split if "|" in w and w.strip("|")]
    if not piped:
        return
    tokens = _punctuated(text, "|")
    if tokens is None:
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
