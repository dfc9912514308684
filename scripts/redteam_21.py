"""Red team of issue 21 ("Hardening, round 2"): one or more inputs of every class the issue lists.

Each probe runs in a child process (3 GiB address space, 30 s wall clock) and is judged:

- ``cli``: ``gpuknap ARGV`` must exit 2 with exactly one stderr line containing every word;
- ``ok``: a valid input that must be read (exit 0);
- ``api``: Python code that must raise ``ValueError`` whose message contains every word;
- ``fast``: Python code that must finish (any result or a ValueError) within ``SECONDS``.

Every probe must also finish within ``SECONDS``.  Run ``python scripts/redteam_21.py`` (``-k 'WORD|WORD'``
to run only the probes whose class or name contains one); it prints each failing probe and a count per class, and exits 1 when any probe fails.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EX = os.path.join(ROOT, "gpuknap", "examples")
DEMO = os.path.join(EX, "demo.json")
LLAMA = os.path.join(EX, "llama2_70b.json")
SECONDS = 10.0
MEMORY = 3 * 2**30
MEG = "--num-layers 96\n--pipeline-model-parallel-size 2\n--pipeline-model-parallel-layout 'Et*48|t*48L'\n"
MF = "parallel_config: {pipeline_stage: 2, micro_batch_num: 32}\nmodel: {model_config: {num_layers: 96, offset: [0, 0]}}\n"

# setup code runs in the child with T (a temporary folder), EX, w(name, text) -> path, cfg(name) -> dict
PRELUDE = """
import json, os, math
def w(name, text):
    path = os.path.join(T, name)
    with open(path, 'w') as fh:
        fh.write(text)
    return path
def cfg(name):
    with open(os.path.join(EX, name)) as fh:
        return json.load(fh)
"""


def cli(cls, name, argv, words, setup=""):
    return {"cls": cls, "name": name, "kind": "cli", "argv": argv, "words": words, "setup": setup}


def ok(cls, name, argv, setup=""):
    return {"cls": cls, "name": name, "kind": "ok", "argv": argv, "words": [], "setup": setup}


def api(cls, name, code, words, setup=""):
    return {"cls": cls, "name": name, "kind": "api", "code": code, "words": words, "setup": setup}


def fast(cls, name, code, setup=""):
    return {"cls": cls, "name": name, "kind": "fast", "code": code, "words": [], "setup": setup}


def moe(field, value, name="mixtral_8x7b_config.json"):
    return f"d = cfg({name!r}); d[{field!r}] = {value!r}; w('c.json', json.dumps(d))"


RUN = ["--micro-batches", "8", "--seq", "4096"]
SIZES, MISREAD, IGNORED, EXIT, MESSAGES, API, TRAPS, OTHER = (
    "sizes", "misreads", "ignored keys", "exit codes", "messages", "api", "traps", "other")

PROBES = [
    # --- sizes before allocation -----------------------------------------------------------------
    cli(SIZES, "MoE num_hidden_layers 1e8", ["best", "{T}/c.json", *RUN], ["num_hidden_layers"],
        moe("num_hidden_layers", 1e8)),
    cli(SIZES, "MoE num_hidden_layers 10**8", ["best", "{T}/c.json", *RUN], ["num_hidden_layers"],
        moe("num_hidden_layers", 10**8)),
    cli(SIZES, "DeepSeek num_hidden_layers 2,000,000", ["best", "{T}/c.json", *RUN], ["num_hidden_layers"],
        moe("num_hidden_layers", 2_000_000, "deepseek_v3_config.json")),
    cli(SIZES, "--micro-batches 1000000 best", ["best", DEMO, "--micro-batches", "1000000"], ["--micro-batches"]),
    cli(SIZES, "--micro-batches 1000000 best simulated", ["best", DEMO, "--micro-batches", "1000000", "--score",
                                                          "simulated"], ["--micro-batches"]),
    cli(SIZES, "--micro-batches 1000000 timeline", ["timeline", DEMO, "--micro-batches", "1000000"],
        ["--micro-batches"]),
    cli(SIZES, "--micro-batches 1000000 analytic", ["best", LLAMA, "--micro-batches", "1000000"],
        ["--micro-batches"]),
    cli(SIZES, "--micro-batches 1000000 interleaved", ["best", DEMO, "--micro-batches", "1000000", "--interleave",
                                                       "2", "--stages", "8"], ["--micro-batches"]),
    fast(SIZES, "timeline at its op limit (text)",
         "from gpuknap.cli import main; from gpuknap.schedule import MAX_TIMELINE_OPS\n"
         "rc = main(['timeline', DEMO, '--micro-batches', str(MAX_TIMELINE_OPS // 32), '--quiet'])\n"
         "assert rc == 0, rc"),
    fast(SIZES, "timeline at its op limit (JSON)",
         "from gpuknap.cli import main; from gpuknap.schedule import MAX_TIMELINE_OPS\n"
         "rc = main(['timeline', DEMO, '--micro-batches', str(MAX_TIMELINE_OPS // 32), '--quiet', '--json'])\n"
         "assert rc == 0, rc"),
    cli(SIZES, "timeline one micro-batch over its op limit",
        ["timeline", DEMO, "--micro-batches", "7813"], ["--micro-batches", "250,000"]),
    fast(SIZES, "schedule.simulate at its op limit",
         "from gpuknap import schedule; m = schedule.MAX_OPS // 16\n"
         "schedule.simulate([[1.0]] * 8, [[2.0]] * 8, m)"),
    fast(SIZES, "schedule.simulate interleaved at its op limit",
         "from gpuknap import schedule; m = schedule.MAX_OPS // 32 // 4 * 4\n"
         "schedule.simulate([[1.0, 1.0]] * 4, [[2.0, 2.0]] * 4, m, 'interleaved')"),
    fast(SIZES, "iteration_times(8 stages, M=1e6)",
         "import numpy as np; from gpuknap import schedule\n"
         "schedule.iteration_times(np.ones((1, 8, 1)), np.ones((1, 8, 1)), 10**6)"),
    fast(SIZES, "iteration_times(8 stages, M=1e7)",
         "import numpy as np; from gpuknap import schedule\n"
         "schedule.iteration_times(np.ones((1, 8, 1)), np.ones((1, 8, 1)), 10**7)"),
    fast(SIZES, "in_flight_table(8, 1, 1e7)",
         "from gpuknap import schedule; schedule.in_flight_table(8, 1, 10**7)"),
    fast(SIZES, "order('1f1b', 8, 1, 1e7)", "from gpuknap import schedule; schedule.order('1f1b', 8, 1, 10**7)"),
    fast(SIZES, "sequence('interleaved', 4, 64, 1e6)",
         "from gpuknap import schedule; schedule.sequence('interleaved', 4, 64, 10**6)"),
    fast(SIZES, "levels('1f1b', 1000, 1, 1e6)", "from gpuknap import schedule; schedule.levels('1f1b', 1000, 1, 10**6)"),
    cli(SIZES, "rank --from a 10 MB file", ["rank", DEMO, "--from", "{T}/big.sh"], ["{T}/big.sh", "bytes"],
        "w('big.sh', '--num-layers 96 ' * (10 * 2**20 // 14))"),
    cli(SIZES, "rank --from a 10 MB single line", ["rank", DEMO, "--from", "{T}/big.sh"], ["{T}/big.sh"],
        "w('big.sh', '\"' + 'a' * (10 * 2**20))"),
    cli(SIZES, "sweep grid of a million configurations", ["sweep", LLAMA, "--gpus", "8", "--global-batch", "8",
                                                          "--stages", ",".join(str(i) for i in range(1, 1001)),
                                                          "--tp", ",".join(str(i) for i in range(1, 1001))],
        ["configurations"]),
    cli(SIZES, "sweep whose micro-batches are over the schedule limit", ["sweep", LLAMA, "--gpus", "8",
                                                                         "--global-batch", "400000", "--stages", "8"],
        ["schedule operations"]),
    cli(SIZES, "spec transformer.layers 2,000,000", ["best", "{T}/s.json"], ["transformer.layers"],
        "d = json.load(open(DEMO_T)); d['transformer']['layers'] = 2_000_000; w('s.json', json.dumps(d))"),
    cli(SIZES, "SAPP profile nb_layer 2,000,000", ["best", "{T}/p.json", "--capacity", "56000MB", "--micro-batches",
                                                   "32", "--stages", "4"], ["nb_layer"],
        "d = json.load(open(os.path.join(EX, 'sapp_ppb_demo.json')))\n"
        "d['layers_description'][1]['nb_layer'] = 2_000_000; w('p.json', json.dumps(d))"),
    cli(SIZES, "curve --points 10**8", ["curve", DEMO, "--stage", "0", "--points", "100000000"], ["--points"]),
    # --- silent misreads --------------------------------------------------------------------------
    *[cli(MISREAD, f"HF typo {typo}", ["best", "{T}/c.json", *RUN], [repr(typo)],
          f"d = cfg({base!r}); d[{typo!r}] = 1; w('c.json', json.dumps(d))")
      for typo, base in (("num_key_value_head", "llama2_7b_config.json"),
                         ("first_k_dense_replac", "deepseek_v3_config.json"),
                         ("moe_layer_frq", "deepseek_v3_config.json"), ("decoder_sparse_stp", "qwen2_7b_config.json"),
                         ("n_shared_expert", "deepseek_v3_config.json"), ("q_lora_rnk", "deepseek_v3_config.json"),
                         ("head_dm", "mixtral_8x7b_config.json"))],
    cli(MISREAD, "n_shared_experts ''", ["best", "{T}/c.json", *RUN], ["n_shared_experts"],
        moe("n_shared_experts", "", "deepseek_v3_config.json")),
    cli(MISREAD, "n_shared_experts false", ["best", "{T}/c.json", *RUN], ["n_shared_experts"],
        moe("n_shared_experts", False, "deepseek_v3_config.json")),
    cli(MISREAD, "model_type llama with Mixtral's class", ["best", "{T}/c.json", *RUN], ["architectures"],
        moe("model_type", "llama")),
    cli(MISREAD, "first_k_dense_replace over the layers", ["best", "{T}/c.json", *RUN], ["first_k_dense_replace"],
        moe("first_k_dense_replace", 1000, "deepseek_v3_config.json")),
    cli(MISREAD, "duplicate JSON key", ["best", "{T}/c.json", *RUN], ["twice"],
        "t = json.dumps(cfg('llama2_7b_config.json')); w('c.json', t[:-1] + ', \"hidden_size\": 8192}')"),
    cli(MISREAD, "MoE hidden % heads", ["best", "{T}/c.json", *RUN], ["hidden_size"], moe("hidden_size", 4097)),
    cli(MISREAD, "MoE KV heads not dividing the heads", ["best", "{T}/c.json", *RUN, "--stages", "4", "--dp", "1"],
        ["num_key_value_heads"], moe("num_key_value_heads", 6)),
    cli(MISREAD, "--recompute-method blocky", ["rank", DEMO, "--from", "{T}/m.sh"], ["blocky"],
        f"w('m.sh', {MEG!r} + '--recompute-granularity full --recompute-method blocky --recompute-num-layers 2\\n')"),
    cli(MISREAD, "--num-layers 20 against a 96-layer layout", ["rank", DEMO, "--from", "{T}/m.sh"], ["--num-layers"],
        "w('m.sh', \"--num-layers 20\\n--pipeline-model-parallel-size 2\\n"
        "--pipeline-model-parallel-layout 'Et*48|t*48L'\\n\")"),
    cli(MISREAD, "pp_interleave_nun", ["rank", DEMO, "--from", "{T}/m.yaml"], ["pp_interleave_nun"],
        "w('m.yaml', 'parallel_config: {pipeline_stage: 2, micro_batch_num: 32}\\n"
        "model: {model_config: {num_layers: 96, offset: [0, 0], pp_interleave_nun: 2}}\\n')"),
    cli(MISREAD, "--counts ''", ["timeline", DEMO, "--counts", ""], ["--counts"]),
    cli(MISREAD, "sweep --tp 3 on a 64-head model", ["sweep", LLAMA, "--gpus", "24", "--global-batch", "24",
                                                      "--tp", "3"], ["tensor_parallel"]),
    # --- ignored or duplicated keys ---------------------------------------------------------------
    cli(IGNORED, "--recompute-granularty", ["rank", DEMO, "--from", "{T}/m.sh"], ["--recompute-granularty"],
        f"w('m.sh', {MEG!r} + '--recompute-granularty full\\n')"),
    *[cli(IGNORED, f"MindFormers {key}", ["rank", DEMO, "--from", "{T}/m.yaml"], [key], setup)
      for key, setup in (
          ("select_recompte", "w('m.yaml', 'parallel_config: {pipeline_stage: 2, micro_batch_num: 32}\\n"
                              "recompute_config: {select_recompte: [0, 0]}\\n"
                              "model: {model_config: {num_layers: 96, offset: [0, 0]}}\\n')"),
          ("offest", "w('m.yaml', 'parallel_config: {pipeline_stage: 2, micro_batch_num: 32}\\n"
                     "model: {model_config: {num_layers: 96, offest: [0, 0]}}\\n')"),
          ("recompute_confg", "w('m.yaml', 'parallel_config: {pipeline_stage: 2, micro_batch_num: 32}\\n"
                              "recompute_confg: {recompute: [0, 0]}\\n"
                              "model: {model_config: {num_layers: 96, offset: [0, 0]}}\\n')"))],
    cli(IGNORED, "Megatron flag twice", ["rank", DEMO, "--from", "{T}/m.sh"], ["twice"],
        f"w('m.sh', {MEG!r} + '--micro-batch-size 1\\n--micro-batch-size 2\\n')"),
    cli(IGNORED, "MindFormers YAML key twice", ["rank", DEMO, "--from", "{T}/m.yaml"], ["twice"],
        f"w('m.yaml', {MF!r} + 'parallel_config: {{pipeline_stage: 4}}\\n')"),
    cli(IGNORED, "--stages 4 with --counts 49,49", ["timeline", DEMO, "--stages", "4", "--counts", "49,49"],
        ["--stages"]),
    # --- wrong exit codes / valid input refused ---------------------------------------------------
    cli(EXIT, "sweep: every configuration invalid", ["sweep", LLAMA, "--gpus", "48", "--global-batch", "48", "--tp",
                                                     "3"], ["configuration"]),
    ok(EXIT, "torchrun script with continuations", ["rank", DEMO, "--from", "{T}/run.sh", "--quiet"],
       "w('run.sh', '#!/bin/bash\\ntorchrun --nproc_per_node 8 pretrain_gpt.py \\\\\\n    --num-layers 96 \\\\\\n"
       "    --pipeline-model-parallel-size 2 \\\\\\n    --pipeline-model-parallel-layout \"Et*48|t*48L\" \\\\\\n"
       "    --micro-batch-size 1\\n')"),
    ok(EXIT, "MindFormers YAML whose comment names the layout flag", ["rank", DEMO, "--from", "{T}/m.yaml", "--quiet"],
       f"w('m.yaml', '# unlike Megatron (--pipeline-model-parallel-layout), offsets here\\n' + {MF!r})"),
    ok(EXIT, "MindFormers YAML with a flag in a string", ["rank", DEMO, "--from", "{T}/m.yaml", "--quiet"],
       f"w('m.yaml', {MF!r} + 'trainer: {{note: \"ported from --pipeline-model-parallel-size 2\"}}\\n')"),
    # --- messages --------------------------------------------------------------------------------
    cli(MESSAGES, "HF hidden_size 10**30 named as the file's field", ["best", "{T}/c.json", *RUN], ["hidden_size"],
        moe("hidden_size", 10**30, "llama2_7b_config.json")),
    cli(MESSAGES, "HF intermediate_size 10**30", ["best", "{T}/c.json", *RUN], ["intermediate_size"],
        moe("intermediate_size", 10**30, "llama2_7b_config.json")),
    cli(MESSAGES, "HF vocab_size 10**12", ["best", "{T}/c.json", *RUN], ["vocab_size"],
        moe("vocab_size", 10**12, "llama2_7b_config.json")),
    cli(MESSAGES, "HF num_hidden_layers 2,000,000 dense", ["best", "{T}/c.json", *RUN], ["num_hidden_layers"],
        moe("num_hidden_layers", 2_000_000, "llama2_7b_config.json")),
    cli(MESSAGES, "Megatron file without the layout flag", ["rank", DEMO, "--from", "{T}/m.sh"],
        ["--pipeline-model-parallel-layout"], "w('m.sh', '--num-layers 96\\n--pipeline-model-parallel-size 2\\n')"),
    cli(MESSAGES, "Megatron JSON-looking file without the layout flag", ["rank", DEMO, "--from", "{T}/m.json"],
        ["--pipeline-model-parallel-layout"],
        "w('m.json', '{\\n--num-layers 96\\n--pipeline-model-parallel-size 2\\n')"),
    cli(MESSAGES, "non-Dask server at --scheduler", ["sweep", LLAMA, "--gpus", "8", "--global-batch", "8",
                                                     "--scheduler", "tcp://127.0.0.1:{PORT}"], ["--scheduler"]),
    cli(MESSAGES, "--scheduler 'foo bar'", ["sweep", LLAMA, "--gpus", "8", "--global-batch", "8", "--scheduler",
                                            "foo bar"], ["--scheduler"]),
    cli(MESSAGES, "--scheduler closed port", ["sweep", LLAMA, "--gpus", "8", "--global-batch", "8", "--scheduler",
                                              "tcp://127.0.0.1:1"], ["--scheduler"]),
    # --- the public API ---------------------------------------------------------------------------
    api(API, "simulate([[]],[[]],4,'interleaved')",
        "from gpuknap import schedule; schedule.simulate([[]], [[]], 4, 'interleaved')", ["forward"]),
    api(API, "simulate([],[],4)", "from gpuknap import schedule; schedule.simulate([], [], 4)", ["forward"]),
    api(API, "simulate 'x' times", "from gpuknap import schedule; schedule.simulate('ab', 'ab', 4)", ["forward"]),
    api(API, "simulate micro_batches 1e30",
        "from gpuknap import schedule; schedule.simulate([[1]], [[1]], 10**30)", ["micro_batches"]),
    api(API, "simulate group 0 interleaved",
        "from gpuknap import schedule; schedule.simulate([[1, 1]] * 2, [[1, 1]] * 2, 4, 'interleaved', group=0)",
        ["group"]),
    api(API, "parse_layout(stages=0)", "from gpuknap.formats import megatron; megatron.parse_layout('Et|tL', stages=0)",
        ["stages"]),
    api(API, "parse_layout(None)", "from gpuknap.formats import megatron; megatron.parse_layout(None)", ["layout"]),
    api(API, "parse_layout('t*99999999999')", "from gpuknap.formats import megatron; megatron.parse_layout('t*99999999999')",
        ["layout"]),
    api(API, "iteration_times(M=0)", "import numpy as np; from gpuknap import schedule\n"
        "schedule.iteration_times(np.ones((1, 2, 1)), np.ones((1, 2, 1)), 0)", ["micro_batches"]),
    api(API, "iteration_times(M=2.5)", "import numpy as np; from gpuknap import schedule\n"
        "schedule.iteration_times(np.ones((1, 2, 1)), np.ones((1, 2, 1)), 2.5)", ["micro_batches"]),
    api(API, "iteration_times NaN", "import numpy as np; from gpuknap import schedule\n"
        "schedule.iteration_times(np.full((1, 2, 1), np.nan), np.ones((1, 2, 1)), 4)", ["forward"]),
    api(API, "iteration_times negative", "import numpy as np; from gpuknap import schedule\n"
        "schedule.iteration_times(np.ones((1, 2, 1)), -np.ones((1, 2, 1)), 4)", ["backward"]),
    api(API, "iteration_times p2p NaN", "import numpy as np; from gpuknap import schedule\n"
        "schedule.iteration_times(np.ones((1, 2, 1)), np.ones((1, 2, 1)), 4, p2p=float('nan'))", ["p2p"]),
    api(API, "iteration_times strings", "from gpuknap import schedule\n"
        "schedule.iteration_times([[['a']]], [[['b']]], 4)", ["forward"]),
    api(API, "iteration_times zero chunks", "import numpy as np; from gpuknap import schedule\n"
        "schedule.iteration_times(np.ones((1, 2, 0)), np.ones((1, 2, 0)), 4)", ["forward"]),
    api(API, "sweep callable returning None",
        "from gpuknap.sweep import sweep; sweep(lambda c: None, {'stages': [2]}, gpus=2, global_batch=8)",
        ["source"]),
    api(API, "sweep callable failing for every configuration",
        "from gpuknap.sweep import sweep\ndef src(c):\n    raise ValueError('no such model')\n"
        "sweep(src, {'stages': [1, 2]}, gpus=2, global_batch=8)", ["no such model"]),
    api(API, "sweep callable raising KeyError",
        "from gpuknap.sweep import sweep\ndef src(c):\n    return c['nope']\n"
        "sweep(src, {'stages': [1, 2]}, gpus=2, global_batch=8)", ["source"]),
    api(API, "sweep model M=32 in a config with M=64",
        "from gpuknap.sweep import sweep; from gpuknap.formats import load_spec\n"
        "m = load_spec(DEMO, micro_batches=32).model\n"
        "sweep(lambda c: m, {'stages': [2]}, gpus=2, global_batch=64)", ["micro_batches", "32", "64"]),
    api(API, "sweep dict as a grid value", "from gpuknap.sweep import sweep\n"
        "sweep(DEMO_T, {'stages': {2: 1, 4: 1}}, gpus=8, global_batch=8)", ["stages"]),
    api(API, "sweep dict inside a grid list", "from gpuknap.sweep import sweep\n"
        "sweep(DEMO_T, {'stages': [{2: 1}]}, gpus=8, global_batch=8)", ["stages"]),
    api(API, "sweep unknown grid key", "from gpuknap.sweep import sweep\n"
        "sweep(DEMO_T, {'stage': [2]}, gpus=8, global_batch=8)", ["stage", "stages"]),
    api(API, "best_splits exclusive unknown names",
        "from gpuknap import best_splits; from gpuknap.formats import load_spec\n"
        "best_splits(load_spec(DEMO).model, 16, exclusive=[('SLCT', 'COMMS')])", ["COMMS", "COMM"]),
    api(API, "best_splits exclusive not pairs",
        "from gpuknap import best_splits; from gpuknap.formats import load_spec\n"
        "best_splits(load_spec(DEMO).model, 16, exclusive=['SLCT'])", ["exclusive"]),
    fast(API, "best_splits exclusive as a generator is honoured",
         "from gpuknap import best_splits; from gpuknap.formats import load_spec\nmodel = load_spec(DEMO).model\n"
         "a = best_splits(model, 16, exclusive=[('SLCT', 'COMM')])\n"
         "b = best_splits(model, 16, exclusive=(p for p in [('SLCT', 'COMM')]))\n"
         "assert [r[:2] for r in a] == [r[:2] for r in b], 'generator dropped'"),
    api(API, "mindformers.load of a missing file", "from gpuknap.formats import mindformers_read as m\n"
        "m.load('/nonexistent.yaml')", ["/nonexistent.yaml"]),
    api(API, "megatron.load(None)", "from gpuknap.formats import megatron; megatron.load(None)", ["path"]),
    api(API, "buckets_up(1, 2.2e-308) via a front", "from gpuknap import choose, LayerOption, Layers\n"
        "o = LayerOption('a', 1e10, 1, 1)\nchoose([Layers('a', 3, 1)], {'a': [o]}, 1e12, bucket=2.2e-308)", ["bucket"]),
    # --- traps (part 1, checked again) ----------------------------------------------------------
    cli(TRAPS, "--capacity 80", ["best", DEMO, "--capacity", "80"], ["--capacity", "80GiB"]),
    cli(TRAPS, "--capacity 80gb", ["best", DEMO, "--capacity", "80gb"], ["--capacity", "80GiB"]),
    cli(TRAPS, "--pp", ["best", DEMO, "--pp", "4"], ["--stages"]),
    cli(TRAPS, "--pipeline-parallel", ["best", DEMO, "--pipeline-parallel", "4"], ["--stages"]),
    # --- other --------------------------------------------------------------------------------
    ok(OTHER, "--backend numba", ["best", DEMO, "--backend", "numba", "--quiet"]),
]


def _server() -> int:
    """A TCP server that is not Dask: it answers every connection with an HTTP page."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)

    def serve() -> None:
        while True:
            conn, _ = sock.accept()
            try:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello" * 4)
            except OSError:
                pass
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock.getsockname()[1]


def child(probe: dict) -> dict:
    """Run one probe here (in the child) and describe what happened."""
    import contextlib
    import io
    import traceback
    T = tempfile.mkdtemp()
    env = {"T": T, "EX": EX, "DEMO": DEMO, "DEMO_T": LLAMA}
    exec(PRELUDE + probe["setup"], env)
    out = {"rc": None, "err": "", "exc": None, "msg": "", "seconds": 0.0}
    start = time.perf_counter()
    if probe["kind"] in ("cli", "ok"):
        from gpuknap.cli import main
        err, std = io.StringIO(), io.StringIO()
        argv = [a.replace("{T}", T) for a in probe["argv"]]
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
            try:
                out["rc"] = main(argv)
            except BaseException as exc:  # noqa: BLE001 - a red team reports everything
                out["exc"], out["msg"] = type(exc).__name__, traceback.format_exc()[-600:]
        out["err"] = err.getvalue()
    else:
        try:
            exec(probe["code"], env)
        except BaseException as exc:  # noqa: BLE001
            out["exc"], out["msg"] = type(exc).__name__, str(exc)[:600]
            if not isinstance(exc, ValueError):
                out["msg"] += "\n" + traceback.format_exc()[-600:]
    out["seconds"] = time.perf_counter() - start
    out["T"] = T
    return out


def judge(probe: dict, res: dict) -> str | None:
    """None when the probe passed, else why not."""
    words = [w.replace("{T}", res.get("T", "")) for w in probe["words"]]
    if res.get("killed"):
        return res["killed"]
    if res["seconds"] > SECONDS:
        return f"took {res['seconds']:.1f} s"
    kind = probe["kind"]
    if kind in ("cli", "ok") and res["exc"]:
        return f"raised {res['exc']}: {res['msg'][-300:]}"
    if kind == "ok":  # read: a plan scored (0) or said infeasible in words (1)
        return None if res["rc"] in ((0,) if "backend" in probe["name"] else (0, 1)) else f"exit {res['rc']}: {res['err'][-300:]}"
    if kind == "cli":
        lines = res["err"].strip().splitlines()
        if res["rc"] != 2:
            return f"exit {res['rc']}: {res['err'][-300:]}"
        if len(lines) != 1 or "Traceback" in res["err"]:
            return f"{len(lines)} lines: {res['err'][-300:]}"
        missing = [w for w in words if w not in lines[0]]
        return f"message lacks {missing}: {lines[0][:300]}" if missing else None
    if kind == "fast":
        if res["exc"] and res["exc"] != "ValueError":
            return f"raised {res['exc']}: {res['msg'][-300:]}"
        return None
    if res["exc"] != "ValueError":
        return f"{'no error' if res['exc'] is None else 'raised ' + res['exc']}: {res['msg'][-300:]}"
    missing = [w for w in words if w not in res["msg"]]
    return f"message lacks {missing}: {res['msg'][:300]}" if missing else None


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def run(probe: dict, port: int) -> tuple[dict, float]:
    probe = dict(probe, argv=[a.replace("{PORT}", str(port)) for a in probe.get("argv", [])])
    env = {**os.environ, "PYTHONPATH": ROOT, "GPUKNAP_BACKEND": "numpy", "OPENBLAS_NUM_THREADS": "1"}
    if probe["name"] == "--backend numba":
        env.pop("GPUKNAP_BACKEND")
    start = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--child", json.dumps(probe)], capture_output=True, text=True,
                           env=env, timeout=3 * SECONDS, preexec_fn=_limits)
    except subprocess.TimeoutExpired:
        return {"killed": f"killed after {3 * SECONDS:.0f} s"}, time.perf_counter() - start
    wall = time.perf_counter() - start
    last = p.stdout.strip().splitlines()[-1:] or [""]
    try:
        return json.loads(last[0]), wall
    except json.JSONDecodeError:
        return {"killed": f"child died (rc {p.returncode}): {p.stderr[-300:]}"}, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child")
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    port = _server()
    counts: dict[str, list[int]] = {}
    for probe in PROBES:
        if not any(k in (probe["cls"] + " " + probe["name"]).lower() for k in args.k.lower().split("|")):
            continue
        res, wall = run(probe, port)
        why = judge(probe, res)
        tally = counts.setdefault(probe["cls"], [0, 0])
        tally[0] += 1
        tally[1] += why is not None
        seconds = res.get("seconds", wall)
        print(f"{'FAIL' if why else 'ok  '} [{probe['cls']}] {probe['name']} ({seconds:.2f} s)"
              + (f"\n      {why}" if why else ""), flush=True)
    print("\nper class (failing / tried):")
    for cls, (tried, failed) in counts.items():
        print(f"  {cls:14} {failed} / {tried}")
    total = sum(f for _, f in counts.values())
    print(f"  {'total':14} {total} / {sum(t for t, _ in counts.values())}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
