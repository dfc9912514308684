"""The cost model's Python entry points, as search drivers call them: NumPy scalars read as the
numbers they hold, and ``build`` refusing the parallel sizes Megatron refuses, as the
config.json path does (an API red team found both missing)."""
from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

import gpuknap
import gpuknap.costs as C
from gpuknap.formats import hf
from paths import EXAMPLES

A = dict(layers=4, hidden=1024, heads=16, vocab=32000, ffn=4096)
H100 = C.device("h100")


def test_numpy_scalars_read_as_python_numbers():
    assert C.Training(seq=np.int64(4096), tensor_parallel=np.int32(2), param_bytes=np.float32(6.0)) == \
        C.Training(seq=4096, tensor_parallel=2)
    assert C.device("h100", gpus_per_node=np.int64(4), efficiency=np.float64(0.5)) == \
        C.device("h100", gpus_per_node=4, efficiency=0.5)
    assert C.Architecture(layers=np.int64(4), hidden=np.int16(1024), heads=16, ffn=4096) == \
        C.Architecture(layers=4, hidden=1024, heads=16, ffn=4096)
    assert C.Experts(np.int64(8), np.uint8(2), 1024) == C.Experts(8, 2, 1024)
    assert C.gpt(4, 1024, 16, seq=np.int64(1024)) == C.gpt(4, 1024, 16, seq=1024)
    for bad in (np.bool_(True), np.float64(4096.5), np.int64(0)):
        with pytest.raises(ValueError, match="training.seq must be an integer"):
            C.Training(seq=bad)
    demo = os.path.join(EXAMPLES, "demo.json")
    a, b = gpuknap.load_spec(demo, stages=np.int64(4), capacity=np.int64(2**36)), gpuknap.load_spec(
        demo, stages=4, capacity=2**36)
    assert (a.stages, a.model.capacity) == (b.stages, b.model.capacity)
    llama = os.path.join(EXAMPLES, "llama2_70b.json")
    kw = dict(gpus=64, global_batch=256, top=2)
    rows = gpuknap.sweep(llama, {"stages": [2, 4]}, **kw).rows
    typed = gpuknap.sweep(llama, {"stages": [2, 4]}, gpus=np.int64(64), global_batch=np.int32(256), top=np.int64(2),
                          time_unit=np.float32(1e-3)).rows
    assert json.dumps(typed) == json.dumps(rows)
    with pytest.raises(ValueError, match="shards must be an integer >= 1, got 0"):
        gpuknap.sweep(llama, {"stages": [2]}, gpus=64, global_batch=256, shards=0)


def test_build_refuses_what_megatron_refuses():
    moe = C.Architecture(**A, experts=C.Experts(8, 2, 1024), moe_layers=(False, True, True, False))
    cases = [(C.Architecture(**A), C.Training(seq=256, tensor_parallel=3), "tensor_parallel=3 does not divide arch.heads=16"),
             (moe, C.Training(seq=256, expert_parallel=16, data_parallel=16), "expert_parallel=16 does not divide"),
             (moe, C.Training(seq=256, expert_parallel=3, data_parallel=3), "expert_parallel=3 does not divide"),
             (C.Architecture(**A), C.Training(seq=256, expert_parallel=2, data_parallel=2), "MoE models only"),
             (moe, C.Training(seq=256, expert_parallel=4, data_parallel=2), "must divide the 2 ranks"),
             (C.Architecture(**A), C.Training(seq=250, tensor_parallel=4), "not divisible by the tensor-parallel")]
    for arch, tr, words in cases:
        with pytest.raises(ValueError, match=words):
            C.build(arch, tr, H100, 80 * 2**30, 4, 0)
    for args, name in (((dict(A), C.Training(seq=256), H100), "arch"), ((C.Architecture(**A), None, H100), "tr"),
                       ((C.Architecture(**A), C.Training(seq=256), None), "device")):
        with pytest.raises(ValueError, match=f"^{name} must be a gpuknap.costs"):
            C.build(*args, 8e10, 4, 0)
    config = C.gpt(4, 1024, 16)
    assert C.transformer_model(config, 8e10, 8, dev="h100") == C.transformer_model(config, 8e10, 8, dev=H100)
    with pytest.raises(ValueError, match="^c must be a gpuknap.costs.TransformerConfig"):
        C.transformer_model(dict(layers=4), 8e10, 8)


def test_build_accepts_exactly_what_the_config_json_path_accepts():
    """The independent rule set of the Hugging Face reader (``hf.check_parallel``) against ``build``'s,
    over a grid of sizes on a MoE config: one refuses exactly where the other does."""
    with open(os.path.join(EXAMPLES, "mixtral_small_config.json")) as f:
        data = json.load(f)
    arch = hf.architecture(data, "mixtral")
    for tp, ep, etp, dp, seq in itertools.product((1, 2, 3, 4, 8), (1, 2, 3, 4, 8), (None, 1, 2, 3), (1, 2, 4, 6),
                                                  (256, 250)):
        try:
            tr = C.Training(seq=seq, tensor_parallel=tp, expert_parallel=ep, expert_tensor_parallel=etp,
                            data_parallel=dp)
        except ValueError:
            continue
        refused = []
        for check in (lambda: hf.check_parallel(arch, tr, "x", data["model_type"]), lambda: C.check_run(arch, tr, H100)):
            try:
                check()
                refused.append(False)
            except ValueError:
                refused.append(True)
        assert refused[0] == refused[1], (tp, ep, etp, dp, seq, refused)
