"""What a config says that the plan does not follow is said in a note, never silently (an HF
red team, 2026-12-03): a sequence past the positions its RoPE reaches, weights published
quantized, an inference engine's dual-chunk attention, attention dropout.  Each case is checked both ways (the note appears exactly when the
field asks for it), through ``load_spec`` and as ``note:`` lines of the command line."""
from __future__ import annotations

import json

import pytest

from gpuknap.cli import main
from gpuknap.formats import load_spec

#: A small Llama-shaped config (SmolLM2-135M's sizes).
BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "head_dim": 64, "hidden_size": 576,
        "intermediate_size": 1536, "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
        "tie_word_embeddings": True, "vocab_size": 49152, "max_position_embeddings": 8192}
#: Qwen2.5's YaRN: a 32k window stretched four times (the published long-context recipe).
YARN = {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        "max_position_embeddings": 32768}


def _notes(tmp_path, config: dict, seq: int) -> tuple:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return load_spec(path, micro_batches=4, seq=seq).notes


@pytest.mark.parametrize("extra, seq, words", [
    ({}, 8192, None),
    ({}, 8193, ["8,193", "8,192 positions"]),
    (YARN, 131072, None),  # 4 x 32768: within the stretched window
    (YARN, 131073, ["131,072 positions"]),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
      "max_position_embeddings": 131072}, 131072, None),  # Llama 3.1: the field is the stretched length
    ({"max_position_embeddings": None}, 10**6, None),
])
def test_a_seq_past_the_models_positions_is_noted(tmp_path, extra, seq, words):
    notes = _notes(tmp_path, {**BASE, **extra}, seq)
    if words is None:
        assert notes == ()
    else:
        assert len(notes) == 1 and all(w in notes[0] for w in words), notes


@pytest.mark.parametrize("quant, words", [
    ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, ["fp8-quantized", "bf16 training"]),
    ({"quant_method": "mxfp4"}, ["mxfp4-quantized"]),
    ({"quant_method": "weird name; rm -rf"}, ["published quantized"]),
])
def test_quantized_weights_are_noted(tmp_path, quant, words):
    notes = _notes(tmp_path, {**BASE, "quantization_config": quant}, 4096)
    assert len(notes) == 1 and all(w in notes[0] for w in words), notes


@pytest.mark.parametrize("dropout, noted", [(0.0, False), (0.1, True)])
def test_attention_dropout_is_read_and_noted(tmp_path, dropout, noted):
    notes = _notes(tmp_path, {**BASE, "attention_dropout": dropout}, 4096)
    assert (len(notes) == 1 and "attention_dropout 0.1" in notes[0] and "memory is unchanged" in notes[0]) if noted \
        else notes == ()


#: Qwen2.5-7B-Instruct-1M's dual-chunk attention (read by vLLM and SGLang, not by transformers).
DUAL_CHUNK = {"chunk_size": 262144, "local_size": 8192, "original_max_position_embeddings": 262144}


def test_dual_chunk_attention_is_noted_and_leaves_the_plan_as_full_attention(tmp_path):
    qwen2 = {key: value for key, value in BASE.items() if key != "head_dim"}
    qwen2.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    assert _notes(tmp_path, qwen2, 4096) == ()
    plain = load_spec(tmp_path / "config.json", micro_batches=4, seq=4096)
    notes = _notes(tmp_path, {**qwen2, "dual_chunk_attention_config": DUAL_CHUNK}, 4096)
    assert len(notes) == 1 and "dual-chunk attention" in notes[0] and "full causal attention" in notes[0], notes
    chunked = load_spec(tmp_path / "config.json", micro_batches=4, seq=4096)
    assert chunked.model == plain.model and (chunked.stages, chunked.in_flight) == (plain.stages, plain.in_flight)
    for bad in ([1], "yes", 262144):
        with pytest.raises(ValueError, match=r"dual_chunk_attention_config: expected a mapping"):
            _notes(tmp_path, {**qwen2, "dual_chunk_attention_config": bad}, 4096)
    with pytest.raises(ValueError, match=r"did you mean 'dual_chunk_attention_config'"):
        _notes(tmp_path, {**qwen2, "dual_chunk_attention_confg": DUAL_CHUNK}, 4096)
    with pytest.raises(ValueError, match=r"unknown field 'dual_chunk_attention_config' \(a field of qwen2"):
        _notes(tmp_path, {**BASE, "dual_chunk_attention_config": DUAL_CHUNK}, 4096)  # Llama has none


def test_the_notes_reach_the_command_line_and_the_sweep(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, "quantization_config": {"quant_method": "fp8"}}))
    common = ["--seq", "16384", "--device", "h100", "--quiet"]
    assert main(["best", str(path), "--stages", "2", "--micro-batches", "4", "--dp", "1", *common]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert any("16,384" in line for line in err) and any("fp8-quantized" in line for line in err), err
    assert main(["sweep", str(path), "--gpus", "4", "--global-batch", "8", "--stages", "1,2", "--tp", "1,2",
                 *common]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert any("16,384" in line for line in err) and any("fp8-quantized" in line for line in err), err
