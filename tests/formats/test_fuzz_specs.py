"""Fuzzing the spec reader through the CLI (in-process): random JSON trees, key typos in
every closed mapping, random unit strings.  Whatever the input, the outcome is a result
(exit 0), "nothing feasible" (exit 1) or one line on stderr (exit 2) -- never a traceback,
never another exit code."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import tempfile

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpuknap.cli import main
from gpuknap.formats.spec import DEVICE, KIND, LAYER_RUN, OPTION, PIPELINE, TOP_LEVEL

BASE = {
    "name": "fuzz base",
    "layers": [{"kind": "A", "count": 4}, {"kind": "B", "count": 4}, {"kind": "A", "count": 4}],
    "kinds": {
        "A": {"static": "100 MB", "options": [
            {"name": "keep", "memory": "64 MB", "forward": "1 ms", "backward": "2 ms"},
            {"name": "full", "memory": "8 MB", "forward": "1 ms", "backward": "3 ms", "held_once": "1 MB"}]},
        "B": {"static": "200 MB", "options": [
            {"name": "keep", "memory": "96 MB", "forward": "2 ms", "backward": "4 ms", "excess": [[1, "1 MB"]]},
            {"name": "full", "memory": "16 MB", "forward": "2 ms", "backward": "6 ms"}]},
    },
    "device": {"capacity": "2 GiB", "reserved": "100 MB"},
    "pipeline": {"stages": 3, "micro_batches": 4},
    "bucket": "1 MiB",
}
#: Closed mappings of the base spec: (path to it, its known keys).
CLOSED = [((), TOP_LEVEL), (("device",), DEVICE), (("pipeline",), PIPELINE), (("layers", 0), LAYER_RUN),
          (("layers", 2), LAYER_RUN), (("kinds", "A"), KIND), (("kinds", "B", "options", 0), OPTION),
          (("kinds", "A", "options", 1), OPTION)]
#: Fields of the base spec that hold quantities.
QUANTITIES = [("device", "capacity"), ("device", "reserved"), ("bucket",), ("kinds", "A", "static"),
              ("kinds", "A", "options", 0, "memory"), ("kinds", "B", "options", 1, "forward"),
              ("kinds", "A", "options", 1, "held_once"), ("kinds", "B", "options", 0, "excess", 0, 1)]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(document: str | dict, suffix: str = ".json") -> tuple[int, str, str]:
    """``gpuknap best FILE`` in-process, with a low work limit so any valid input is quick."""
    text = document if isinstance(document, str) else json.dumps(document)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "spec" + suffix)
        with open(path, "w") as fh:
            fh.write(text)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["best", path, "--quiet", "--backend", "numpy", "--max-work", "2e7"])
    return rc, out.getvalue(), err.getvalue()


def check_outcome(rc: int, out: str, err: str) -> None:
    assert rc in (0, 1, 2), (rc, err)
    if rc == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuknap: error: "), err
    else:
        assert err == "" and out


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20)


@FUZZ
@given(json_values)
def test_random_json_trees(value):
    check_outcome(*run(json.dumps(value)))


@FUZZ
@given(st.dictionaries(st.sampled_from(sorted(TOP_LEVEL)), json_values, max_size=5))
def test_random_values_under_known_keys(data):
    check_outcome(*run(data))


def _at(data, path):
    for key in path:
        data = data[key]
    return data


def _typo(draw, key: str) -> str:
    i = draw(st.integers(0, len(key)))
    how = draw(st.sampled_from(["insert", "delete", "replace", "swap"]))
    letter = draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz_"))
    if how == "insert":
        return key[:i] + letter + key[i:]
    if how == "delete" and i < len(key):
        return key[:i] + key[i + 1:]
    if how == "swap" and i + 1 < len(key):
        return key[:i] + key[i + 1] + key[i] + key[i + 2:]
    return key[:i] + letter + key[i + 1:]


@FUZZ
@given(st.data())
def test_key_typos_are_refused_by_name(data):
    path, known = data.draw(st.sampled_from(CLOSED))
    spec = copy.deepcopy(BASE)
    mapping = _at(spec, path)
    key = data.draw(st.sampled_from(sorted(mapping)))
    wrong = _typo(data.draw, key)
    assume(wrong not in known)
    mapping[wrong] = mapping.pop(key)
    rc, out, err = run(spec)
    check_outcome(rc, out, err)
    assert rc == 2 and "unknown field" in err and repr(wrong) in err


units = st.from_regex(r"\A\s?[-+]?\d{0,5}(\.\d{0,3})?([eE][-+]?\d{1,3})?\s?[A-Za-zµ]{0,4}\s?\Z")


@FUZZ
@given(st.sampled_from(QUANTITIES), units | st.text(max_size=8))
def test_random_unit_strings(field, value):
    spec = copy.deepcopy(BASE)
    _at(spec, field[:-1])[field[-1]] = value
    check_outcome(*run(spec))


def test_the_base_spec_solves():
    rc, out, err = run(BASE)
    assert rc == 0 and "#1 of fuzz base" in out, err


def test_yaml_trees_too():
    import yaml
    for value in ([1, {"a": None}], {"device": [1, 2]}, "just text", {"name": {"x": [1] * 5}}):
        check_outcome(*run(yaml.safe_dump(value), ".yaml"))
