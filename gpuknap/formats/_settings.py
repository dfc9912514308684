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

from ._documents import check_shape, read_text

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


def _unique_loader() -> Any:
    import yaml

    class Unique(yaml.SafeLoader):
        """PyYAML's safe loader refusing a key given twice in one mapping."""

    def mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        seen: dict = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: the safe loader refuses it itself
                continue
            if first != key_node.start_mark.line:
                raise ValueError(f"line {key_node.start_mark.line + 1}: the key {key!r} is given twice (also at "
                                 f"line {first + 1}); a YAML reader keeps the last silently: keep one")
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    Unique.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return Unique


def parse_document(text: str, path: str) -> Any:
    """A JSON or YAML document, a key given twice in one mapping refused (ValueError naming the file)."""
    if text.lstrip().startswith("{"):
        def pairs(items: list) -> dict:
            out: dict = {}
            for key, value in items:
                if key in out:
                    raise ValueError(f"{path}: the key {key!r} is given twice in one object; keep one")
                out[key] = value
            return out
        try:
            data = json.loads(text, object_pairs_hook=pairs)
        except json.JSONDecodeError:
            data = None
        if data is not None:
            check_shape(data, path)
            return data
    try:
        import yaml
    except ImportError:
        raise ValueError(f"{path}: reading YAML needs PyYAML (pip install 'gpuknap[yaml]')") from None
    try:
        data = yaml.load(text, Loader=_unique_loader())  # noqa: S506 - a SafeLoader subclass
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{path}: not valid YAML{at} ({getattr(exc, 'problem', None) or 'syntax error'})") from None
    except RecursionError:
        raise ValueError(f"{path}: the document is nested too deeply") from None
    check_shape(data, path)
    return data


#: A Megatron flag at the start of a word.
FLAG = re.compile(r"(?:^|\s)--[a-z][a-z0-9-]*")


def looks_like_arguments(text: str) -> bool:
    """Whether a text holds command-line flags (outside comments)."""
    return any(FLAG.search(line.split("#", 1)[0]) for line in text.splitlines())
