"""Spec files, SAPP-PPB profiles, units and analytic transformer options."""
from __future__ import annotations

import json
import math
import os

import pytest
from paths import EXAMPLES, PACKAGED, SAMPLE, SHARED  # noqa: F401

from gpuknap import MEGABYTE, pp_lite
from gpuknap.formats import load_spec, parse_quantity, sapp_ppb


def test_sapp_ppb_worked_example():
    kinds, fronts, static = sapp_ppb.read_profile(SAMPLE)
    assert kinds[0] == "HEAD" and kinds[-1] == "TAIL" and kinds.count("BODY") == 96 and len(kinds) == 98
    body = {o.name: o for o in fronts["BODY"]}
    assert set(body) == {"NONE", "SLCT", "COMM", "BOTH"}
    want = {"NONE": (852, 270), "SLCT": (767, 277.2), "COMM": (535, 292.5), "BOTH": (511, 299.7)}
    for name, (mb, t) in want.items():
        assert body[name].per_micro_batch == mb * MEGABYTE
        assert body[name].forward_time == 90
        assert math.isclose(body[name].time, t, rel_tol=1e-12)
    assert static["BODY"] == 2141 * MEGABYTE and static["HEAD"] == 4245 * MEGABYTE
    head = fronts["HEAD"][0]
    assert head.forward_time == 90 and head.backward_time == 180 and head.memory(5) == 0


def test_sapp_ppb_time_keys_and_coefficients(tmp_path):
    prof = {"layers_description": [
        {"name": "B", "type": "BODY", "time": 10, "forward_time": 8, "nb_layer": 2, "memory_parameter": 1,
         "memory_activation": 5, "backward_time": 25, "memory_select_rec": 4, "select_rec_coef": 0.5,
         "memory_recompute": 1, "recompute_time": 0}]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    _, fronts, _ = sapp_ppb.read_profile(path)
    opts = {o.name: o for o in fronts["B"]}
    assert opts["NONE"].backward_time == 25 and opts["NONE"].forward_time == 8
    assert opts["SLCT"].backward_time == 1.5 * 2 * 10
    assert opts["FULL"].backward_time == 1.5 * 2 * 10  # zero time key: default coefficient 0.5


def test_sapp_ppb_bad_profile_names_the_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"layers_description": [{"name": "B", "type": "BODY", "nb_layer": 1, "time": -1,
                                                         "memory_activation": 1}]}))
    with pytest.raises(ValueError, match=r"layers_description\[0\].time"):
        sapp_ppb.read_profile(path)


@pytest.mark.parametrize("entry, field", [
    (lambda e: e.pop("memory_parameter"), "missing 'memory_parameter'"),  # was read as 0: no static memory
    (lambda e: e.pop("nb_layer"), "missing 'nb_layer'"),  # was read as 1 layer
    (lambda e: e.update(recompute_time=300), "'recompute_time' is given but 'memory_recompute' is not"),
    (lambda e: e.update(recompute_coef=0.3), "'recompute_coef' is given but 'memory_recompute' is not"),
    (lambda e: e.pop("memory_activation") and e.update(backward_coef=0.1), "'backward_coef' is given but"),
])
def test_sapp_ppb_fields_that_would_be_misread_are_refused(tmp_path, entry, field):
    """The spec's entries always carry nb_layer and memory_parameter, and an option exists only
    with its memory key: a profile without them would be read with another meaning."""
    data = json.load(open(SAMPLE))
    entry(data["layers_description"][1])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"layers_description\[1\]: " + field):
        sapp_ppb.read_profile(path)


@pytest.mark.parametrize("key", ["memory_activation", "backward_time", "select_rec_coef", "memory_recompute"])
@pytest.mark.parametrize("index", [0, 2])
def test_sapp_ppb_head_and_tail_refuse_recompute_keys(tmp_path, key, index):
    data = json.load(open(SAMPLE))
    data["layers_description"][index][key] = 10
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"layers_description\[{index}\]: a (HEAD|TAIL) entry .* {key!r}"):
        sapp_ppb.read_profile(path)


def test_sapp_load_and_spec_agree_on_the_demo():
    a = sapp_ppb.load(SAMPLE, "56000MB", 32)
    b = load_spec(os.path.join(EXAMPLES, "demo.json")).model
    counts = [4, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 6]
    ta, tb = pp_lite(a.stages(counts), a.fronts).times, pp_lite(b.stages(counts), b.fronts).times
    assert ta == pytest.approx(tb, rel=1e-12)  # the profile's coefficients round differently


@pytest.mark.parametrize("text, dim, want", [
    ("56000MB", "bytes", 56000 * 2**20), ("80 GiB", "bytes", 80 * 2**30), ("1KB", "bytes", 1024),
    ("1 KiB", "bytes", 1024), ("2 TB", "bytes", 2 * 2**40), ("5 bytes", "bytes", 5), (123, "bytes", 123), ("1.5 ms", "ms", 1.5), ("2s", "ms", 2000.0), ("250us", "ms", 0.25),
])
def test_units(text, dim, want):
    assert parse_quantity(text, dim, "f") == want


@pytest.mark.parametrize("text", ["12 parsecs", "MB", "", None, True, "nan MB", "1e400 MB", 10**400])
def test_bad_units(text):
    with pytest.raises(ValueError, match="f"):
        parse_quantity(text, "bytes", "f")


@pytest.mark.parametrize("text, words", [
    ("1kB", "ambiguous"), ("8 Mb", "bits"), ("8 Gb", "bits"), ("1 kb", "bits"), ("3 b", "bits"),
    ("1 mb", "bits"), ("1 gib", "case matters"), ("1 MIB", "case matters"), ("1 mB", "case matters"), ("1 XB", "unknown"),
])
def test_one_unit_rule_refuses_bits_and_ambiguous_case(text, words):
    with pytest.raises(ValueError, match=words):
        parse_quantity(text, "bytes", "f")


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["kinds"]["BODY"]["options"][0].update(memory="lots"), "kinds.BODY.options[0].memory"),
    (lambda d: d["kinds"]["BODY"]["options"][1].pop("forward"), "kinds.BODY.options[1]"),
    (lambda d: d["layers"][1].update(kind="BDY"), "layers[1].kind"),
    (lambda d: d["layers"][1].update(count=-3), "layers[1].count"),
    (lambda d: d["device"].pop("capacity"), "device.capacity"),
    (lambda d: d["pipeline"].update(micro_batches=0), "pipeline.micro_batches"),
    (lambda d: d.update(bucket="0 MiB"), "bucket"),
    (lambda d: d.update(colour="blue"), "unknown field"),
    (lambda d: d["kinds"]["BODY"].update(static="-1 MB"), "kinds.BODY.static"),
    (lambda d: d["kinds"]["BODY"]["options"][0].update(name=""), "kinds.BODY.options[0].name"),
])
def test_bad_spec_names_file_and_field(tmp_path, edit, field):
    data = json.load(open(os.path.join(EXAMPLES, "demo.json")))
    edit(data)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as err:
        load_spec(str(path))
    assert str(path) in str(err.value) and field in str(err.value)


def test_yaml_and_json_specs_load():
    pytest.importorskip("yaml")
    s = load_spec(os.path.join(EXAMPLES, "gpt3_175b.yaml"))
    assert s.stages == 12 and s.model.micro_batches == 96 and s.bucket == 16 * 2**20
    assert s.model.layers == 98  # embedding + 96 layers + output




def _spec(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


BASE = {"transformer": {"preset": "gpt3-175b"}, "pipeline": {"stages": 8, "micro_batches": 64}}


def test_a_transformer_sections_device_is_the_device_sections(tmp_path):
    """``transformer.device`` (and its peak, efficiency, GPUs per node) say what ``device:``
    says: both give the same model; saying one in both places is refused by name."""
    from gpuknap.costs import device

    inner = _spec(tmp_path, "a.json", {**BASE, "transformer": {"preset": "gpt3-175b", "device": "a100-40gb",
                                                                "efficiency": 0.3, "gpus_per_node": 4}})
    outer = _spec(tmp_path, "b.json", {**BASE, "device": {"preset": "a100-40gb", "efficiency": 0.3,
                                                          "gpus_per_node": 4}})
    plain = _spec(tmp_path, "c.json", BASE)
    a, b, c = (load_spec(p).model for p in (inner, outer, plain))
    assert a.capacity == b.capacity == device("a100-40gb").memory != c.capacity
    assert a.fronts == b.fronts and a.fronts != c.fronts and a.static == b.static
    both = _spec(tmp_path, "d.json", {**BASE, "transformer": {"preset": "gpt3-175b", "efficiency": 0.3},
                                      "device": {"efficiency": 0.4}})
    with pytest.raises(ValueError, match="transformer.efficiency: .*device.efficiency too"):
        load_spec(both)


def test_the_device_flag_sets_the_capacity_over_the_files(tmp_path):
    from gpuknap.costs import device

    demo = os.path.join(EXAMPLES, "demo.json")
    assert load_spec(demo).model.capacity == 56000 * MEGABYTE
    assert load_spec(demo, device="a100-40gb").model.capacity == device("a100-40gb").memory
    assert load_spec(demo, device="a100-40gb", capacity="30 GiB").model.capacity == 30 * 2**30
    gpt = os.path.join(EXAMPLES, "gpt3_175b.yaml")
    assert load_spec(gpt, device="a100-40gb").model.capacity == device("a100-40gb").memory


def test_a_sweep_builds_the_specs_own_device(tmp_path):
    """The sweep rebuilds each configuration's model with the spec's device (its section's fields
    included) and its capacity, unless a flag or the grid names another device."""
    from gpuknap.sweep import builder_of

    path = _spec(tmp_path, "s.json", {**BASE, "device": {"preset": "a100-80gb", "efficiency": 0.3,
                                                         "capacity": "70 GiB"}})
    builder = builder_of(path, None, None, None, None)[0]
    config = {"tensor_parallel": 8, "micro_batch_size": 1, "data_parallel": 1, "stages": 8, "micro_batches": 64}
    want = load_spec(path, tensor_parallel=8, micro_batch=1, data_parallel=1).model
    got = builder(config)
    assert got.fronts == want.fronts and got.capacity == want.capacity == 70 * 2**30
    other = builder({**config, "device": "h100"})  # the grid's device: its own memory and speed
    flag = load_spec(path, tensor_parallel=8, micro_batch=1, data_parallel=1, device="h100").model
    assert other.capacity == flag.capacity and other.fronts == flag.fronts != got.fronts
    bare = _spec(tmp_path, "h.json", {**BASE, "device": {"preset": "h100"}})  # --device replaces the whole device
    assert load_spec(bare, tensor_parallel=8, micro_batch=1, data_parallel=1).model.fronts == flag.fronts
