"""Reading JSON and YAML input documents safely, and checking their keys.

Every input file goes through :func:`read_document`: it names the file in
every error, refuses files that are not UTF-8 text, documents nested too
deep or with too many values (a YAML alias bomb expands into billions of
values from a few lines), and anything over :data:`MAX_FILE_BYTES`.  Mappings
are closed: :func:`check_keys` refuses unknown keys and suggests the nearest
known one, because a misspelt ``reserved`` that is silently ignored is a
wrong plan.
"""
from __future__ import annotations

import difflib
import json
import os
from typing import Any, Iterable, Mapping

#: Largest input file read (bytes).
MAX_FILE_BYTES = 64 * 2**20
#: Most values (mappings, lists and scalars, counted every time they are reached) in one document.
MAX_VALUES = 1_000_000
#: Deepest nesting of mappings and lists.
MAX_DEPTH = 64


def suggest(key: Any, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the nearest known name, or ``""``."""
    near = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


def check_keys(mapping: Mapping, known: Iterable[str], where: str) -> None:
    """Raise ValueError naming ``where`` for the first key not in ``known``."""
    known = set(known)
    for key in mapping:
        if key not in known:
            raise ValueError(f"{where}: unknown field {_show(key)}{suggest(key, known)}; "
                             f"known: {', '.join(sorted(known))}")


def _show(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 40 else text[:37] + "..."


def check_shape(data: Any, path: str) -> None:
    """Refuse documents nested deeper than MAX_DEPTH or with more than MAX_VALUES values."""
    budget = MAX_VALUES
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise ValueError(f"{path}: the document has more than {MAX_VALUES:,} values "
                             "(YAML aliases expanding?); refusing to read it")
        if depth > MAX_DEPTH:
            raise ValueError(f"{path}: the document is nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, Mapping):
            stack.extend((v, depth + 1) for v in value.values())
            stack.extend((k, depth + 1) for k in value.keys() if not isinstance(k, (str, int, float)))
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value)


def read_text(path: str, limit: int = MAX_FILE_BYTES) -> str:
    """The file's text (UTF-8, at most ``limit`` bytes), or ValueError naming the file."""
    try:
        if os.path.isdir(path):
            raise ValueError(f"{path}: is a directory, not a file")
        size = os.path.getsize(path)
        if size > limit:
            raise ValueError(f"{path}: {size:,} bytes is over the {limit // 2**20} MiB limit for this input")
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a text file (invalid UTF-8 at byte {exc.start})") from None
    if "\x00" in text:
        raise ValueError(f"{path}: not a text file (it contains NUL bytes)")
    return text


class DuplicateKey(ValueError):
    """A document gives one key twice in one mapping (the last would silently win)."""


#: Longest integer literal read (Python's own limit on converting a string to an int is 4,300 digits).
MAX_DIGITS = 4000


def _too_long(path: str, digits: str) -> ValueError:
    """The refusal of an integer literal Python will not convert (its own error names no file)."""
    return ValueError(f"{path}: not valid here: an integer of {digits} digits (no number gpuknap reads is that long)")


def _yaml_loader(yaml: Any) -> Any:
    """PyYAML's safe loader, refusing a key given twice in one mapping.  Merge keys (``<<: *base``)
    are PyYAML's: the keys they bring in may be given again in the mapping, whose value wins."""
    merge = "tag:yaml.org,2002:merge"

    class Loader(yaml.SafeLoader):
        def flatten_mapping(self, node: Any) -> None:
            # checked before PyYAML moves the merged keys into the mapping (a merged mapping is
            # flattened here too, so its own keys are checked before it is merged)
            if not getattr(node, "gpuknap_checked", False):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == merge:
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        first = seen.get(key)
                    except TypeError:
                        continue  # an unhashable key: PyYAML refuses it itself
                    if first is not None:
                        raise DuplicateKey(f"the key {key!r} is given twice (lines {first} and {line}); a YAML "
                                           "reader keeps the last silently: keep one")
                    seen[key] = line
                node.gpuknap_checked = True
            super().flatten_mapping(node)
    return Loader


def yaml_load(text: str, path: str) -> Any:
    """A YAML document (PyYAML's safe loader), a key given twice in one mapping refused."""
    try:
        import yaml
    except ImportError:
        raise ValueError(f"{path}: reading YAML needs PyYAML (pip install 'gpuknap[yaml]')") from None
    try:
        return yaml.load(text, Loader=_yaml_loader(yaml))  # noqa: S506 - a SafeLoader subclass
    except DuplicateKey as exc:
        raise ValueError(f"{path}: {exc}") from None
    except ValueError as exc:  # PyYAML's int() on an integer of over 4,300 digits
        if "digits" not in str(exc):
            raise
        raise _too_long(path, "over 4,300") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        what = getattr(exc, "problem", None) or "syntax error"
        raise ValueError(f"{path}: not valid YAML{at} ({what})") from None
    except RecursionError:
        raise ValueError(f"{path}: the document is nested too deeply") from None


def unique_pairs(path: str) -> Any:
    """A ``json.loads`` ``object_pairs_hook`` refusing a key given twice in one object."""
    def no_duplicates(pairs: list) -> dict:
        out: dict = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"{path}: the key {key!r} is given twice in one object; keep one")
            out[key] = value
        return out
    return no_duplicates


def _json_load(text: str, path: str) -> Any:
    def no_constants(name: str) -> Any:
        raise ValueError(f"{path}: not valid JSON ({name} is not a JSON number)")

    def whole(digits: str) -> int:  # Python refuses integers of over 4,300 digits, naming no file
        if len(digits) > MAX_DIGITS:
            raise _too_long(path, f"{len(digits):,}")
        return int(digits)

    try:
        return json.loads(text, parse_constant=no_constants, parse_int=whole, object_pairs_hook=unique_pairs(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise ValueError(f"{path}: the document is nested too deeply") from None


def read_document(path: str) -> Any:
    """A JSON or YAML document (``.yaml``/``.yml`` is YAML, anything else JSON), checked for shape."""
    text = read_text(path)
    data = yaml_load(text, path) if path.endswith((".yaml", ".yml")) else _json_load(text, path)
    check_shape(data, path)
    return data
