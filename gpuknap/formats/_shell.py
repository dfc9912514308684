"""A launch script's words as the shell passes them (private; :mod:`._arguments` reads flags from them).

The text is cut into commands as bash would: lines joined at a trailing backslash, quoted
strings kept whole over several lines, comments dropped (a ``#`` starts one only at the start
of a word, and a comment ends at its line's end, a backslash in it included), here-documents'
text skipped; a comment line inside a continued command ends it (bash ends the command
there), so flags on the lines after it would never reach the program, and are refused
(inside an array's parentheses a newline is only a space: the array goes on).  Variables are
followed as far as a reader can without running the script:

- a bash array (``ARGS=( ... )`` on one line or several, ended by its unmatched unquoted
  ``)``; ``ARGS+=( ... )`` appends; ``declare -a``) or a string variable
  (``ARGS="--a 1 --b"``) is stored where it is assigned, its words split at spaces as an
  unquoted ``$ARGS`` passes them (quotes inside kept), references inside the value expanded;
- its words are passed where it is referenced as a word of its own (``$ARGS``, ``${ARGS}``,
  ``"${ARGS[@]}"``), the first time only; a variable never referenced passes nothing, unless
  the file runs no program: a block of definitions (as ``best --emit megatron`` writes one)
  passes the variables holding flags, as written;
- a variable set inside an ``if`` or ``case`` block is refused where it is used: which
  branch runs is not in the file; a variable the file does not set stays a ``$word``;
- ``unset NAME`` removes the variable, as bash does (it passes nothing after); an array with
  one element assigned or unset (``A[0]=...``, ``unset 'A[0]'``), or a variable unset inside an
  ``if`` or ``case`` block, is refused where it is read; an array left unclosed at the end of
  the file is refused (bash stops with a syntax error);
- ``echo`` and ``printf`` commands pass nothing; ``VAR=value`` words before a program are its
  environment, not its words.

A script that runs a program and also has a line that starts with a flag (after an empty line,
or a space after the backslash meant to continue the line before) is refused: bash runs that
line as a command of its own, so its flags never reach the program.  A file of flags only (an
arguments file) is read as written.  Not followed (checked against bash by a differential fuzz,
and rare in launch scripts): a quoted reference passing one word (``"$ARGS"``, ``"${A[*]}"``), a
single-quoted or escaped ``$NAME`` (read as the variable), empty words, several assignments on
one line, ``~`` and brace expansion, function bodies (read where they are written), a
here-document line ending in a backslash (bash joins it to the next).

A word with an unquoted ``|`` (a layout written without quotes) is refused: the shell would
cut the command there and pipe it into the rest.
"""
from __future__ import annotations

import bisect
import re
import shlex

_ARRAY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=\((.*)", re.S)  # NAME=( or NAME+=(
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)", re.S)
_ELEMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\[[^]]*\]\+?=.*", re.S)  # A[0]=... or A[i]+=...
_REFERENCE = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)(?:\[[@*]\])?\})")
_FLAG = re.compile(r"(^|\s)--[a-z]")
#: ``--flag=$NAME`` (or ``${NAME}``): bash expands the variable after the ``=`` as it would a whole word.
_EQ_REFERENCE = re.compile(r"(--[A-Za-z0-9][A-Za-z0-9_-]*=)\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")
#: Commands whose words are printed, not passed.
_PRINTERS = ("echo", "printf")
#: Commands whose words are assignments.
_DECLARERS = ("export", "local", "declare", "readonly")
#: First words that run no program themselves.
_KEYWORDS = _DECLARERS + ("if", "then", "else", "elif", "fi", "case", "esac", "set", "source", ".", "[", "[[",
                          "test", "for", "do", "done", "while", ")", "(", "{", "}")


#: Characters after which an unquoted ``#`` starts a word, and so a comment (bash's metacharacters).
_WORD_BREAK = " \t;&|()<>"


def _scan(line: str, quote: str | None) -> tuple[str, str | None, int, int]:
    """One physical line as bash reads it, entered inside ``quote`` (None, ``'`` or ``"``):
    ``(the line without its comment, the quote open at its end, the lowest and the last depth
    of unquoted parentheses)``.  A ``#`` starts a comment only at the start of a word (not in
    ``run#3`` or ``${#A[@]}``); a comment runs to the end of the line, a backslash in it included."""
    depth = low = 0
    i, escaped = 0, -1  # escaped: the position of the last character a backslash escaped
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = None if c == "'" else quote
        elif c == "\\":
            i += 1  # the next character is escaped (inside double quotes too, near enough)
            escaped = i
        elif quote == '"':
            quote = None if c == '"' else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in _WORD_BREAK and escaped != i - 1):
            return line[:i].rstrip(), None, low, depth
        elif c in "()":
            depth += 1 if c == "(" else -1
            low = min(low, depth)
        i += 1
    return line, quote, low, depth


def _continued(kept: str) -> bool:
    """Whether a line (its comment dropped) ends with a backslash that joins the next line to it
    (an odd run of them: ``\\\\`` is an escaped backslash)."""
    return (len(kept) - len(kept.rstrip("\\"))) % 2 == 1


def _punctuated(text: str, chars: str) -> list[str] | None:
    """The shell words of ``text`` (comments already dropped) with unquoted runs of ``chars``
    split off as words of their own (None when the text does not split)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=chars)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:
        return None


def _heredoc(text: str) -> tuple[str, bool] | None:
    """The delimiter of a here-document a command opens with an unquoted ``<<`` outside any
    parentheses (``<<END``, ``<< 'END'``, ``<<-END``; not ``$((1<<3))``) and whether its lines
    may be indented with tabs; None without one (``<<<`` is a here-string, ``"<<x"`` a word)."""
    tokens = _punctuated(text, "<>()|&;") or []
    depth = 0
    for i, token in enumerate(tokens[:-1]):
        if token and not token.strip("()"):
            depth += token.count("(") - token.count(")")
        elif token == "<<" and depth <= 0:
            delimiter = tokens[i + 1]
            dash = delimiter.startswith("-")
            delimiter = delimiter[1:] if dash else delimiter
            return (delimiter, dash) if delimiter.strip("<>()|&;") else None
    return None


#: What shlex skips between words.
_BLANKS = re.compile(r"[ \t\r\n]*")


def _split_at(joined: str, starts: list[tuple[int, int]]) -> tuple[list[str], list[int]]:
    """``shlex.split`` of a command's text, with the line each word starts on (``starts``: the
    offset in the text where each of its physical lines begins, with that line's number)."""
    lex = shlex.shlex(joined, posix=True)
    lex.whitespace_split, lex.commenters = True, ""
    offsets = [offset for offset, _ in starts]
    split, at, end = [], [], 0
    while True:
        word = lex.get_token()
        if word is None:
            return split, at
        begin = _BLANKS.match(joined, end).end()  # the word's first character
        split.append(word)
        at.append(starts[bisect.bisect_right(offsets, begin) - 1][1])
        end = lex.instream.tell()


def commands(text: str, path: str) -> list[tuple[list[str], int, int, int, list[int]]]:
    """The commands of a text: each its shell words, its first line, the lowest and the last
    depth of its unquoted parentheses (how an array's lines open and close it), and the line
    each word is written on (a command continued over lines has words on several)."""
    out: list[tuple[list[str], int, int, int, list[int]]] = []
    lines = re.split(r"\r?\n", text)
    joined, first, quote, low, depth, heredoc = "", None, None, 0, 0, None
    starts: list[tuple[int, int]] = []  # where each physical line begins in joined
    in_array = False  # inside an array's parentheses, where a newline is only a space
    for number, line in enumerate(lines, 1):
        if heredoc is not None:  # a here-document's text is input to a program, not words
            if (line.lstrip("\t") if heredoc[1] else line) == heredoc[0]:
                heredoc = None
            continue
        if first is None:
            first = number
        starts.append((len(joined), number))
        kept, quote_after, line_low, line_depth = _scan(line, quote)
        comment_only = quote is None and not kept.strip() and line.strip().startswith("#")
        if joined and comment_only and not in_array and depth <= 0 \
                and number < len(lines) and lines[number].lstrip().startswith("-"):
            raise ValueError(f"{path}: line {number}: this comment ends the command continued from line {first} "
                             f"(the shell ends it there), so the flags from line {number + 1} on are not passed "
                             "to it; move the comment out of the command")
        low, depth = min(low, depth + line_low), depth + line_depth
        if quote_after in (None, '"') and _continued(kept) and number < len(lines):
            joined += kept[:-1] + ("" if quote_after else " ")  # inside double quotes: the two just vanish
            quote = quote_after
            continue
        joined += kept
        quote = quote_after
        if quote is not None:  # a quoted string goes on over the next line
            if number < len(lines):
                joined += "\n"
                continue
            raise ValueError(f"{path}: line {first}: cannot split the line into words (no closing quotation)")
        try:
            split, at = _split_at(joined, starts)
        except ValueError as exc:
            raise ValueError(f"{path}: line {first}: cannot split the line into words ({exc})") from None
        _no_bare_pipes(joined, split, path, first)
        out.append((split, first, low, depth, at))
        heredoc = _heredoc(joined)
        in_array = low >= 0 if in_array else _opens_array(split) and depth > 0
        joined, first, low, depth, starts = "", None, 0, 0, []
    return out


def words(text: str, path: str, ends: bool = False) -> list[tuple[str | None, int]]:
    """The words a script passes, with the line each was written on (the module docstring); with
    ``ends``, a ``(None, line)`` after each command's words (a command may span lines: an array)."""
    out: list[tuple[str, int]] = []
    stored: dict[str, list[tuple[str, int]]] = {}
    passed: set[str] = set()
    uncertain: dict[str, int] = {}  # variables set inside if / case blocks: the line
    partly: dict[str, tuple[str, int]] = {}  # variables with an element assigned or unset: the word, the line
    array: tuple[str, list] | None = None  # an array being defined over several lines
    opened = 0  # the line that array opens on
    depth = 0  # if / case blocks open
    ran = False  # a command other than assignments (a program run)
    stray: tuple[str, int] | None = None  # the first command that starts with a flag (outside if / case)

    def expand(word: str, line: int, passing: bool = True) -> list[tuple[str, int]]:
        eq = _EQ_REFERENCE.fullmatch(word)
        if eq is not None and (eq.group(2) or eq.group(3)) in stored:  # --flag=$X: the value's words, split
            held = expand("$" + (eq.group(2) or eq.group(3)), line, passing=False)
            return [(eq.group(1) + (held[0][0] if held else ""), line)] + held[1:]
        found = _REFERENCE.fullmatch(word)
        name = None if found is None else found.group(1) or found.group(2)
        if name in partly:
            _refuse_partly(path, line, word, *partly[name])
        if name not in stored:  # a plain word, or a variable the file does not set (refused if read)
            return [(word, line)]
        if name in uncertain:
            raise ValueError(f"{path}: line {line}: {word} is set inside an if or case block (line "
                             f"{uncertain[name]}); which branch runs is not in the file: write what the run uses")
        if passing and any(_FLAG.search(w) for w, _ in stored[name]):  # flags: passed once, as they are run once
            if name in passed:
                return []
            passed.add(name)
        return stored[name]

    def store(name: str, values: list[tuple[str, int]], line: int, append: bool = False) -> None:
        """Set (or append to) a variable: its words, each with the line it was written on."""
        if depth:
            uncertain[name] = line
        held: list[tuple[str, int]] = list(stored.get(name, [])) if append else []
        for v, at in values:
            held += expand(v, at, passing=False) if _REFERENCE.fullmatch(v) or _EQ_REFERENCE.fullmatch(v) else [(v, at)]
        stored[name] = held
        passed.discard(name)
        if not append:  # set whole again: every word known
            partly.pop(name, None)

    for split, line, low, end, at in commands(text, path):
        if array is not None:  # the lines of an array defined over several: an unmatched ")" ends it
            name, append, held = array
            closing = low < 0
            held += [(_unclosed(w) if closing and i == len(split) - 1 else w, at[i]) for i, w in enumerate(split)]
            if closing:
                store(name, [(w, at) for w, at in held if w], line, append)
                array = None
            continue
        if split and split[0] in ("if", "case"):
            depth += 1
        if any(w in ("fi", "esac") or w.rstrip(";") in ("fi", "esac") for w in split):
            depth = max(depth - 1, 0)
        if split and split[0] in _PRINTERS:
            continue
        rest = _assignment(split)
        element = _ELEMENT.fullmatch(rest[0]) if len(rest) == 1 else None
        if element is not None:  # one element: refused where the array is read
            partly.setdefault(element.group(1), (f"{rest[0][:40]}: one element assigned", line))
            continue
        if split and split[0] == "unset":
            _unset(split[1:], line, depth, stored, uncertain, partly)
            continue
        defined = _ARRAY.fullmatch(rest[0]) if rest else None
        if defined is not None:
            name, append, held = defined.group(1), bool(defined.group(2)), [defined.group(3)] + rest[1:]
            if end <= 0:  # closed on its own line
                held[-1] = _unclosed(held[-1])
            skipped = len(split) - len(rest)  # the declarer and its options
            pairs = [(w, at[skipped + i]) for i, w in enumerate(held) if w]
            if end <= 0:
                store(name, pairs, line, append)
            else:
                array = (name, append, pairs)
                opened = line
            continue
        assigned = _ASSIGN.fullmatch(rest[0]) if len(rest) == 1 else None
        if assigned is not None:
            value = assigned.group(3).split()
            store(assigned.group(1), [(w, line) for w in value], line, bool(assigned.group(2)))
            continue
        program = list(zip(split, at))
        while len(program) > 1 and _ASSIGN.fullmatch(program[0][0]):  # VAR=value prefixes: the program's
            program = program[1:]  # environment (CUDA_VISIBLE_DEVICES=0 python ...), not its words
        passed_words = [e for word, word_at in program for e in expand(word, word_at)]
        led = bool(passed_words) and passed_words[0][0].startswith("-")
        if led and not depth and stray is None:
            stray = passed_words[0]
        ran = ran or bool(program) and not led and not _ASSIGN.fullmatch(program[0][0]) \
            and program[0][0] not in _KEYWORDS
        out += passed_words + ([(None, line)] if ends and passed_words else [])
    if array is not None:  # bash: "syntax error: unexpected end of file"
        raise ValueError(f"{path}: line {opened}: the array {array[0]}=( is never closed (no unmatched ')' before "
                         "the end of the file; bash stops with a syntax error)")
    if ran and stray is not None:  # a script whose program runs: a line of flags is a command of its own
        raise ValueError(f"{path}: line {stray[1]}: {stray[0]}: bash runs this line as a command of its own (the "
                         "line before does not end with a backslash, or has a space or an empty line after it), so "
                         "these flags never reach the program; join the lines")
    if not ran:  # only definitions: a block of them (as gpuknap writes one), read as written
        for name, held in stored.items():
            if any(_FLAG.search(w) for w, _ in held):
                if name in partly:
                    _refuse_partly(path, held[0][1], name, *partly[name])
                out += held + ([(None, held[-1][1])] if ends else [])
    return out


def _unset(names: list[str], line: int, depth: int, stored: dict, uncertain: dict, partly: dict) -> None:
    """``unset NAME ...`` (``-v``): the variables are gone, as in bash; ``unset -f`` (functions)
    changes no variable; an element (``unset 'A[0]'``) leaves the array partly known, and an
    unset inside an if or case block leaves whether it ran unknown."""
    if names and names[0] == "-f":
        return
    for name in (n for n in names if not n.startswith("-")):
        element = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[.*\]", name, re.S)
        if element is not None:
            partly.setdefault(element.group(1), (f"unset {name[:40]}: one element unset", line))
        elif depth:  # may not run: a variable set before is then unknown; one never set stays unseen
            if name in stored:
                partly[name] = (f"unset {name} inside an if or case block, which may not run", line)
        else:  # known to be empty: its references pass nothing (not words gpuknap cannot see)
            stored[name] = []
            uncertain.pop(name, None)
            partly.pop(name, None)


def _refuse_partly(path: str, line: int, word: str, how: str, at: int) -> None:
    raise ValueError(f"{path}: line {line}: {word}: line {at} ({how}) leaves the words it passes unknown to gpuknap, "
                     "which reads variables assigned whole (NAME=( ... ), NAME+=( ... ), NAME=...): write them so")


def _assignment(split: list[str]) -> list[str]:
    """A command's words from its assignment on (``declare -a X=(...)``: the declarer and its
    options skipped)."""
    rest = split
    if split and split[0] in _DECLARERS:
        rest = split[1:]
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
    return rest


def _opens_array(split: list[str]) -> bool:
    rest = _assignment(split)
    return bool(rest) and _ARRAY.fullmatch(rest[0]) is not None


def _unclosed(word: str) -> str:
    """The last word of an array without the ``)`` that ends the array (and a ``;`` after it)."""
    word = word.rstrip(";")
    return word[:-1] if word.endswith(")") else word


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
