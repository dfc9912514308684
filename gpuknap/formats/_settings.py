"""Reading a training framework's settings file strictly: bounded in size, duplicated keys and
flags refused, misspelt names caught, and the two formats told apart by their content.

A settings file is small (a launch script, a YAML configuration): anything over
:data:`MAX_SETTINGS_BYTES` is refused before it is parsed.  A duplicated key or
flag is refused by name, although MindFormers' YAML reader and Megatron's
argument parser both keep the last one silently: gpuknap cannot know which
one the user meant.  In the mappings and flag lists a framework leaves open
(``model.model_config``, the top of a MindFormers file, the flags of a launch
script), a name that is not one gpuknap reads but is close to one (and is not
one of the framework's own names listed as close) is refused with the name it
resembles: a misspelt ``offset`` silently ignored is a wrong plan.
"""
from __future__ import annotations

import difflib
import functools
import json
import os
import re
from typing import Any, Iterable

from ._documents import check_shape, read_text, unique_pairs, yaml_load

#: Largest settings file read (bytes): a launch script or a configuration is far smaller.
MAX_SETTINGS_BYTES = 256 * 1024
#: How close (difflib ratio) an unknown name must be to a read one to be called misspelt.
NEAR = 0.8


def settings_text(path: str) -> str:
    """The file's text, refused before reading when it is over :data:`MAX_SETTINGS_BYTES`."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0  # read_text says why it cannot be read
    if size > MAX_SETTINGS_BYTES:
        raise ValueError(f"{path}: {size:,} bytes is over the {MAX_SETTINGS_BYTES:,} bytes read for settings "
                         "(a launch script or a framework configuration is far smaller)")
    return read_text(path, MAX_SETTINGS_BYTES)


def misspelt(name: str, read: Iterable[str], known: Iterable[str] = ()) -> str | None:
    """The read name ``name`` is a near miss of, unless it is read or one of ``known``; else None."""
    return _misspelt(str(name), tuple(sorted(read)), frozenset(known))


@functools.lru_cache(maxsize=4096)
def _misspelt(name: str, read: tuple, known: frozenset) -> str | None:
    if name in read or name in known:
        return None
    best, score = None, NEAR
    for r, m in zip(read, _matchers(read)):  # the cheap upper bounds first: most names are nowhere near
        m.set_seq1(name)
        if m.real_quick_ratio() >= score and m.quick_ratio() >= score and m.ratio() >= score:
            best, score = r, m.ratio()
    return best


@functools.lru_cache(maxsize=64)
def _matchers(read: tuple) -> list:
    """One matcher per read name, its tables built once (``set_seq1`` keeps them)."""
    out = []
    for r in read:
        m = difflib.SequenceMatcher(None)
        m.set_seq2(r)
        out.append(m)
    return out


def check_misspelt(mapping: dict, read: Iterable[str], known: Iterable[str], where: str) -> None:
    """Refuse the first key of ``mapping`` that is a near miss of a read key."""
    for key in mapping:
        near = misspelt(str(key), read, known)
        if near is not None:
            raise ValueError(f"{where}: unknown key {str(key)!r} (did you mean {near!r}?): gpuknap reads "
                             f"{near!r} here and would otherwise ignore this one")


def parse_document(text: str, path: str) -> Any:
    """A JSON or YAML document, a key given twice in one mapping refused (ValueError naming the file)."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text, object_pairs_hook=unique_pairs(path))
        except json.JSONDecodeError:
            data = None
        if data is not None:
            check_shape(data, path)
            return data
    data = yaml_load(text, path)
    check_shape(data, path)
    return data


#: A Megatron flag at the start of a word.
FLAG = re.compile(r"(?:^|\s)--[a-z][a-z0-9-]*")


def looks_like_arguments(text: str) -> bool:
    """Whether a text holds command-line flags (outside comments)."""
    return any(FLAG.search(line.split("#", 1)[0]) for line in text.splitlines())
