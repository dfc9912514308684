"""A sweep ranked as a framework runs its plans (``framework=``, ``sweep --framework``): each row is
what ``best --emit`` gives for its configuration (split, and the run time of the settings it
writes), no row is faster than the unconstrained sweep's row for the same configuration, ``top``
gives the first rows of the full sweep, and the command of each row reproduces it."""
from __future__ import annotations

import json
import os

import pytest
from paths import EXAMPLES

from gpuknap import sweep
from gpuknap.cli import main

LLAMA = os.path.join(EXAMPLES, "llama2_70b.json")
GRID = {"stages": [2, 4], "tensor_parallel": [4, 8], "micro_batch_size": [1], "interleave": [1, 2]}


def _key(row):
    return tuple(sorted(row["config"].items()))


@pytest.fixture(scope="module")
def rows():
    return {fw: sweep(LLAMA, GRID, gpus=64, global_batch=256, framework=fw, top=None).rows
            for fw in (None, "megatron")}


def test_no_framework_row_is_faster_than_each_layer_on_its_own_option(rows):
    free = {}
    for r in rows[None]:
        if r["feasible"]:
            free.setdefault(_key(r), r["iteration_time_s"])
    named = [r for r in rows["megatron"] if r["feasible"]]
    assert named and {_key(r) for r in named} <= set(free)
    for r in named:
        assert r["iteration_time_s"] >= free[_key(r)] * (1 - 1e-12), r["config"]


def test_each_row_is_what_best_emit_gives_for_its_configuration(rows, capsys):
    """Every configuration's first row against ``best ... --emit megatron`` run alone (the row's
    own command): the same split (or the same even split) and the same run time, to the bit."""
    firsts = {}
    for r in rows["megatron"]:
        firsts.setdefault(_key(r), r)
    checked = 0
    for r in firsts.values():
        if not r["feasible"]:
            continue
        c = r["config"]
        argv = ["best", LLAMA, "--stages", str(c["stages"]), "--tp", str(c["tensor_parallel"]), "--micro-batch-size",
                str(c["micro_batch_size"]), "--micro-batches", str(c["micro_batches"]), "--dp", str(c["data_parallel"]),
                "--interleave", str(c["interleave"]), "--score", "1f1b", "--emit", "megatron", "--json", "--quiet"]
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        got = out.get("even_split") or out["results"][0]
        assert got["counts"] == r["counts"] and got["iteration_time_s"] == r["iteration_time_s"], c
        assert bool(r.get("even_split")) == ("even_split" in out)
        checked += 1
    assert checked >= 4


def test_top_rows_are_the_first_rows_of_the_full_framework_sweep(rows):
    top = sweep(LLAMA, GRID, gpus=64, global_batch=256, framework="megatron", top=3)
    want = [(_key(r), r["counts"], r["iteration_time_s"]) for r in rows["megatron"][:3]]
    assert [(_key(r), r["counts"], r["iteration_time_s"]) for r in top.rows] == want


def test_the_command_line_names_the_framework_and_each_row_emits_it(capsys):
    argv = ["sweep", LLAMA, "--gpus", "64", "--global-batch", "256", "--stages", "4", "--tp", "4,8",
            "--framework", "mindformers", "--all", "--json", "--quiet"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["framework"] == "mindformers"
    row = out["rows"][0]
    assert row["command"][-2:] == ["--emit", "mindformers"]
    assert main([*row["command"][1:], "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["iteration_time_s"] == row["iteration_time_s"]
    with pytest.raises(ValueError, match="framework must be one of megatron, mindformers"):
        sweep(LLAMA, GRID, gpus=64, global_batch=256, framework="deepspeed")


def test_configurations_the_framework_cannot_state_are_skipped_with_the_reason():
    """A review found ``sweep --framework mindformers`` ranking plans whose own ``--emit mindformers``
    refuses them (TP communication overlapped, which MindFormers cannot state): such configurations
    are skipped, saying why; the others are ranked."""
    result = sweep(os.path.join(EXAMPLES, "llama2_7b_config.json"), {"stages": [2], "tensor_parallel": [1, 2]},
                   gpus=8, global_batch=32, seq=4096, framework="mindformers", tp_comm_overlap=True, top=None)
    assert {r["config"]["tensor_parallel"] for r in result.rows} == {1}
    (skip,) = [s for s in result.skipped if s["config"]["tensor_parallel"] == 2]
    assert "--emit mindformers refuses this configuration" in skip["reason"] and "tp_comm_overlap" in skip["reason"]
