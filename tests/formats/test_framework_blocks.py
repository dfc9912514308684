"""Emitted settings run as planned: every block ``best --emit`` prints passes Megatron's or MindFormers'
rules as written in their sources (framework_rules.py), lays the layers out, stage by stage and layer
by layer, exactly as the framework-constrained plan says, and states every size the plan assumed.

Cases: dense (Llama), MoE (Mixtral-style), DeepSeek-style (dense and MoE layers with an MTP layer) and
the SAPP-PPB demo, each plain and interleaved (v = 2).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml
from framework_rules import megatron_args, megatron_layers, megatron_validate, mindformers_layers
from paths import EXAMPLES

from gpuknap.cli import main
from gpuknap.formats import load_spec, megatron, mindformers, mtp_layers
from gpuknap.schedule import chunk_times, iteration_times
from gpuknap.search import best_on_split, best_splits, constrained_splits, with_grouped

TIGHT = ["--stages", "4", "--micro-batches", "32", "--seq", "8192", "--micro-batch-size", "4", "--tp", "8"]
CASES = {
    "dense": ("llama2_7b_config.json", ["--capacity", "16GiB", *TIGHT]),
    "moe": ("mixtral_small_config.json", ["--capacity", "12GiB", *TIGHT]),
    "deepseek-mtp": ("deepseek_v3_small_config.json", ["--capacity", "12GiB", *TIGHT]),
    "sapp": ("sapp_ppb_demo.json", ["--capacity", "100GB", "--stages", "8", "--micro-batches", "32"]),
}


def spec_args(argv: list) -> dict:
    kw = dict(zip(argv[::2], argv[1::2]))
    names = {"--capacity": "capacity", "--micro-batches": "micro_batches", "--stages": "stages", "--seq": "seq",
             "--micro-batch-size": "micro_batch", "--tp": "tensor_parallel"}
    return {names[k]: (v if k == "--capacity" else int(v)) for k, v in kw.items()}


@pytest.fixture
def case(request, tmp_path):
    config, argv = CASES[request.param]
    path = os.path.join(EXAMPLES, config)
    if request.param == "deepseek-mtp":  # the small DeepSeek-style config, with DeepSeek-V3's MTP layer
        data = json.load(open(path))
        data["num_nextn_predict_layers"] = 1
        path = str(tmp_path / "deepseek_mtp.json")
        json.dump(data, open(path, "w"))
    return path, argv


def emitted(capsys, path, argv, framework, chunks):
    rc = main(["best", path, *argv, "--emit", framework, "--interleave", str(chunks), "--quiet"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def planned(path, argv, framework, chunks, text=""):
    """The plan ``best --emit`` writes: the constrained search, its local search (interleaved, mixed
    kinds) also started from the unconstrained best split, as the command does; or, where the text
    says it emitted the even split, that split (decoder layers even, the remainder on the last
    virtual stages) with the framework's best settings on it, which must simulate faster."""
    spec = load_spec(path, **spec_args(argv))
    free = best_splits(spec.model, spec.stages, 1, "slowest", spec.bucket, "numpy", interleave=chunks)
    found = constrained_splits(spec.model, spec.stages, framework, 1, "slowest", spec.bucket, "numpy",
                               interleave=chunks, starts=[f[0] for f in free])
    counts, _, _, names, _ = found[0]
    if "emitted: the even split" in text:
        model, parts = spec.model, spec.stages * chunks
        head, tail = int(model.kinds[0] == "embedding"), int(model.kinds[-1] == "output")
        base, extra = divmod(model.layers - head - tail, parts)
        even = [base + (i >= parts - extra) for i in range(parts)]
        even[0] += head
        even[-1] += tail
        even_names = best_on_split(model, even, framework, chunks, None, spec.bucket)
        gm = with_grouped(model)

        def simulated(c, n):
            t = chunk_times(gm, c, n, chunks)
            fwd, bwd = np.asarray(t.forward, float)[None], np.asarray(t.backward, float)[None]
            return iteration_times(fwd, bwd, model.micro_batches, "interleaved")[0]

        assert simulated(even, even_names) < simulated(list(counts), names)
        counts, names = even, even_names
    return spec, list(counts), list(names)


@pytest.mark.parametrize("case", list(CASES), indirect=True)
@pytest.mark.parametrize("chunks", [1, 2])
def test_megatron_block_passes_megatrons_checks_and_runs_the_plan(case, chunks, capsys, tmp_path):
    path, argv = case
    text = emitted(capsys, path, argv, "megatron", chunks)
    spec, counts, names = planned(path, argv, "megatron", chunks, text)
    run = spec.model.costs.training if spec.model.costs is not None else None
    ns = megatron_args(text)
    world = run.tp * run.cp * run.dp * spec.stages if run is not None else spec.stages
    derived = megatron_validate(ns, world)
    assert megatron_layers(derived, spec.model) == (counts, names)  # the split, every layer's recompute
    assert derived["vpp"] == chunks and ns["--mtp-num-layers"] == (mtp_layers(path) or None)
    if run is not None:  # every size the plan assumed, in Megatron's spelling
        assert (derived["tp"], derived["cp"], derived["dp"]) == (run.tp, run.cp, run.dp)
        assert derived["sequence_parallel"] == (run.sequence_parallel and run.tp > 1)
        assert (ns["--micro-batch-size"], ns["--seq-length"], derived["micro_batches"]) == \
            (run.micro_batch, run.seq, spec.model.micro_batches)
        assert ns["--use-distributed-optimizer"] == run.distributed_optimizer
        if "moe" in spec.model.kind_order:
            assert (ns["--expert-model-parallel-size"], derived["etp"], ns["--moe-grouped-gemm"]) == \
                (run.ep, run.etp, True)
            assert ns["--moe-token-dispatcher-type"] == "alltoall"  # the dispatcher the costs run, not the default
    file = tmp_path / "run.sh"
    file.write_text(text)
    assert megatron.load(str(file)).split(spec.model) == (counts, names)  # gpuknap reads it back as planned


@pytest.mark.parametrize("case", list(CASES), indirect=True)
@pytest.mark.parametrize("chunks", [1, 2])
def test_mindformers_block_passes_its_checks_and_runs_the_plan(case, chunks, capsys, tmp_path):
    path, argv = case
    text = emitted(capsys, path, argv, "mindformers", chunks)
    spec, counts, names = planned(path, argv, "mindformers", chunks, text)
    cfg = yaml.safe_load(text)
    for mcore in (False, True):  # legacy models and mcore ones read the same block as planned
        assert mindformers_layers(cfg, spec.model, mcore) == (counts, names)
    pc, mc = cfg["parallel_config"], cfg["model"]["model_config"]
    assert (pc["pipeline_stage"], pc["micro_batch_num"]) == (spec.stages, spec.model.micro_batches)
    assert mc.get("mtp_depth", 0) == mtp_layers(path)
    if chunks > 1:
        assert cfg["parallel"]["pipeline_config"]["pipeline_interleave"] is True and mc["pp_interleave_num"] == 2
    run = spec.model.costs.training if spec.model.costs is not None else None
    if run is not None:
        assert (pc["data_parallel"], pc["model_parallel"], pc["context_parallel"]) == (run.dp, run.tp, run.cp)
        assert pc["use_seq_parallel"] == (run.sequence_parallel and run.tp > 1)
        assert (cfg["runner_config"]["batch_size"], mc["seq_length"]) == (run.micro_batch, run.seq)
        assert cfg["parallel"]["enable_parallel_optimizer"] == run.distributed_optimizer
        if "moe" in spec.model.kind_order:
            assert pc["expert_parallel"] == run.ep
    file = tmp_path / "mf.yaml"
    file.write_text(text)
    assert mindformers.load(str(file)).split(spec.model) == (counts, names)


@pytest.mark.parametrize("config, extra", [
    ("llama2_7b_config.json", ["--capacity", "80GiB", "--stages", "8", "--micro-batches", "32", "--seq", "4096",
                               "--tp", "8", "--dp", "2", "--micro-batch-size", "2"]),
    ("deepseek_v3_config.json", ["--capacity", "80GiB", "--stages", "16", "--micro-batches", "64", "--seq", "4096",
                                 "--tp", "4", "--ep", "64", "--etp", "1", "--dp", "16"]),
])
def test_shipped_configs_block_has_every_size_gpuknap_assumed(config, extra, capsys):
    """``gpuknap best CONFIG ... --emit megatron > run.sh`` states every parallel size, batch and sequence."""
    path = os.path.join(EXAMPLES, config)
    text = emitted(capsys, path, extra, "megatron", 1)
    ns = megatron_args(text)
    kw = dict(zip(extra[::2], extra[1::2]))
    tp, dp, stages = int(kw["--tp"]), int(kw["--dp"]), int(kw["--stages"])
    spec = load_spec(path, capacity="80GiB", micro_batches=int(kw["--micro-batches"]), stages=stages,
                     seq=int(kw["--seq"]), tensor_parallel=tp, data_parallel=dp,
                     expert_parallel=int(kw.get("--ep", 1)), micro_batch=int(kw.get("--micro-batch-size", 1)),
                     expert_tensor_parallel=int(kw["--etp"]) if "--etp" in kw else None)
    run = spec.model.costs.training
    derived = megatron_validate(ns, run.tp * run.cp * run.dp * stages)
    assert (ns["--tensor-model-parallel-size"], ns["--pipeline-model-parallel-size"], derived["dp"]) == (tp, stages, dp)
    assert ns["--context-parallel-size"] == run.cp and ns["--sequence-parallel"] == (run.tp > 1)
    assert ns["--micro-batch-size"] == run.micro_batch and ns["--seq-length"] == run.seq
    assert ns["--global-batch-size"] == spec.model.micro_batches * run.micro_batch * run.dp
    assert ns["--use-distributed-optimizer"] and ns["--num-layers"] == sum(k in ("dense", "moe")
                                                                            for k in spec.model.kinds)
    if "moe" in spec.model.kind_order:
        assert (ns["--expert-model-parallel-size"], ns["--expert-tensor-parallel-size"]) == (run.ep, run.etp)
        assert ns["--moe-grouped-gemm"] and ns["--moe-token-dispatcher-type"] == "alltoall"
    assert ns["--mtp-num-layers"] == (mtp_layers(path) or None)
    assert f"runs on {run.tp * run.cp * run.dp * stages} GPUs" in text
