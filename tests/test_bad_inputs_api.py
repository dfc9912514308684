"""Bad inputs, round 2 part 2 (issue 21): sizes bounded before anything is built, the public API
refusing what the command line refuses, messages naming the file's own fields and the flags.

Two tables.  ``API``: a call and the words its ``ValueError`` must contain (the argument it is
about).  ``CLI``: ``gpuknap ARGV`` run in process must exit 2 with exactly one stderr line that
contains every word (``{f}`` is the case's file).  The cases about time or memory are built so
that a regression shows as a hang or a memory error, never as a slow pass; no case measures time
(scripts/redteam_21.py does, in a child process with bounded memory).
"""
from __future__ import annotations

import copy
import json
import math
import os
import socket
import threading
from typing import Any, Callable

import numpy as np
import warnings

import pytest
from paths import EXAMPLES, PACKAGED

from gpuknap import LayerOption, Layers, PipelineModel, Stage, best_splits, choose, least_times, pp_lite, rank
from gpuknap import schedule
from gpuknap.cli import main
from gpuknap.formats import emit, load_spec, megatron, mindformers_read, read_settings, restrict
from gpuknap.formats._settings import MAX_SETTINGS_BYTES
from gpuknap.schedule import MAX_OPS, MAX_TIMELINE_OPS
from gpuknap.sweep import sweep

DEMO = os.path.join(EXAMPLES, "demo.json")  # HEAD, 96 BODY, TAIL; 16 stages, 32 micro-batches
LLAMA = os.path.join(EXAMPLES, "llama2_70b.json")  # a transformer section: 80 layers, 64 heads
CONFIGS = {name: json.load(open(os.path.join(EXAMPLES, f"{file}_config.json"))) for name, file in
           (("llama", "llama2_7b"), ("mixtral", "mixtral_8x7b"), ("deepseek_v3", "deepseek_v3"), ("qwen2", "qwen2_7b"),
            ("deepseek_v2", "deepseek_v2_lite"))}
MEG = "--num-layers 96\n--pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 'Et*48|t*48L'\n"
ONES = np.ones((1, 4, 1))


def _demo_model(**kwargs: Any) -> PipelineModel:
    return load_spec(DEMO, **kwargs).model


# ---- the public API ---------------------------------------------------------------------------

API: list[tuple[str, Callable[[], Any], list[str]]] = []


def api(name: str, call: Callable[[], Any], *words: str) -> None:
    API.append((name, call, list(words)))


# schedule.simulate: times, micro-batches, schedule, group, p2p, sizes
for sched in ("1f1b", "interleaved", "interleaved-legacy"):
    api(f"simulate [[]] {sched}", lambda s=sched: schedule.simulate([[]], [[]], 4, s), "forward")
    api(f"simulate [[], []] {sched}", lambda s=sched: schedule.simulate([[], []], [[], []], 4, s), "forward")
api("simulate []", lambda: schedule.simulate([], [], 4), "forward")
api("simulate a string", lambda: schedule.simulate("ab", "ab", 4), "forward")
api("simulate a number", lambda: schedule.simulate(5, 5, 4), "forward")
api("simulate ragged rows", lambda: schedule.simulate([[1, 1], [1]], [[1, 1], [1]], 4, "interleaved"), "forward")
api("simulate backward rows", lambda: schedule.simulate([[1]] * 2, [[1]] * 3, 4), "backward")
for value in (math.nan, -1.0, math.inf, "1", None, True):
    api(f"simulate forward {value!r}", lambda v=value: schedule.simulate([[v]] * 2, [[1]] * 2, 4), "forward[0][0]")
    api(f"simulate backward {value!r}", lambda v=value: schedule.simulate([[1]] * 2, [[1], [v]], 4),
        "backward[1][0]")
for value in (0, -3, 2.5, True, "4", None, 10**30):
    api(f"simulate micro_batches {value!r}", lambda v=value: schedule.simulate([[1]] * 2, [[1]] * 2, v),
        "micro_batches")
for value in (math.nan, -1.0, math.inf, "0", True):
    api(f"simulate p2p {value!r}", lambda v=value: schedule.simulate([[1]] * 2, [[1]] * 2, 4, p2p=v), "p2p")
for value in ("gpipe", None, 1):
    api(f"simulate schedule {value!r}", lambda v=value: schedule.simulate([[1]] * 2, [[1]] * 2, 4, v), "schedule")
for value in (0, -1, True, 2.5):
    api(f"simulate group {value!r}",
        lambda v=value: schedule.simulate([[1, 1]] * 2, [[1, 1]] * 2, 4, "interleaved", group=v), "group")
api("simulate one micro-batch over the op limit",
    lambda: schedule.simulate([[1]] * 4, [[1]] * 4, MAX_OPS // 8 + 1), "micro_batches", f"{MAX_OPS:,}")
# schedule.iteration_times
for value in (0, -1, 2.5, True, None, "8", 10**7):
    api(f"iteration_times micro_batches {value!r}", lambda v=value: schedule.iteration_times(ONES, ONES, v),
        "micro_batches")
for value in (math.nan, -1.0, math.inf, -math.inf):
    api(f"iteration_times forward {value!r}",
        lambda v=value: schedule.iteration_times(np.full((2, 4, 1), v), ONES.repeat(2, 0), 4), "forward")
    api(f"iteration_times backward {value!r}",
        lambda v=value: schedule.iteration_times(ONES, np.full((1, 4, 1), v), 4), "backward")
api("iteration_times strings", lambda: schedule.iteration_times([[["a"]]], [[["b"]]], 4), "forward")
api("iteration_times objects", lambda: schedule.iteration_times([[[{}]]], [[[1]]], 4), "forward")
api("iteration_times 2-D", lambda: schedule.iteration_times(np.ones((4, 1)), np.ones((4, 1)), 4), "forward")
api("iteration_times shapes differ", lambda: schedule.iteration_times(ONES, np.ones((1, 3, 1)), 4), "backward")
api("iteration_times zero stages", lambda: schedule.iteration_times(np.ones((1, 0, 1)), np.ones((1, 0, 1)), 4),
    "forward")
api("iteration_times zero chunks", lambda: schedule.iteration_times(np.ones((1, 2, 0)), np.ones((1, 2, 0)), 4),
    "forward")
for value in (math.nan, -1.0, math.inf, "x"):
    api(f"iteration_times p2p {value!r}", lambda v=value: schedule.iteration_times(ONES, ONES, 4, p2p=v), "p2p")
api("iteration_times schedule", lambda: schedule.iteration_times(ONES, ONES, 4, "zero-bubble"), "schedule")
api("iteration_times group 0", lambda: schedule.iteration_times(np.ones((1, 2, 2)), np.ones((1, 2, 2)), 4,
                                                                "interleaved", group=0), "group")
api("iteration_times over the op limit", lambda: schedule.iteration_times(np.ones((1, 8, 1)), np.ones((1, 8, 1)),
                                                                          10**6), "micro_batches", f"{MAX_OPS:,}")
# the orders, their sequence and waves, the in-flight table: arguments checked, sizes before building
for fn in (schedule.order, schedule.sequence, schedule.levels, schedule.in_flight_table):
    label = fn.__name__
    for arg, bad in (("stages", 0), ("stages", 1.5), ("chunks", 0), ("chunks", True), ("micro_batches", -1),
                     ("micro_batches", "8")):
        args = {"stages": 4, "chunks": 1, "micro_batches": 8, arg: bad}
        if label == "in_flight_table":
            api(f"{label} {arg}={bad!r}", lambda a=args: schedule.in_flight_table(**a), arg)
        else:
            api(f"{label} {arg}={bad!r}", lambda a=args, f=fn: f("1f1b", a["stages"], a["chunks"], a["micro_batches"]),
                arg)
    if label != "in_flight_table":  # the 1F1B table is in closed form: no size limit
        api(f"{label} 8 stages, 10**7 micro-batches", lambda f=fn: f("1f1b", 8, 1, 10**7), "micro_batches")
    api(f"{label} interleaved, 10**6 micro-batches",
        lambda f=fn, lb=label: f(*(() if lb == "in_flight_table" else ("interleaved",)), 4, 2, 10**6), "micro_batches")
# Megatron's layout
for value in (0, -2, True, 1.5, "2"):
    api(f"parse_layout stages={value!r}", lambda v=value: megatron.parse_layout("Et|tL", stages=v), "stages")
api("parse_layout None", lambda: megatron.parse_layout(None), "layout")
api("parse_layout 5", lambda: megatron.parse_layout(5), "layout")
api("parse_layout t*10**11", lambda: megatron.parse_layout("t*99999999999"), "layout")
api("parse_layout where 5", lambda: megatron.parse_layout("Et|tL", where=5), "where")
api("parse_layout 3 stages for 2", lambda: megatron.parse_layout("Et|t|tL", stages=2), "layout")
# the settings readers
for fn, label in ((megatron.load, "megatron.load"), (mindformers_read.load, "mindformers.load"),
                  (read_settings, "read_settings")):
    api(f"{label}(None)", lambda f=fn: f(None), "path")
    api(f"{label}(5)", lambda f=fn: f(5), "path")
    api(f"{label} of a missing file", lambda f=fn: f("/nonexistent/run.sh"), "/nonexistent/run.sh")
api("emit to an unknown framework", lambda: emit("deepspeed", _demo_model(), [98]), "framework_name")
api("restrict to an unknown framework", lambda: restrict(_demo_model(), "megatronn"), "framework_name")
# sweep: what a callable source gives back, the grid's values and keys


def _raises(exc: BaseException) -> Callable[[dict], Any]:
    def source(config: dict) -> Any:
        raise exc
    return source


for label, source, words in (
        ("returning None", lambda c: None, ["source", "NoneType"]),
        ("returning a string", lambda c: "model", ["source", "str"]),
        ("returning a spec", lambda c: load_spec(DEMO), ["source", "Spec"]),
        ("raising KeyError", lambda c: c["nope"], ["source", "KeyError"]),
        ("raising TypeError", _raises(TypeError("bad")), ["source", "TypeError"]),
        ("raising ZeroDivisionError", lambda c: 1 // 0, ["source", "ZeroDivisionError"]),
        ("raising ValueError every time", _raises(ValueError("no such model")), ["no such model"]),
        ("a model of 32 micro-batches for a configuration of 64",
         lambda c: _demo_model(micro_batches=32), ["micro_batches=32", "micro_batches=64"])):
    api(f"sweep: a source {label}", lambda s=source: sweep(s, {"stages": [2]}, gpus=2, global_batch=64), *words)
for label, grid, word in (("a dict as a value", {"stages": {2: 1, 4: 1}}, "stages"),
                          ("a set as a value", {"stages": {2, 4}}, "stages"),
                          ("a dict in a list", {"stages": [{2: 1}]}, "stages"),
                          ("a string as a value", {"tensor_parallel": "8"}, "tensor_parallel"),
                          ("an empty list", {"stages": []}, "stages"),
                          ("a nested list", {"stages": [[2]]}, "stages"),
                          ("a float", {"micro_batch_size": [1.5]}, "micro_batch_size"),
                          ("zero", {"interleave": [0]}, "interleave"),
                          ("an unknown key", {"stage": [2]}, "stages"),
                          ("an unknown device", {"device": ["h1000"]}, "device"),
                          ("not a mapping", [("stages", [2])], "grid")):
    api(f"sweep grid: {label}", lambda g=grid: sweep(LLAMA, g, gpus=8, global_batch=8), word)
api("sweep: micro-batches over the schedule limit",
    lambda: sweep(LLAMA, {"stages": [8]}, gpus=8, global_batch=400_000), "schedule operations")
api("sweep: an unknown dispatcher",
    lambda: sweep(LLAMA, {"stages": [8]}, gpus=8, global_batch=8, dispatcher="deepep"), "dispatcher", "flex")
api("load_spec: an unknown dispatcher",
    lambda: load_spec(os.path.join(EXAMPLES, "mixtral_8x7b_config.json"), micro_batches=4, seq=4096,
                      dispatcher="all2all"), "dispatcher (--dispatcher)", "alltoall, flex")
api("sweep: nothing listens at the scheduler",
    lambda: sweep(LLAMA, {"stages": [8]}, gpus=8, global_batch=8, scheduler="tcp://127.0.0.1:1"), "scheduler")
# exclusive option pairs
for label, exclusive, words in (
        ("a typo", [("SLCT", "COMMS")], ["'COMMS'", "did you mean 'COMM'"]),
        ("a lower-case name", [("slct", "COMM")], ["'slct'", "SLCT"]),
        ("a name no kind has", [("SLCT", "OFFLOAD")], ["'OFFLOAD'"]),
        ("a typo in a generator", (p for p in [("SLCT", "CMM")]), ["'CMM'"]),
        ("a string", "SLCT,COMM", ["exclusive"]),
        ("a dict", {"SLCT": "COMM"}, ["exclusive"]),
        ("a number", 5, ["exclusive"]),
        ("a bare name", ["SLCT"], ["exclusive"]),
        ("a triple", [("SLCT", "COMM", "BOTH")], ["exclusive"]),
        ("a number in a pair", [("SLCT", 1)], ["exclusive"])):
    api(f"exclusive: {label}", lambda e=exclusive: best_splits(_demo_model(), 16, exclusive=e), *words)
api("exclusive on an interleaved search", lambda: best_splits(_demo_model(), 8, exclusive=[("SLCT", "COMM")],
                                                              interleave=2), "interleave")
# a bucket so small that a weight overflows
_OPT = {"a": [LayerOption("x", 1e10, 1.0, 1.0)]}
for bucket in (2.2e-308, 5e-324):
    api(f"choose bucket {bucket!r}", lambda b=bucket: choose([Layers("a", 3, 1)], _OPT, 1e12, b), "bucket")
    api(f"least_times bucket {bucket!r}", lambda b=bucket: least_times([Layers("a", 3, 1)], _OPT, 1e12, b)(1e11),
        "bucket")
    api(f"pp_lite bucket {bucket!r}", lambda b=bucket: pp_lite([Stage([Layers("a", 3, 1)], 1e12)], _OPT, b), "bucket")
    api(f"rank bucket {bucket!r}",
        lambda b=bucket: rank([[Stage([Layers("a", 3, 1)], 1e12)]], _OPT, b, backend="numpy"), "bucket")

# the Python API red team (round 3): calls that raised another exception, or accepted nonsense
_SMALL = PipelineModel(("a",) * 4, {"a": [LayerOption("N", 10 * 2**20, 1.0, 2.0)]}, {"a": 5 * 2**20}, 100 * 2**20, 4)
_SMALL_CHOICE = pp_lite(_SMALL.stages([2, 2]), _SMALL.fronts)
api("bucket 10**400 (choose)", lambda: choose([Layers("a", 1)], _OPT, 100, bucket=10**400), "bucket")
api("bucket 10**400 (model.rank)", lambda: _SMALL.rank([[2, 2]], bucket=10**400), "bucket")
api("bucket 10**400 (best_splits)", lambda: best_splits(_SMALL, 2, bucket=10**400), "bucket")
api("option_names without a choice", lambda: _SMALL.option_names([2, 2], None), "choice")
api("option_names with another split's choice",
    lambda: _SMALL.option_names([1, 3], _SMALL_CHOICE), "choice", "counts")
api("option_names with fractional counts", lambda: _SMALL.option_names([1.5, 2.5], _SMALL_CHOICE), "counts[0]")
api("budget_of an unknown kind", lambda: _SMALL.budget_of([Layers("zz", 1)]), "groups[0].kind", "'zz'")
api("budget_of None", lambda: _SMALL.budget_of(None), "groups")
api("default_in_flight 2.5", lambda: _SMALL.default_in_flight(2.5), "stages")
api("default_in_flight -3", lambda: _SMALL.default_in_flight(-3), "stages")
api("in_flight_table 0 stages", lambda: _SMALL.in_flight_table(0, 1), "stages")
api("segment_groups in_flight 0", lambda: _SMALL.segment_groups(0, 2, 0), "in_flight")
api("segment_groups stop before start", lambda: _SMALL.segment_groups(3, 1, 1), "stop")
api("segment_groups past the layers", lambda: _SMALL.segment_groups(0, 9, 1), "stop", "4 layers")
api("check_splits where=5", lambda: _SMALL.check_splits([[1, 3]], where=5), "where")
api("Stage budget True", lambda: Stage([Layers("a", 1)], True), "budget")
api("Stage fixed_time False", lambda: Stage([Layers("a", 1)], 1.0, False), "fixed_time")
api("Stage count True", lambda: Stage([Layers("a", 2), Layers("a", True)], 1.0), "groups[1]")
api("excess in_flight None", lambda: LayerOption("x", 10, 1, 1, excess=[(None, 5)]), "excess[0]", "in_flight")
api("excess negative bytes", lambda: LayerOption("x", 10, 1, 1, excess=[(2, -5)]), "excess[0]", "bytes")
api("parts a number", lambda: LayerOption("x", 10, 1, 1, parts=5), "parts")
api("parts a bad pair", lambda: LayerOption("x", 10, 1, 1, parts=[("compute", "1 ms")]), "parts[0]")
api("choose bound 'yes'", lambda: choose([Layers("a", 1)], _OPT, 1e12, bound="yes"), "bound")
api("load_spec stages 99 of 98 layers", lambda: load_spec(DEMO, stages=99), "stages", "98 layers", "demo.json")


def _varied(n: int) -> PipelineModel:
    """``n`` layers, each its own kind (a red team's model: every segment a problem of many kinds)."""
    option = [LayerOption("a", 10.0, 1.0, 2.0)]
    return PipelineModel([f"k{i}" for i in range(n)], {f"k{i}": option for i in range(n)},
                         {f"k{i}": 1.0 for i in range(n)}, 1e12, 8)


api("600 layers of 600 kinds on 4 stages", lambda: best_splits(_varied(600), 4, backend="numpy"),
    "600 kinds", "merge kinds")
api("3,000 layers of 3,000 kinds", lambda: best_splits(_varied(3000), 4, backend="numpy"), "too varied")


api("option memory past any float beside a capacity near it",
    lambda: best_splits(PipelineModel(("a",) * 6, {"a": [LayerOption("s", 0.85e308, 1, 2), LayerOption("f", 1.7e308, 0.5, 1)]},
                                      {"a": 0.0}, 1.7e308, 8), 2, backend="numpy"), "memory(2)", "finite")


def test_the_api_table_is_large():
    assert len(API) >= 150 and len({name for name, _, _ in API}) == len(API)


@pytest.mark.parametrize("call, words", [(c, w) for _, c, w in API], ids=[n for n, _, _ in API])
def test_the_api_raises_value_error_naming_the_argument(call, words):
    """... and nothing else: no warning on the way (an overflow warning once came before one)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError) as info:
            call()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# ---- the command line ------------------------------------------------------------------------

CLI: list[tuple[str, list, list, dict]] = []  # name, argv, words, files {name: text}


def cli(name: str, argv: list, words: list, files: dict | None = None) -> None:
    CLI.append((name, argv, words, files or {}))


def _config(family: str, **fields: Any) -> str:
    data = copy.deepcopy(CONFIGS[family])
    data.update(fields)
    return json.dumps(data)


RUN = ["--micro-batches", "8", "--seq", "4096", "--stages", "4", "--dp", "1"]
# micro-batches over the schedule's operation limit: the flag named, nothing built
for stages in (1, 2, 4, 8, 16):
    over = MAX_OPS // (2 * stages) + 1
    cli(f"best --stages {stages} --micro-batches {over}", ["best", DEMO, "--stages", str(stages),
                                                           "--micro-batches", str(over)], ["--micro-batches"])
    cli(f"timeline --stages {stages} --micro-batches {over}",
        ["timeline", DEMO, "--stages", str(stages), "--micro-batches", str(over)], ["--micro-batches", "operations"])
for score in ("slowest", "1f1b", "simulated"):
    cli(f"best --score {score} --micro-batches 1000000", ["best", DEMO, "--score", score, "--micro-batches",
                                                          "1000000"], ["--micro-batches", f"{MAX_OPS:,}"])
cli("best --interleave 2 --micro-batches 1000000", ["best", DEMO, "--stages", "8", "--interleave", "2",
                                                    "--micro-batches", "1000000"], ["--micro-batches"])
cli("best on a transformer spec, --micro-batches 1000000", ["best", LLAMA, "--micro-batches", "1000000"],
    ["--micro-batches"])
cli("best on a config, --micro-batches 1000000", ["best", "{f}", "--micro-batches", "1000000", "--seq", "4096",
                                                  "--stages", "4", "--dp", "1"], ["--micro-batches"],
    {"config.json": _config("llama")})
cli("timeline --counts, --micro-batches over the limit", ["timeline", DEMO, "--counts", "49,49", "--micro-batches",
                                                           str(MAX_TIMELINE_OPS // 4 + 1)], ["--micro-batches"])
cli("rank --splits, --micro-batches over the limit", ["rank", DEMO, "--splits", "{f}", "--micro-batches", "1000000"],
    ["--micro-batches"], {"s.csv": "4,5,6,6,6,6,6,6,6,6,7,7,7,7,7,6\n"})
cli("curve on an interleaved spec, --micro-batches over the limit",
    ["curve", "{f}", "--stage", "0", "--counts", "25,24,25,24", "--micro-batches", "1000000"], ["--micro-batches"],
    {"i.json": json.dumps({**json.load(open(DEMO)), "pipeline": {"stages": 2, "micro_batches": 8, "interleave": 2}})})
cli("spec pipeline.micro_batches over the limit", ["best", "{f}"], ["{f}", "pipeline.micro_batches"],
    {"spec.json": json.dumps({**json.load(open(DEMO)), "pipeline": {"stages": 16, "micro_batches": 500_000}})})
cli("sweep: every configuration over the schedule limit", ["sweep", LLAMA, "--gpus", "8", "--global-batch", "400000",
                                                            "--stages", "8"], ["schedule operations"])
# Hugging Face sizes named by the config's own field (not the cost model's name)
for family, fields in (("llama", ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                                  "num_key_value_heads")),
                       ("mixtral", ("hidden_size", "intermediate_size", "num_local_experts", "num_experts_per_tok",
                                    "vocab_size")),
                       ("deepseek_v3", ("hidden_size", "moe_intermediate_size", "n_routed_experts", "kv_lora_rank",
                                        "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "intermediate_size")),
                       ("qwen2", ("hidden_size", "intermediate_size", "vocab_size")),
                       ("deepseek_v2", ("hidden_size", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
                                        "kv_lora_rank", "qk_nope_head_dim", "intermediate_size"))):
    for key in fields:
        cli(f"{family}: {key} 10**8", ["best", "{f}", *RUN], ["{f}", key, "10,000,000"],
            {"config.json": _config(family, **{key: 10**8})})
for family in CONFIGS:
    cli(f"{family}: num_hidden_layers 10**8", ["best", "{f}", *RUN], ["{f}", "num_hidden_layers"],
        {"config.json": _config(family, num_hidden_layers=10**8)})
    cli(f"{family}: num_hidden_layers 1e8", ["best", "{f}", *RUN], ["{f}", "num_hidden_layers"],
        {"config.json": _config(family, num_hidden_layers=1e8)})
cli("spec transformer.layers 2,000,000", ["best", "{f}"], ["{f}", "transformer.layers"],
    {"spec.json": json.dumps({**json.load(open(LLAMA)), "transformer": {**json.load(open(LLAMA))["transformer"],
                                                                          "layers": 2_000_000}})})
cli("SAPP nb_layer 2,000,000", ["best", "{f}", "--capacity", "56000MB", "--micro-batches", "32", "--stages", "4"],
    ["{f}", "nb_layer"], {"p.json": json.dumps({**json.load(open(PACKAGED)), "layers_description": [
        {**e, "nb_layer": 2_000_000} if i == 1 else e for i, e in enumerate(json.load(open(PACKAGED))["layers_description"])]})})
# settings files: bounded by size before they are split into words
for label, name, text in (("one byte over", "run.sh", "#" * (MAX_SETTINGS_BYTES + 1)),
                          ("10 MB of flags", "run.sh", "--num-layers 96 " * (10 * 2**20 // 15)),
                          ("10 MB on one line, an open quote", "run.sh", '"' + "a" * (10 * 2**20)),
                          ("a 1 MB YAML", "mf.yaml", "a: 1\n" * (2**20 // 5)),
                          ("a 1 MB JSON", "mf.json", "[" + "1," * (2**19) + "1]")):
    cli(f"rank --from {label}", ["rank", DEMO, "--from", "{f}"], ["{f}", f"{MAX_SETTINGS_BYTES:,} bytes"], {name: text})
cli("Megatron file without the layout flag", ["rank", DEMO, "--from", "{f}"],
    ["{f}", "--pipeline-model-parallel-layout"], {"run.sh": "--num-layers 96\n--pipeline-model-parallel-size 5\n"})
cli("Megatron file opening with a brace", ["rank", DEMO, "--from", "{f}"], ["{f}", "--pipeline-model-parallel-layout"],
    {"run.json": "{\n--num-layers 96\n--pipeline-model-parallel-size 5\n"})
# a note (--dp not given) is held while the command runs: a refusal stays one line
cli("config without --dp or --stages", ["best", "{f}", "--micro-batches", "8", "--seq", "4096"], ["--stages"],
    {"config.json": _config("llama")})
cli("config without --dp, --tp 3", ["best", "{f}", "--micro-batches", "8", "--seq", "4096", "--stages", "4",
                                    "--tp", "3"], ["--tp"], {"config.json": _config("llama")})
# --scheduler: the flag named, at once, whatever is (or is not) at the address
for label, address in (("spaces", "foo bar"), ("a closed port", "tcp://127.0.0.1:1"),
                       ("another closed port", "127.0.0.1:9"), ("a non-Dask server", "tcp://127.0.0.1:{port}"),
                       ("empty", "")):
    cli(f"sweep --scheduler {label}", ["sweep", LLAMA, "--gpus", "8", "--global-batch", "8", "--scheduler", address],
        ["--scheduler"])


def test_the_cli_table_is_large():
    assert len(CLI) >= 50 and len({c[0] for c in CLI}) == len(CLI)


@pytest.fixture(scope="module")
def http_port():
    """A TCP server that is not Dask: it answers every connection with an HTTP page."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            try:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            except OSError:
                pass
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join()
    sock.close()


@pytest.mark.parametrize("argv, words, files", [c[1:] for c in CLI], ids=[c[0] for c in CLI])
def test_the_cli_exits_2_with_one_line(argv, words, files, tmp_path, capsys, request):
    paths = {}
    for name, content in files.items():
        (tmp_path / name).write_text(content)
        paths[name] = str(tmp_path / name)
    first = next(iter(paths.values()), "")
    port = str(request.getfixturevalue("http_port")) if any("{port}" in a for a in argv) else ""
    rc = main([a.replace("{f}", first).replace("{port}", port) for a in argv] + ["--quiet"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("gpuknap: error: "), (rc, err)
    for word in words:
        assert word.replace("{f}", first) in lines[0], (word, lines[0])


# ---- what is read, not refused ---------------------------------------------------------------

def _holds_both(choice: Any) -> bool:
    return any({"SLCT", "COMM"} <= {a.option.name for a in sc.assignments} for sc in choice.stages)


def test_exclusive_given_as_a_generator_is_read():
    """The demo's best split has a stage running SLCT and COMM layers; a generator of the pair
    (read once) keeps them apart exactly as a list does."""
    model = _demo_model()
    assert _holds_both(best_splits(model, 16, 1)[0][2])
    want = best_splits(model, 16, 3, exclusive=[("SLCT", "COMM")])
    got = best_splits(model, 16, 3, exclusive=(pair for pair in [("SLCT", "COMM")]))
    assert [(c, s) for c, s, _ in got] == [(c, s) for c, s, _ in want]
    assert not any(_holds_both(choice) for _, _, choice in got)


@pytest.mark.parametrize("stages, micro_batches", [(1, 1), (1, 7), (2, 1), (4, 3), (4, 4), (5, 12), (8, 2)])
def test_the_1f1b_in_flight_table_equals_the_order(stages, micro_batches):
    """The closed form (stage s holds min(P - s, M) micro-batches) against a count along the order."""
    got = schedule.in_flight_table(stages, 1, micro_batches)
    for s, ops in enumerate(schedule.order("1f1b", stages, 1, micro_batches)):
        alive = peak = 0
        for kind, _, _ in ops:
            alive += 1 if kind == "F" else -1
            peak = max(peak, alive)
        assert got[s] == [peak]


def test_the_timeline_json_keeps_every_operation(capsys):
    assert main(["timeline", DEMO, "--micro-batches", "4", "--json", "--quiet"]) == 0
    data = json.loads(capsys.readouterr().out)
    t = data["timeline"]
    assert len(t["ops"]) == 2 * 16 * 4 and set(t["ops"][0]) == {"stage", "chunk", "micro_batch", "kind", "start", "end"}
    assert t["iteration_time"] == max(op["end"] for op in t["ops"])


def test_the_numba_backend_is_a_choice(capsys):
    from gpuknap.engine import numba_available
    ok, why = numba_available()
    rc = main(["best", DEMO, "--backend", "numba", "--quiet", "--json"])
    out = capsys.readouterr()
    if ok:
        assert rc == 0 and json.loads(out.out)["backend"] == "numba"
    else:  # refused by the backend, not by the parser
        assert rc == 2 and "numba" in out.err and "invalid choice" not in out.err, why


MF16 = "parallel_config: {pipeline_stage: 16, micro_batch_num: 32}\nmodel: {model_config: {num_layers: 96, offset: 0}}\n"
LAYOUT = '"Et*6|(t*6|)*14t*6L"'
TORCHRUN = ("#!/bin/bash\ntorchrun --nproc_per_node 8 pretrain_gpt.py \\\n    --num-layers 96 \\\n"
            f"    --pipeline-model-parallel-size 16 \\\n    --pipeline-model-parallel-layout {LAYOUT} \\\n"
            "    --micro-batch-size 1 --bf16\n")


@pytest.mark.parametrize("name, text, framework", [
    ("run.sh", TORCHRUN, "megatron"),
    ("run_crlf.sh", TORCHRUN.replace("\n", "\r\n"), "megatron"),
    ("run_tabs.sh", TORCHRUN.replace("    ", "\t"), "megatron"),
    ("run_comments.sh", "# --pipeline-model-parallel-size 2 was too slow\n" + TORCHRUN, "megatron"),
    ("mf.yaml", "# unlike Megatron (--pipeline-model-parallel-layout), offsets here\n" + MF16, "mindformers"),
    ("mf_string.yaml", MF16 + 'trainer: {type: CausalLanguageModelingTrainer}\n'
                              'description: "ported from --pipeline-model-parallel-size 16"\n', "mindformers"),
    ("mf_indented_comment.yaml", MF16.replace("model:", "  # --num-layers 96 in Megatron\nmodel:"), "mindformers"),
])
def test_settings_files_are_read_as_their_framework(name, text, framework, tmp_path, capsys):
    """Launch scripts with continuations and MindFormers files that mention Megatron's flags in a
    comment or a string are read, each by its own reader, and ranked (exit 0)."""
    path = tmp_path / name
    path.write_text(text)
    settings = read_settings(str(path))
    assert type(settings).__module__.endswith("megatron" if framework == "megatron" else "_mindformers_read")
    assert settings.stages == 16
    assert main(["rank", DEMO, "--from", str(path), "--capacity", "1TiB", "--quiet"]) == 0, capsys.readouterr()


def test_a_note_is_written_when_the_command_succeeds(capsys):
    config = os.path.join(EXAMPLES, "llama2_7b_config.json")
    assert main(["best", config, "--micro-batches", "8", "--seq", "4096", "--stages", "4", "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note: --dp not given")
