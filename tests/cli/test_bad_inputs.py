"""Bad and hostile inputs: every one gets exit 2 and one line naming the file or flag and
the field (CLI, as a subprocess with bounded memory and time), or a ValueError (API).

Each case builds its files in a temporary folder, runs ``gpuknap ARGS`` and
checks: exit code 2, stderr exactly one line starting ``gpuknap: error:``
and containing every expected word (``{f}`` stands for the case's file),
no traceback (a run that hangs is killed after a minute; how fast refusals are is measured by
``scripts/redteam_21.py``, not asserted here).  Cases with an ``api`` call make
the same mistake through the Python API and expect a ``ValueError``.
"""
from __future__ import annotations

import copy
import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest
from paths import EXAMPLES, PACKAGED

from gpuknap import (
    BackendUnavailable,
    LayerOption,
    PipelineModel,
    best_splits,
    least_times,
)
from gpuknap.formats import load_spec, sapp_ppb

DEMO = os.path.join(EXAMPLES, "demo.json")
LLAMA = os.path.join(EXAMPLES, "llama2_70b.json")
GOOD_ROW = "4,5,6,6,6,6,6,6,6,6,7,7,7,7,7,6"
with open(os.path.join(EXAMPLES, "llama2_7b_config.json")) as _fh:
    LLAMA_CONFIG = json.load(_fh)
#: Address-space limit of each CLI run: generous for NumPy, far below what a runaway allocation takes.
MEMORY_LIMIT = 3 * 2**30
#: A CLI run that has not ended after this many seconds counts as a hang (a guard, not a speed check).
SECONDS = 60


def demo() -> dict:
    with open(DEMO) as fh:
        return json.load(fh)


def profile() -> dict:
    with open(PACKAGED) as fh:
        return json.load(fh)


def edited(edit: Callable[[dict], Any], base: Callable[[], dict] = demo) -> Callable[[], str]:
    def make() -> str:
        data = copy.deepcopy(base())
        edit(data)
        return json.dumps(data)
    return make


def text(content: str | bytes) -> Callable[[], str | bytes]:
    return lambda: content


def yaml_bomb() -> str:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines + ["name: *i"]) + "\n"


def big_model() -> str:
    return json.dumps({"layers": [{"kind": "L", "count": 100_000}],
                       "kinds": {"L": {"static": "10 MB", "options": [
                           {"name": "A", "memory": "10 MB", "forward": 1, "backward": 2},
                           {"name": "B", "memory": "1 MB", "forward": 1, "backward": 3}]}},
                       "device": {"capacity": "80 GiB"}, "pipeline": {"micro_batches": 4, "stages": 4}})


def interleaved() -> str:
    data = demo()
    data["pipeline"] = {"stages": 2, "micro_batches": 8, "interleave": 2, "in_flight": [[2, 2], [1, 1]]}
    return json.dumps(data)


@dataclass
class Case:
    """One bad input: files to write, the command line, words stderr must contain, an API twin."""

    name: str
    argv: list
    words: list
    files: dict = field(default_factory=dict)  # file name -> content maker
    api: Callable[[dict], Any] | None = None  # paths -> call that must raise ValueError


def spec_case(name, make, words, *, args=(), suffix=".json", api=True) -> Case:
    """A spec file ``f`` run through ``gpuknap best f``; the API loads it with ``load_spec``."""
    fname = "spec" + suffix
    return Case(name, ["best", "{f}", *args], ["{f}", *words], {fname: make},
                (lambda p: load_spec(p[fname])) if api else None)


def rank_case(name, rows, words, *, spec=DEMO, suffix=".csv", api=True) -> Case:
    fname = "splits" + suffix
    return Case(name, ["rank", spec, "--splits", "{f}"], ["{f}", *words], {fname: rows},
                (lambda p: load_spec(spec).model.rank(_read_rows(p[fname]), backend="numpy")) if api else None)


def _read_rows(path: str) -> Any:
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    with open(path) as fh:
        return [[int(x) for x in line.split(",")] for line in fh if line.strip() and not line.startswith("#")]


def flag_case(name, argv, words, api=None) -> Case:
    return Case(name, argv, words, {}, api)


CASES = [
    # 1. unknown keys, at every depth, with the nearest known name suggested
    spec_case("device.reserverd", edited(lambda d: d["device"].update(reserverd="70 GiB")),
              ["device", "'reserverd'", "did you mean 'reserved'"]),
    spec_case("device.capcity", edited(lambda d: d["device"].update(capcity="1 GiB")),
              ["device", "'capcity'", "did you mean 'capacity'"]),
    spec_case("pipeline.interleve", edited(lambda d: d["pipeline"].update(interleve=2)),
              ["pipeline", "did you mean 'interleave'"]),
    spec_case("pipeline.micro_batch", edited(lambda d: d["pipeline"].update(micro_batch=2)),
              ["pipeline", "did you mean 'micro_batches'"]),
    spec_case("layers[0].cnt", edited(lambda d: d["layers"][0].update(cnt=2)), ["layers[0]", "did you mean 'count'"]),
    spec_case("kinds.BODY.statik", edited(lambda d: d["kinds"]["BODY"].update(statik=1)),
              ["kinds.BODY", "did you mean 'static'"]),
    spec_case("option.forwrd", edited(lambda d: d["kinds"]["BODY"]["options"][0].update(forwrd=1)),
              ["kinds.BODY.options[0]", "did you mean 'forward'"]),
    spec_case("top-level nme", edited(lambda d: d.update(nme="x")), ["(top level)", "did you mean 'name'"]),
    spec_case("transformer.hiden", edited(lambda d: d["transformer"].update(hiden=1), lambda: json.load(open(LLAMA))),
              ["transformer", "did you mean 'hidden'"]),
    spec_case("yaml device.reserverd", text("name: y\ntransformer: {preset: llama2-70b}\n"
                                            "device: {capacity: 80 GiB, reserverd: 70 GiB}\n"
                                            "pipeline: {stages: 8, micro_batches: 64}\n"),
              ["device", "did you mean 'reserved'"], suffix=".yaml"),
    Case("sapp entry memory_activaton",
         ["best", "{f}", "--capacity", "56000MB", "--micro-batches", "32", "--stages", "16"],
         ["{f}", "layers_description[1]", "did you mean 'memory_activation'"],
         {"p.json": edited(lambda d: d["layers_description"][1].update(memory_activaton=1), profile)},
         lambda p: sapp_ppb.load(p["p.json"], "56000MB", 32)),
    # 2. inputs that used to reach a traceback
    spec_case("count 10**30", edited(lambda d: d["layers"][1].update(count=10**30)), ["layers[1].count"]),
    spec_case("count 10**9", edited(lambda d: d["layers"][1].update(count=10**9)), ["layers[1].count"]),
    spec_case("count 1e30 float", edited(lambda d: d["layers"][1].update(count=1e30)), ["layers[1].count"]),
    spec_case("nested 100,000 deep", text("[" * 100_000 + "]" * 100_000), ["nested"]),
    spec_case("yaml alias bomb", text(yaml_bomb()), ["values"], suffix=".yaml"),
    spec_case("NaN literal", text('{"name": NaN}'), ["NaN"]),
    spec_case("capacity 10**400", edited(lambda d: d["device"].update(capacity=10**400)), ["device.capacity"]),
    spec_case("micro_batches 10**30", edited(lambda d: d["pipeline"].update(micro_batches=10**30)),
              ["pipeline.micro_batches"]),
    spec_case("in_flight 10**30", edited(lambda d: d["pipeline"].update(stages=2, in_flight=[[10**30], [1]])),
              ["pipeline.in_flight"]),
    spec_case("in_flight a string", edited(lambda d: d["pipeline"].update(in_flight="16")), ["pipeline.in_flight"]),
    spec_case("excess leaves negative memory",
              edited(lambda d: d["kinds"]["BODY"]["options"][0].update(excess=[[1, "900 MB"]])),
              ["kinds.BODY.options[0].excess[0]", "negative"]),
    spec_case("excess not a list", edited(lambda d: d["kinds"]["BODY"]["options"][0].update(excess=5)),
              ["kinds.BODY.options[0].excess"]),
    spec_case("transformer hidden 10**30",
              edited(lambda d: d["transformer"].update(hidden=10**30), lambda: json.load(open(LLAMA))),
              ["transformer.hidden"]),
    spec_case("transformer layers 2.5",
              edited(lambda d: d["transformer"].update(layers=2.5), lambda: json.load(open(LLAMA))),
              ["transformer.layers"]),
    spec_case("huge forward time", edited(lambda d: d["kinds"]["BODY"]["options"][0].update(forward=1e250)),
              ["kinds.BODY.options[0].forward"]),
    spec_case("huge memory", edited(lambda d: d["kinds"]["BODY"]["options"][0].update(memory=1e300)),
              ["kinds.BODY.options[0].memory"]),
    Case("curve --points 100000000", ["curve", DEMO, "--stage", "1", "--counts", GOOD_ROW, "--points", "100000000"],
         ["--points"]),
    # 3. jobs too large: refused up front with the estimate and what to change
    flag_case("--top 1000000000", ["best", "--top", "1000000000"], ["--top", "1,000"],
              lambda p: best_splits(load_spec(DEMO).model, 16, top=10**9)),
    flag_case("--max-work 1e5", ["best", DEMO, "--max-work", "1e5"], ["DP cells", "--bucket", "--max-work"]),
    flag_case("--bucket 256B", ["best", DEMO, "--bucket", "256B"], ["DP row", "--bucket", "--max-memory"]),
    # integers longer than Python converts (4,300 digits): the file named, not Python's own remedy
    spec_case("JSON integer of 5,000 digits", text('{"name": ' + "9" * 5000 + "}"), ["5,000 digits"]),
    spec_case("YAML integer of 5,000 digits", text("name: " + "9" * 5000 + "\n"), ["4,300 digits"], suffix=".yaml"),
    # a bucket the spec file set is named where a coarser one is suggested; api=False: the API loads it
    spec_case("spec bucket 16 B", edited(lambda d: d.update(bucket="16 B")),
              ["DP row", "(--bucket, or {f}: bucket)", "--max-memory"], api=False),
    Case("curve on 100,000 layers", ["curve", "{f}", "--stage", "0", "--counts", "25000,25000,25000,25000"],
         ["DP cells", "--bucket"], {"big.json": big_model},
         lambda p: least_times(load_spec(p["big.json"]).model.stages([25000] * 4)[0].groups,
                               load_spec(p["big.json"]).model.fronts, 2**40)),
    Case("best on 100,000 layers in 2,000 stages", ["best", "{f}", "--stages", "2000"], ["segments"],
         {"big.json": big_model}, lambda p: best_splits(load_spec(p["big.json"]).model, 2000)),
    flag_case("--max-work 0", ["best", "--max-work", "0"], ["--max-work"]),
    flag_case("--max-memory 1", ["best", DEMO, "--max-memory", "1"], ["--max-memory"],
              lambda p: best_splits(load_spec(DEMO).model, 16, max_bytes=1, backend="numpy")),
    flag_case("--max-memory 8Mb", ["best", "--max-memory", "8Mb"], ["--max-memory", "bits"]),
    # 4. errors blamed on the right place
    flag_case("--stages 0", ["best", DEMO, "--stages", "0"], ["--stages"], lambda p: load_spec(DEMO, stages=0)),
    flag_case("--stages 500", ["best", DEMO, "--stages", "500"], ["--stages", "98 layers"],
              lambda p: best_splits(load_spec(DEMO).model, 500)),
    spec_case("pipeline.stages 500", edited(lambda d: d["pipeline"].update(stages=500)), ["pipeline.stages"],
              api=False),
    flag_case("--micro-batches 0", ["best", DEMO, "--micro-batches", "0"], ["--micro-batches"],
              lambda p: load_spec(DEMO, micro_batches=0)),
    flag_case("--capacity -5GiB", ["best", DEMO, "--capacity=-5GiB"], ["--capacity"],
              lambda p: load_spec(DEMO, capacity="-5 GiB")),
    flag_case("--capacity 0", ["best", DEMO, "--capacity", "0"], ["--capacity"]),
    flag_case("--bucket 0", ["best", DEMO, "--bucket", "0 MiB"], ["--bucket"], lambda p: load_spec(DEMO, bucket=0)),
    spec_case("binary garbage", text(bytes(range(256)) * 8), ["not a text file"]),
    spec_case("invalid UTF-8 yaml", text(b"name: \xff\xfe\n"), ["UTF-8"], suffix=".yaml"),
    spec_case("NUL bytes", text(b'{"name": "a\x00"}'), ["NUL"]),
    spec_case("empty file", text(""), ["not valid JSON"]),
    spec_case("YAML syntax error", text("name: [unclosed\n"), ["not valid YAML"], suffix=".yaml"),
    spec_case("top level a list", text("[1, 2]"), ["(top level)", "mapping"]),
    spec_case("layers empty", edited(lambda d: d.update(layers=[])), ["layers"]),
    spec_case("unknown kind", edited(lambda d: d["layers"][1].update(kind="BDY")), ["layers[1].kind", "BDY"]),
    Case("spec is a directory", ["best", "{f}"], ["{f}", "directory"], {"dir/": None},
         lambda p: load_spec(p["dir/"])),
    flag_case("missing spec", ["best", "/nonexistent/spec.json"], ["/nonexistent/spec.json", "cannot read"],
              lambda p: load_spec("/nonexistent/spec.json")),
    rank_case("fake .npy", text(b"\x93NUMPY garbage"), ["not a .npy"], suffix=".npy", api=False),
    rank_case("pickled .npy", lambda: _npy(np.array([[object()]], dtype=object)), [".npy"], suffix=".npy",
              api=False),
    rank_case("float .npy", lambda: _npy(np.full((2, 16), 6.5)), ["integer"], suffix=".npy"),
    rank_case("empty .npy", lambda: _npy(np.zeros((0, 16), dtype=np.int64)), ["no splits"], suffix=".npy",
              api=False),  # as an empty CSV: bad input (2), not "none of the 0 splits is feasible" (1)
    rank_case(".npy count of 2**32 + 4", lambda: _npy(np.array([[2**32 + 4] + [6] * 15])),
              ["row 0", "count of 4294967300", "98 layers"], suffix=".npy"),  # not a clipped sum
    rank_case("CSV count < 1 on line 3", text(f"# splits\n{GOOD_ROW}\n" + ",".join(["0"] + ["7"] * 14 + ["14"]) + "\n"),
              ["line 3", "count < 1"]),
    rank_case("CSV ragged", text(f"{GOOD_ROW}\n1,2,95\n"), ["line 2 has 3 counts, line 1 has 16"]),
    rank_case("CSV not integers", text("4,5,six\n"), ["line 1", "'six'"], api=False),
    rank_case("CSV wrong sum", text(f"{GOOD_ROW}\n{GOOD_ROW[:-1]}7\n"), ["line 2", "sums to 99"]),
    rank_case("CSV empty", text("# nothing\n"), ["no splits"], api=False),
    rank_case("CSV huge count", text("9" * 30 + "\n"), ["line 1"], api=False),
    rank_case("interleaved spec, plain CSV", text(GOOD_ROW + "\n"), ["16 counts", "needs 4"], spec="{i}", api=False),
    Case("--counts wrong sum", ["curve", DEMO, "--stage", "0", "--counts", ",".join(["1"] * 16)],
         ["--counts", "sum"], {}, lambda p: load_spec(DEMO).model.stages([1, 2, 3])),
    Case("--counts with an empty count", ["timeline", DEMO, "--counts", "5,,4,9"], ["--counts", "empty count"]),
    Case("--stage out of range", ["curve", DEMO, "--stage", "16", "--counts", GOOD_ROW], ["--stage", "0..15"]),
    # 5. silent no-ops and odd successes
    Case("--plot at a directory", ["best", DEMO, "--plot", "{f}"], ["--plot", "directory"], {"out/": None}),
    Case("--plot in a missing folder", ["best", DEMO, "--plot", "/nonexistent/dir/p.png"], ["--plot", "does not exist"]),
    Case("--plot .txt", ["best", DEMO, "--plot", "p.txt"], ["--plot", ".png"]),
    Case("--out in a missing folder", ["rank", DEMO, "--splits", "{f}", "--out", "/nonexistent/o.csv"],
         ["--out", "does not exist"], {"s.csv": text(GOOD_ROW + "\n")}),
    flag_case("--points 0", ["curve", DEMO, "--stage", "0", "--counts", GOOD_ROW, "--points", "0"], ["--points"]),
    flag_case("--points 1", ["curve", DEMO, "--stage", "0", "--counts", GOOD_ROW, "--points", "1"], ["--points"]),
    spec_case("reserved above capacity", edited(lambda d: d["device"].update(reserved="60000 MB")),
              ["device.reserved"]),
    flag_case("--capacity below reserved", ["best", LLAMA, "--capacity", "2 GiB"], ["reserved"],
              lambda p: load_spec(LLAMA, capacity="2 GiB")),
    spec_case("name not a string", edited(lambda d: d.update(name={"a": 1})), ["name", "string"]),
    spec_case("option name not a string", edited(lambda d: d["kinds"]["BODY"]["options"][0].update(name=5)),
              ["kinds.BODY.options[0].name"]),
    spec_case("duplicate option names", edited(lambda d: d["kinds"]["BODY"]["options"][1].update(name="NONE")),
              ["kinds.BODY.options[1].name", "'NONE'"]),
    flag_case("bad --score", ["best", "--score", "fastest"], ["--score"],
              lambda p: best_splits(load_spec(DEMO).model, 16, score="fastest")),
    flag_case("--backend cuda", ["best", "--backend", "cuda"], ["--backend"],
              lambda p: load_spec(DEMO).model.rank([[98]], backend="cuda")),
    # 7. units: one binary rule; bits and ambiguous spellings refused
    flag_case("--capacity 80 Gb", ["best", DEMO, "--capacity", "80 Gb"], ["--capacity", "bits"],
              lambda p: load_spec(DEMO, capacity="80 Gb")),
    flag_case("--capacity 56000 kB", ["best", DEMO, "--capacity", "56000 kB"], ["--capacity", "ambiguous"]),
    flag_case("--bucket 1 mib", ["best", DEMO, "--bucket", "1 mib"], ["--bucket", "case"]),
    flag_case("--bucket 1 mb", ["best", DEMO, "--bucket", "1 mb"], ["--bucket", "bits"]),
    flag_case("--bucket 1 MIB", ["best", DEMO, "--bucket", "1 MIB"], ["--bucket", "case"]),
    spec_case("memory 852 Mb", edited(lambda d: d["kinds"]["BODY"]["options"][0].update(memory="852 Mb")),
              ["kinds.BODY.options[0].memory", "bits"]),
    spec_case("forward 2 MS", edited(lambda d: d["kinds"]["BODY"]["options"][0].update(forward="2 MS")),
              ["kinds.BODY.options[0].forward", "time unit"]),
    # Hugging Face configs
    Case("config without --seq", ["best", "{f}", "--capacity", "80GiB", "--micro-batches", "8", "--stages", "4"],
         ["{f}", "--seq"], {"config.json": text(json.dumps(LLAMA_CONFIG))},
         lambda p: load_spec(p["config.json"], capacity="80GiB", micro_batches=8)),
    Case("MoE config without its expert fields", ["best", "{f}", "--capacity", "80GiB", "--micro-batches", "8",
                                                  "--seq", "4096"], ["{f}", "num_experts_per_tok", "missing"],
         {"config.json": text(json.dumps({**LLAMA_CONFIG, "model_type": "deepseek_v3",
                                          "architectures": ["DeepseekV3ForCausalLM"]}))},
         lambda p: load_spec(p["config.json"], capacity="80GiB", micro_batches=8, seq=4096)),
    Case("config --tp 3", ["best", "{f}", "--capacity", "80GiB", "--micro-batches", "8", "--seq", "4096", "--tp", "3"],
         ["{f}", "num_attention_heads", "--tp"], {"config.json": text(json.dumps(LLAMA_CONFIG))},
         lambda p: load_spec(p["config.json"], capacity="80GiB", micro_batches=8, seq=4096, tensor_parallel=3)),
    Case("config --ep 2 on a dense model", ["best", "{f}", "--capacity", "80GiB", "--micro-batches", "8", "--seq",
                                            "4096", "--ep", "2"], ["--ep"], {"config.json": text(json.dumps(LLAMA_CONFIG))},
         lambda p: load_spec(p["config.json"], capacity="80GiB", micro_batches=8, seq=4096, expert_parallel=2)),
    Case("config with a bad field", ["best", "{f}", "--capacity", "80GiB", "--micro-batches", "8", "--seq", "4096"],
         ["{f}", "vocab_size"], {"config.json": text(json.dumps({**LLAMA_CONFIG, "vocab_size": -1}))},
         lambda p: load_spec(p["config.json"], capacity="80GiB", micro_batches=8, seq=4096)),
    Case("MoE config, --ep not dividing the experts",
         ["best", "{f}", "--capacity", "80GiB", "--micro-batches", "8", "--seq", "4096", "--ep", "3"],
         ["{f}", "num_local_experts", "--ep"], {"config.json": lambda: open(os.path.join(EXAMPLES,
                                                                                         "mixtral_8x7b_config.json")).read()},
         lambda p: load_spec(p["config.json"], capacity="80GiB", micro_batches=8, seq=4096, expert_parallel=3)),
    Case("unknown model_type", ["best", "{f}", "--capacity", "80GiB", "--micro-batches", "8", "--seq", "4096"],
         ["{f}", "model_type", "'gpt2'"], {"config.json": text(json.dumps({**LLAMA_CONFIG, "model_type": "gpt2"}))},
         lambda p: load_spec(p["config.json"], capacity="80GiB", micro_batches=8, seq=4096)),
    flag_case("--seq on a spec", ["best", DEMO, "--seq", "4096"], ["--seq", "Hugging Face"],
              lambda p: load_spec(DEMO, seq=4096)),
    flag_case("--tp 0", ["best", DEMO, "--tp", "0"], ["--tp"]),
    # training settings
    flag_case("--emit bogus", ["best", "--emit", "bogus"], ["--emit"]),
    flag_case("rank with neither --splits nor --from", ["rank", DEMO], ["--splits or --from"]),
    spec_case("--emit mindformers with options it cannot run",
              edited(lambda d: [o.update(name=f"OFFLOAD{i}") for i, o in enumerate(d["kinds"]["BODY"]["options"])]),
              ["--emit mindformers", "kind 'BODY'", "mindformers runs"], args=("--emit", "mindformers"), api=False),
    Case("rank --from with --plot", ["rank", DEMO, "--from", "{f}", "--plot", "p.png"], ["--plot", "--from"],
         {"mf.yaml": text("parallel_config: {pipeline_stage: 16}\nmodel: {model_config: {num_layers: 96}}\n")}),
    Case("rank --from a file of garbage", ["rank", DEMO, "--from", "{f}"], ["{f}", "pipeline_stage"],
         {"mf.yaml": text("just: text\n")}),
    # SAPP-PPB profiles
    Case("sapp without --capacity", ["best", PACKAGED, "--stages", "16"], ["capacity"], {},
         lambda p: load_spec(PACKAGED)),
    Case("sapp bad type", ["best", "{f}", "--capacity", "56000MB", "--micro-batches", "32", "--stages", "4"],
         ["{f}", "layers_description[1].type"],
         {"p.json": edited(lambda d: d["layers_description"][1].update(type="MIDDLE"), profile)},
         lambda p: sapp_ppb.load(p["p.json"], "56000MB", 32)),
    Case("sapp nb_layer 10**9", ["best", "{f}", "--capacity", "56000MB", "--micro-batches", "32", "--stages", "4"],
         ["{f}", "nb_layer"],
         {"p.json": edited(lambda d: d["layers_description"][1].update(nb_layer=10**9), profile)},
         lambda p: sapp_ppb.load(p["p.json"], "56000MB", 32)),
    Case("sapp time 1e300", ["best", "{f}", "--capacity", "56000MB", "--micro-batches", "32", "--stages", "4"],
         ["{f}", "layers_description[1].time"],
         {"p.json": edited(lambda d: d["layers_description"][1].update(time=1e300), profile)},
         lambda p: sapp_ppb.load(p["p.json"], "56000MB", 32)),
]


def _npy(arr: np.ndarray) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


def _limits() -> None:  # in the child: bounded memory
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_cli(argv: list, cwd: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy", "OPENBLAS_NUM_THREADS": "1"}
    start = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "gpuknap", *argv], capture_output=True, text=True, env=env,
                       cwd=cwd, timeout=SECONDS, preexec_fn=_limits)
    return p, time.perf_counter() - start


def materialise(case: Case, tmp_path) -> dict:
    paths = {}
    for name, make in case.files.items():
        path = tmp_path / name.rstrip("/")
        if name.endswith("/"):
            path.mkdir()
        else:
            content = make()
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
        paths[name] = str(path)
    paths["{i}"] = str(tmp_path / "interleaved.json")
    (tmp_path / "interleaved.json").write_text(interleaved())
    return paths


def _fill(word: str, paths: dict) -> str:
    first = next((v for k, v in paths.items() if k != "{i}"), "")
    return word.replace("{f}", first).replace("{i}", paths["{i}"])


def test_the_table_is_large():
    assert len(CASES) >= 60 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cli_exits_2_with_one_line(case, tmp_path):
    paths = materialise(case, tmp_path)
    argv = [_fill(a, paths) for a in case.argv]
    p, seconds = run_cli(argv, str(tmp_path))
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.splitlines()
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr)
    assert len(lines) == 1 and lines[0].startswith("gpuknap: error: "), p.stderr
    for word in case.words:
        assert _fill(word, paths) in lines[0], (word, lines[0])


API_CASES = [c for c in CASES if c.api is not None]


@pytest.mark.parametrize("case", API_CASES, ids=[c.name for c in API_CASES])
def test_api_raises_value_error(case, tmp_path):
    paths = materialise(case, tmp_path)
    with pytest.raises(ValueError):
        case.api(paths)


def test_api_validation_does_not_depend_on_the_data():
    """Bad arguments are refused whether memory is loose or tight."""
    for capacity in ("56000 MB", "1 TiB", "1 GiB"):
        model = load_spec(DEMO, capacity=capacity).model
        rows = np.array([[int(x) for x in GOOD_ROW.split(",")]])
        for kwargs in ({"backend": "garbage"}, {"max_bytes": -1}, {"max_bytes": 0}, {"chunks": 0},
                       {"bucket": 0}, {"bucket": math.nan}):
            with pytest.raises(ValueError):
                model.rank(rows, **kwargs)
        for kwargs in ({"backend": "garbage"}, {"max_bytes": -1}, {"bucket": -1}, {"score": "x"}, {"top": 0}):
            with pytest.raises(ValueError):
                best_splits(model, 16, **kwargs)


@pytest.mark.parametrize("kwargs", [{"capacity": -1}, {"capacity": 0}, {"capacity": math.inf},
                                    {"reserved": -1}, {"reserved": 100}, {"reserved": 200}, {"micro_batches": 0}])
def test_pipeline_model_checks_its_device(kwargs):
    args = {"kinds": ["a"], "fronts": {"a": [LayerOption("x", 1, 1, 1)]}, "static": {"a": 0},
            "capacity": 100, "micro_batches": 1, **kwargs}
    with pytest.raises(ValueError):
        PipelineModel(**args)


def test_sapp_load_checks_capacity():
    with pytest.raises(ValueError, match="capacity"):
        sapp_ppb.load(PACKAGED, -1, 4)


def test_backend_unavailable_is_a_value_error():
    assert issubclass(BackendUnavailable, ValueError)


def test_infeasible_large_model_is_recognised_at_once(tmp_path):
    (tmp_path / "big.json").write_text(big_model())
    p, seconds = run_cli(["best", str(tmp_path / "big.json")], str(tmp_path))
    assert p.returncode == 1 and p.stderr == ""
    assert "hold at most" in p.stdout and "of its 100,000 layers" in p.stdout


def test_closed_pipe_exits_quietly():
    """``gpuknap best --top 200 | head -1``: no 'Broken pipe' message."""
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy"}
    p = subprocess.run(f"'{sys.executable}' -m gpuknap best --top 200 --quiet | head -1", shell=True,
                       capture_output=True, text=True, env=env)
    assert p.stdout.startswith("#1 of demo") and p.stderr == ""


# ---- Round 2 (issue 21): closed readers, strict types, contradictions, duplicates, flags -----------
# These run the command line in process (gpuknap.cli.main) to keep the suite fast; the cases that
# are about time or memory before a refusal are in CASES above (subprocess, bounded).

MIXTRAL_CONFIG = json.load(open(os.path.join(EXAMPLES, "mixtral_8x7b_config.json")))
DEEPSEEK_CONFIG = json.load(open(os.path.join(EXAMPLES, "deepseek_v3_config.json")))
QWEN_MOE_CONFIG = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
                   "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                   "num_experts": 60, "num_experts_per_tok": 4, "num_attention_heads": 16, "num_key_value_heads": 16,
                   "num_hidden_layers": 24, "vocab_size": 151936, "decoder_sparse_step": 1, "mlp_only_layers": []}
QWEN3_MOE_CONFIG = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                    "num_experts_per_tok": 8, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                    "num_hidden_layers": 48, "vocab_size": 151936}
CONFIGS = {"llama": LLAMA_CONFIG, "mixtral": MIXTRAL_CONFIG, "deepseek_v3": DEEPSEEK_CONFIG,
           "qwen2_moe": QWEN_MOE_CONFIG, "qwen3_moe": QWEN3_MOE_CONFIG}
RUN = ["--micro-batches", "8", "--seq", "4096"]


def typo(word: str) -> str:
    """A one-letter slip: the last letter dropped (``num_key_value_head``)."""
    return word[:-1]


def config_case(name, base, edit, words, args=()):
    data = copy.deepcopy(base)
    edit(data)
    return Case(name, ["best", "{f}", *RUN, *args], ["{f}", *words], {"config.json": text(json.dumps(data))},
                lambda p: load_spec(p["config.json"], micro_batches=8, seq=4096))


MORE = []
# typos of every field a family reads or knows, refused with the nearest name
for family, base in CONFIGS.items():
    for key in sorted(base):
        if key in ("architectures", "model_type") or key.startswith("_"):
            continue
        MORE.append(config_case(f"{family}: typo {typo(key)}", base,
                                lambda d, k=key: d.__setitem__(typo(k), d.pop(k)), [repr(typo(key)), "did you mean"]))
for family, base, key in (("llama", LLAMA_CONFIG, "num_key_value_heads"), ("deepseek_v3", DEEPSEEK_CONFIG,
                                                                           "first_k_dense_replace"),
                          ("deepseek_v3", DEEPSEEK_CONFIG, "moe_layer_freq"), ("qwen2_moe", QWEN_MOE_CONFIG,
                                                                               "decoder_sparse_step"),
                          ("deepseek_v3", DEEPSEEK_CONFIG, "n_shared_experts"), ("deepseek_v3", DEEPSEEK_CONFIG,
                                                                                 "q_lora_rank"),
                          ("qwen3_moe", QWEN3_MOE_CONFIG, "head_dim")):
    MORE.append(config_case(f"{family}: optional {key} misspelt as an extra field", base,
                            lambda d, k=key: d.__setitem__(typo(k), 1), [repr(typo(key))]))
# strict types
for value in ("", False, 1.5, "1", [1]):
    MORE.append(config_case(f"deepseek n_shared_experts {value!r}", DEEPSEEK_CONFIG,
                            lambda d, v=value: d.update(n_shared_experts=v), ["n_shared_experts"]))
    MORE.append(config_case(f"qwen2_moe shared_expert_intermediate_size {value!r}", QWEN_MOE_CONFIG,
                            lambda d, v=value: d.update(shared_expert_intermediate_size=v),
                            ["shared_expert_intermediate_size"]))
for key, value in (("moe_layer_freq", 0), ("first_k_dense_replace", -1), ("first_k_dense_replace", 61),
                   ("first_k_dense_replace", 1000), ("q_lora_rank", "big"), ("q_lora_rank", 0), ("kv_lora_rank", 0),
                   ("num_nextn_predict_layers", None)):
    if value is None:
        continue
    MORE.append(config_case(f"deepseek {key} {value!r}", DEEPSEEK_CONFIG, lambda d, k=key, v=value: d.update({k: v}),
                            [key]))
for key, value in (("decoder_sparse_step", 0), ("mlp_only_layers", [99]), ("mlp_only_layers", "0"),
                   ("mlp_only_layers", [True]), ("mlp_only_layers", list(range(24))), ("num_experts", 0)):
    MORE.append(config_case(f"qwen2_moe {key} {str(value)[:20]}", QWEN_MOE_CONFIG,
                            lambda d, k=key, v=value: d.update({k: v}), [key]))
for key, value in (("head_dim", 0), ("head_dim", 1.5), ("num_key_value_heads", True), ("num_key_value_heads", 5),
                   ("num_experts_per_tok", 200), ("hidden_size", "2048"), ("num_hidden_layers", 1e8),
                   ("num_hidden_layers", 10**8), ("vocab_size", 0)):
    MORE.append(config_case(f"qwen3_moe {key} {value!r}", QWEN3_MOE_CONFIG,
                            lambda d, k=key, v=value: d.update({k: v}), [key]))
# contradictions between model_type, architectures and fields
MORE += [
    config_case("llama with Mixtral's class", LLAMA_CONFIG, lambda d: d.update(architectures=["MixtralForCausalLM"]),
                ["architectures", "'llama'"]),
    config_case("llama with Mixtral's expert fields", LLAMA_CONFIG,
                lambda d: d.update(num_local_experts=8, num_experts_per_tok=2), ["num_", "mixtral"]),
    config_case("mixtral with DeepSeek's MLA fields", MIXTRAL_CONFIG, lambda d: d.update(kv_lora_rank=512),
                ["kv_lora_rank"]),
    config_case("qwen2_moe called deepseek", QWEN_MOE_CONFIG, lambda d: d.update(model_type="deepseek_v3"),
                ["architectures", "'deepseek_v3'"]),
    config_case("architectures not a list", LLAMA_CONFIG, lambda d: d.update(architectures="LlamaForCausalLM"),
                ["architectures"]),
    config_case("unknown architecture only", LLAMA_CONFIG,
                lambda d: (d.pop("model_type"), d.update(architectures=["GPT2LMHeadModel"])), ["model_type"]),
    config_case("a number as a field name in YAML-like JSON", LLAMA_CONFIG, lambda d: d.update({"7": 1}), ["'7'"]),
]
# the same divisibility rules on every path
for name, base, args, words in (
        ("mixtral --tp 3", MIXTRAL_CONFIG, ("--tp", "3"), ["num_attention_heads", "--tp"]),
        ("mixtral --ep 8 on 1 GPU per stage", MIXTRAL_CONFIG, ("--ep", "8"), ["--ep", "divide"]),
        ("mixtral --ep 8 --etp 4 --dp 8", MIXTRAL_CONFIG, ("--ep", "8", "--etp", "4", "--dp", "8"), ["--etp"]),
        ("mixtral --etp 3", MIXTRAL_CONFIG, ("--etp", "3"), ["--etp"]),
        ("deepseek --ep 7", DEEPSEEK_CONFIG, ("--ep", "7"), ["n_routed_experts", "--ep"]),
        ("qwen3 --tp 64", QWEN3_MOE_CONFIG, ("--tp", "64"), ["--tp"]),
        ("qwen2_moe --tp 32", QWEN_MOE_CONFIG, ("--tp", "32"), ["--tp"]),
        ("llama --etp 2", LLAMA_CONFIG, ("--etp", "2"), ["--etp"]),
        ("llama --cp 3", LLAMA_CONFIG, ("--cp", "3"), ["--cp"]),
        ("llama --tp 64", LLAMA_CONFIG, ("--tp", "64"), ["--tp"])):
    MORE.append(Case(f"divisibility: {name}", ["best", "{f}", *RUN, *args], ["{f}", *words],
                     {"config.json": text(json.dumps(base))}))
MORE.append(config_case("mixtral hidden not divisible by heads", MIXTRAL_CONFIG, lambda d: d.update(hidden_size=4097),
                        ["hidden_size"]))
# duplicated keys, in JSON and YAML
MORE += [
    Case("config with a key twice", ["best", "{f}", *RUN], ["{f}", "'hidden_size'", "twice"],
         {"config.json": text(json.dumps(LLAMA_CONFIG)[:-1] + ', "hidden_size": 8192}')},
         lambda p: load_spec(p["config.json"], micro_batches=8, seq=4096)),
    Case("spec with a key twice", ["best", "{f}"], ["{f}", "'reserved'", "twice"],
         {"spec.json": text(json.dumps(demo())[:-1].replace('"device": {', '"device": {"reserved": 0, "reserved": 1, ')
                            + "}")}, lambda p: load_spec(p["spec.json"])),
    Case("YAML spec with a key twice", ["best", "{f}"], ["{f}", "'capacity'", "twice"],
         {"spec.yaml": text("layers: [{kind: a}]\nkinds: {a: {options: [{memory: 1, forward: 1, backward: 1}]}}\n"
                            "device:\n  capacity: 80 GiB\n  capacity: 40 GiB\npipeline: {micro_batches: 2}\n")},
         lambda p: load_spec(p["spec.yaml"])),
]
# an interleaved pipeline whose micro-batches Megatron's order cannot group, its in-flight table given (without
# one the spec's loader refuses it): named by file and field
_IL = ('{"layers": [{"kind": "B", "count": 12}], "kinds": {"B": {"static": "1 GiB", "options": [{"name": "N", '
       '"memory": "1 GiB", "forward": 1, "backward": 2}]}}, "device": {"capacity": "20 GiB"}, '
       '"pipeline": {"stages": 3, "micro_batches": 4, "interleave": 2, "in_flight": [[4, 3], [4, 2], [3, 1]]}}')
MORE += [Case(f"interleaved M not a multiple of P: {cmd}", [cmd, "{f}", *more],
              ["{f}", "pipeline.micro_batches", "3 stages x 2 chunks", "multiple of stages"], {"spec.json": text(_IL)})
         for cmd, more in (("best", ()), ("curve", ("--stage", "0")), ("timeline", ("--counts", "2,2,2,2,2,2")))]
# without a table, the spec's loader builds the order: the flag or field that set M is named
MORE += [Case("interleaved M not a multiple of P, M from the flag", ["best", "{f}", "--micro-batches", "4"],
              ["{f}", "--micro-batches", "3 stages x 2 chunks", "multiple of stages"],
              {"spec.json": text(_IL.replace(', "in_flight": [[4, 3], [4, 2], [3, 1]]', ""))},
              lambda p: load_spec(p["spec.json"], micro_batches=4)),
         Case("interleaved M not a multiple of P, M from the file", ["best", "{f}"],
              ["{f}", "pipeline.micro_batches", "3 stages x 2 chunks", "multiple of stages"],
              {"spec.json": text(_IL.replace(', "in_flight": [[4, 3], [4, 2], [3, 1]]', ""))},
              lambda p: load_spec(p["spec.json"]))]
# integers beyond any float in a spec's device numbers: refused by field, the number cut short (they crashed)
_HUGE = "1" + "0" * 400
MORE += [
    Case("device.peak_flops of 401 digits", ["best", "{f}"], ["{f}", "device.peak_flops", "(401 characters)"],
         {"spec.json": lambda: json.dumps({**json.load(open(LLAMA)), "device": {"peak_flops": 10**400}})}),
    Case("transformer.peak_flops of 401 digits", ["best", "{f}"], ["{f}", "transformer.peak_flops", "(401 characters)"],
         {"spec.json": text(json.dumps(json.load(open(LLAMA))).replace('"transformer": {',
                                                                       '"transformer": {"peak_flops": ' + _HUGE + ", ",
                                                                       1))}),
    Case("device.gpus_per_node of 401 digits", ["best", "{f}"], ["{f}", "gpus_per_node", "(401 characters)"],
         {"spec.json": lambda: json.dumps({**json.load(open(LLAMA)), "device": {"gpus_per_node": 10**400}})}),
]
# flags and traps
MORE += [
    flag_case("--capacity 0", ["best", DEMO, "--capacity", "0"], ["--capacity", "positive"]),
    flag_case("--capacity 1048575", ["best", DEMO, "--capacity", "1048575"], ["--capacity", "give a unit"]),
    flag_case("--efficiency 1e-4", ["best", LLAMA, "--efficiency", "1e-4"], ["--efficiency", "from 0.001 to 1"]),
    flag_case("--counts empty", ["timeline", DEMO, "--counts", ""], ["--counts", "no counts"]),
    flag_case("--counts blank", ["curve", DEMO, "--stage", "0", "--counts", "  "], ["--counts"]),
    flag_case("--stages against --counts", ["timeline", DEMO, "--stages", "4", "--counts", "49,49"],
              ["--stages", "--counts"]),
    flag_case("--capacity 80", ["best", DEMO, "--capacity", "80"], ["--capacity", "80GiB"]),
    flag_case("--capacity 80gb", ["best", DEMO, "--capacity", "80gb"], ["--capacity", "80GiB"]),
    flag_case("--capacity 8e1", ["best", DEMO, "--capacity", "8e1"], ["--capacity", "'80GiB'"]),
    flag_case("--capacity +80", ["best", DEMO, "--capacity", "+80"], ["--capacity", "'80GiB'"]),
    flag_case("--bucket 1e-300", ["best", LLAMA, "--bucket", "1e-300"], ["bucket 1e-300 is too small"]),
    # numbers as every size and file reads them: no underscores, no other scripts' digits (Python's own take both)
    flag_case("--device-field 1_000_000", ["best", DEMO, "--device-field", "peak_flops=1_000_000"],
              ["--device-field", "peak_flops", "without underscores"]),
    flag_case("--efficiency 0.7_3", ["best", DEMO, "--efficiency", "0.7_3"], ["--efficiency", "without underscores"]),
    flag_case("--max-work 1_0", ["best", DEMO, "--max-work", "1_0000000000"], ["--max-work", "without underscores"]),
    flag_case("--stages arabic digits", ["best", DEMO, "--stages", "\u0661\u0666"], ["--stages", "an integer"]),
    flag_case("--counts 1_0", ["timeline", DEMO, "--counts", "1_0,88"], ["--counts", "integers"]),
    flag_case("--device-field peak_flops=1e-300", ["best", LLAMA, "--device-field", "peak_flops=1e-300"],
              ["--device-field", "device.peak_flops", "at least"]),
    flag_case("--device-field efficiency=1e-300", ["best", LLAMA, "--device-field", "efficiency=1e-300"],
              ["--device-field", "device.efficiency"]),
    flag_case("--device-field inter_latency=5", ["best", LLAMA, "--device-field", "inter_latency=5"],
              ["device.inter_latency", "at most 1 second"]),
    flag_case("--capacity 16Mb", ["best", DEMO, "--capacity", "16Mb"], ["--capacity", "16MiB"]),
    flag_case("--pp", ["best", DEMO, "--pp", "4"], ["--pp", "--stages"]),
    flag_case("--pipeline-parallel", ["best", DEMO, "--pipeline-parallel", "4"], ["--stages"]),
    flag_case("--tensor-parallel", ["best", DEMO, "--tensor-parallel", "4"], ["--tp"]),
    flag_case("--stagse", ["best", DEMO, "--stagse", "4"], ["--stages"]),
    flag_case("sweep --tps", ["sweep", LLAMA, "--gpus", "8", "--global-batch", "8", "--tps", "2"], ["--tp"]),
    flag_case("--device bogus", ["best", LLAMA, "--device", "tpu9"], ["--device", "tpu9"]),
    flag_case("--device near miss", ["best", LLAMA, "--device", "h10"], ["--device", "did you mean"]),
    flag_case("--device-field unknown", ["best", LLAMA, "--device-field", "peak=1"], ["--device-field", "peak"]),
    flag_case("--device-field not a number", ["best", LLAMA, "--device-field", "peak_flops=lots"], ["peak_flops"]),
    flag_case("--device-field no equals", ["best", LLAMA, "--device-field", "peak_flops"], ["--device-field"]),
    flag_case("--device-field memory=80", ["best", LLAMA, "--device-field", "memory=80"],
              ["--device-field", "memory", "under 1 GiB", "80GiB"]),
    flag_case("--device-field memory=80gb", ["best", LLAMA, "--device-field", "memory=80gb"],
              ["--device-field", "memory", "bits"]),
    flag_case("--device-field negative", ["best", LLAMA, "--device-field", "inter_bandwidth=-1"],
              ["inter_bandwidth"]),
    flag_case("--efficiency 2", ["best", LLAMA, "--efficiency", "2"], ["--efficiency"]),
    flag_case("--efficiency 0", ["best", LLAMA, "--efficiency", "0"], ["--efficiency"]),
    flag_case("--gpus-per-node 0", ["best", LLAMA, "--gpus-per-node", "0"], ["--gpus-per-node"]),
    flag_case("--reserved negative", ["best", LLAMA, "--reserved", "-1GiB"], ["--reserved"]),
    flag_case("--reserved above the capacity", ["best", LLAMA, "--reserved", "90GiB"], ["reserved"]),
    flag_case("--recompute bogus", ["best", LLAMA, "--recompute", "some"], ["--recompute"]),
    flag_case("--recompute on a profile", ["best", DEMO, "--recompute", "full"], ["recompute", "--recompute"]),
    flag_case("--efficiency on a profile", ["best", DEMO, "--efficiency", "0.5"], ["efficiency", "--efficiency"]),
    flag_case("--etp on a spec's dense transformer", ["best", LLAMA, "--etp", "2"], ["expert_tensor_parallel"]),
    flag_case("--cp not dividing the spec's sequence", ["best", LLAMA, "--cp", "3"], ["context_parallel"]),
    flag_case("--tp not dividing the spec's heads", ["best", LLAMA, "--tp", "3"], ["tensor_parallel"]),
    flag_case("sweep with every configuration invalid", ["sweep", LLAMA, "--gpus", "48", "--global-batch", "48",
                                                          "--tp", "3"], ["no configuration", "tensor_parallel"]),
    flag_case("sweep --scheduler with spaces", ["sweep", LLAMA, "--gpus", "8", "--global-batch", "8",
                                                 "--scheduler", "foo bar"], ["--scheduler"]),
    flag_case("sweep --device bogus", ["sweep", LLAMA, "--gpus", "8", "--global-batch", "8", "--device", "x"],
              ["--device"]),
    flag_case("sweep --ep on a dense spec", ["sweep", LLAMA, "--gpus", "8", "--global-batch", "8", "--ep", "2"],
              ["expert_parallel"]),
]


def test_the_second_table_is_large():
    assert len(MORE) >= 150 and len({c.name for c in MORE}) == len(MORE)


@pytest.mark.parametrize("case", MORE, ids=[c.name for c in MORE])
def test_cli_refuses_in_one_line(case, tmp_path, capsys):
    from gpuknap.cli import main

    paths = materialise(case, tmp_path)
    argv = [_fill(a, paths) for a in case.argv]
    rc = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert rc == 2, (rc, captured.out[-300:], captured.err)
    assert len(lines) == 1 and lines[0].startswith("gpuknap: error: "), captured.err
    assert "np.float64(" not in lines[0] and "np.int64(" not in lines[0], lines[0]  # numbers as people write them
    for word in case.words:
        assert _fill(word, paths) in lines[0], (word, lines[0])
    if case.api is not None:
        with pytest.raises(ValueError):
            case.api(paths)


@pytest.mark.parametrize("argv, words", [
    (["timeline", "gpuknap/examples/demo.json", "--p2p", "1e307"], ["--p2p", "at most 1e+12"]),
    (["sweep", "gpuknap/examples/llama2_70b.json", "--gpus", "64", "--global-batch", "256", "--stages", "4,8",
      "--all", "--top", "1"], ["--all", "--top"]),
    (["best", "gpuknap/examples/llama2_7b_config.json", "--stages", "8", "--micro-batches", "32", "--seq", "4096",
      "--tp", "8", "--dp", "1", "--device-field", "memory=1e300"], ["--device-field", "2**70"]),
])
def test_red_team_inputs_are_refused_by_flag(capsys, argv, words):
    """A red-team round of 2026-12-02: a huge --p2p put inf and NaN in the timeline, --all dropped an
    explicit --top, and a device memory of 1e300 bytes was taken."""
    from gpuknap.cli import main  # noqa: PLC0415

    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err
