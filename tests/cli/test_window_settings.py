"""Sliding-window attention in Megatron settings: a config's window of ``W`` keys is written as
``--window-size W-1,0`` (Megatron's mask lets query ``i`` see keys ``i - L`` to ``i + R``), and
``rank --from`` costs attention as the settings run it.  Each read-back is checked against the
same model built from a config that states that window directly (an independent route through
the Hugging Face reader), not against stored numbers."""
from __future__ import annotations

import json

import pytest

from gpuknap.cli import main

MISTRAL = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000, "sliding_window": 4096}
FLAGS = ["--seq", "32768", "--tp", "8", "--micro-batches", "16", "--capacity", "80GiB", "--dp", "1", "--quiet"]


def _config(tmp_path, name: str, **fields) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**MISTRAL, **fields}))
    return str(path)


def _emit(capsys, config: str) -> str:
    assert main(["best", config, "--stages", "4", "--emit", "megatron", *FLAGS]) == 0
    return capsys.readouterr().out


def _rank(capsys, config: str, script) -> dict:
    assert main(["rank", config, "--from", str(script), "--json", *FLAGS]) == 0
    return json.loads(capsys.readouterr().out)


def _stage_times(payload: dict) -> list:
    return [s["time"] for s in payload["best"]["stages"]]


def test_the_window_is_written_and_read_back_as_costed(capsys, tmp_path):
    config = _config(tmp_path, "mistral")
    text = _emit(capsys, config)
    assert "    --window-size 4095,0\n" in text
    script = tmp_path / "run.sh"
    script.write_text(text)
    got = _rank(capsys, config, script)
    assert not [n for n in got["notes"] if "window" in n]
    script.write_text(text.replace("--window-size 4095,0", "--window-size '(4095, 0)'"))
    assert _stage_times(_rank(capsys, config, script)) == _stage_times(got)


@pytest.mark.parametrize("flag, keys", [
    (None, None), ("--window-size=-1,0", None), ("--window-size=-1,-1", None), ("--window-size 2047,0", 2048),
    ("--window-size 8191,0", 8192), ("--window-size 2047,2047", 2048),  # Transformer Engine runs (L, R) as (L, 0)
    ("--window-size +2_047,0", 2048), ("--window-size '((2047, 0))'", 2048),  # Megatron's tuple_type: int() of each
    ("--window-size 999999999,0", None),  # longer than any sequence: the whole one
])
def test_rank_from_costs_the_window_the_settings_run(capsys, tmp_path, flag, keys):
    config = _config(tmp_path, "mistral")
    text = _emit(capsys, config)
    script = tmp_path / "run.sh"
    script.write_text(text.replace("--window-size 4095,0", flag or ""))
    got = _rank(capsys, config, script)
    # the same settings on a config stating that attention: the same stage times
    same = _config(tmp_path, "same", sliding_window=keys)
    script.write_text(text.replace("--window-size 4095,0", f"--window-size {keys - 1},0" if keys else ""))
    want = _rank(capsys, same, script)
    assert _stage_times(got) == _stage_times(want)
    assert not [n for n in want["notes"] if "window" in n]
    assert [n for n in got["notes"] if n.startswith("costed as the settings run attention")]
    # at --seq 32768 the config's 4096-key window is faster than a wider one or none, slower than a narrower one
    script.write_text(text)
    written = max(_stage_times(_rank(capsys, config, script)))
    assert (max(_stage_times(got)) > written) == (keys is None or keys > 4096)


def test_a_fragment_without_the_flag_keeps_the_config_window_and_says_so(capsys, tmp_path):
    config = _config(tmp_path, "mistral")
    script = tmp_path / "fragment.sh"
    script.write_text("--num-layers 32 --pipeline-model-parallel-size 4 "
                      "--pipeline-model-parallel-layout 'Et*8|t*8|t*8|t*8L'\n")
    got = _rank(capsys, config, script)
    assert [n for n in got["notes"] if "4096-token sliding window is costed" in n and "4095,0" in n]
    script.write_text(script.read_text() + "--window-size 4095,0\n")
    assert _stage_times(_rank(capsys, config, script)) == _stage_times(got)


def test_a_config_without_a_window_writes_none(capsys, tmp_path):
    text = _emit(capsys, _config(tmp_path, "plain", sliding_window=None))
    assert "\n    --window-size" not in text and "--window-size" in text  # only among the flags to remove


@pytest.mark.parametrize("flag, says", [
    ("--window-size 4095", "two integers"), ("--window-size=-1,5", "LEFT,0"), ("--window-size=-2,0", "LEFT,0"),
    ("--window-size a,b", "two integers"), ("--window-size 1,2,3", "two integers"),
    ("--window-size 4095,0 --window-attn-skip-freq 4", "does not model"),
    ("--window-size 4095,0 --cp-comm-type allgather", "not one of Transformer Engine's"),
])
def test_windows_gpuknap_cannot_cost_are_refused(capsys, tmp_path, flag, says):
    config = _config(tmp_path, "mistral")
    text = _emit(capsys, config)
    script = tmp_path / "run.sh"
    script.write_text(text.replace("--window-size 4095,0", flag))
    assert main(["rank", config, "--from", str(script), *FLAGS]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_a_window_on_a_spec_without_a_config_is_refused(capsys, tmp_path):
    from gpuknap.formats import load_spec

    spec = "gpuknap/examples/llama2_70b.json"  # a spec with a transformer section: no window to set
    script = tmp_path / "run.sh"
    script.write_text("--tensor-model-parallel-size 8 --use-distributed-optimizer --sequence-parallel --num-layers 80 "
                      "--pipeline-model-parallel-size 8 --micro-batch-size 1 --bf16 "
                      "--pipeline-model-parallel-layout 'Et*10|t*10|t*10|t*10|t*10|t*10|t*10|t*10L' "
                      "--window-size 1023,0\n")
    assert main(["rank", spec, "--from", str(script), "--quiet"]) == 2
    assert "costed only on a Hugging Face config" in capsys.readouterr().err
    script.write_text(script.read_text().replace(" --window-size 1023,0", ""))  # a whole run: full attention
    assert main(["rank", spec, "--from", str(script), "--quiet"]) in (0, 1)
    with pytest.raises(ValueError, match="window"):
        load_spec(spec, window=1024)


def test_a_quoted_tuple_inside_an_array_does_not_end_it(capsys, tmp_path):
    """Only an unquoted ``)`` ends a bash array: a quoted ``'(2047, 0)'`` on an inner line is a word."""
    config = _config(tmp_path, "mistral")
    text = _emit(capsys, config)
    script = tmp_path / "run.sh"
    lines = text.splitlines()
    at = lines.index("GPUKNAP_ARGS=(") + 1
    moved = [x for x in lines if "--window-size" not in x]
    moved.insert(at, "    --window-size '(2047, 0)'")
    script.write_text("\n".join(moved) + "\n")
    got = _rank(capsys, config, script)
    script.write_text(text.replace("--window-size 4095,0", "--window-size 2047,0"))
    assert _stage_times(got) == _stage_times(_rank(capsys, config, script))
    assert [n for n in got["notes"] if "a 2048-token window (--window-size 2047,0)" in n]


def _written_and_edited(capsys, tmp_path, flags: str) -> tuple:
    """The emitted Mistral settings ranked as written and with ``flags`` for their window flag:
    ``(config, text, script, as written, edited)``."""
    config = _config(tmp_path, "mistral")
    text = _emit(capsys, config)
    script = tmp_path / "run.sh"
    script.write_text(text)
    want = _rank(capsys, config, script)
    script.write_text(text.replace("--window-size 4095,0", flags))
    return config, text, script, want, _rank(capsys, config, script)


def test_skip_freq_without_a_window_changes_nothing(capsys, tmp_path):
    _, _, _, want, got = _written_and_edited(capsys, tmp_path, "--window-attn-skip-freq 4")
    assert max(_stage_times(got)) > max(_stage_times(want))  # the whole sequence, as Megatron runs it


CP = ["--seq", "32768", "--tp", "4", "--cp", "2", "--dp", "2", "--micro-batches", "16", "--capacity", "40GiB",
      "--quiet"]


def test_context_parallelism_with_a_window_needs_an_exchange_transformer_engine_takes(capsys, tmp_path):
    """Transformer Engine refuses a sliding window over p2p, Megatron's default --cp-comm-type."""
    config = _config(tmp_path, "mistral")
    assert main(["best", config, "--stages", "4", "--emit", "megatron", *CP]) == 0
    text = capsys.readouterr().out
    assert "    --cp-comm-type all_gather\n" in text and "Transformer Engine" in text
    script = tmp_path / "run.sh"
    for comm, ok in (("all_gather", True), ("a2a", True), ("p2p", False), (None, False),
                     (" ".join(["a2a"] * 31 + ["a2a+p2p"]) + " --hierarchical-context-parallel-sizes 2 1", False)):
        script.write_text(text.replace("--cp-comm-type all_gather", f"--cp-comm-type {comm}" if comm else ""))
        assert main(["rank", config, "--from", str(script), *CP]) == (0 if ok else 2)
        err = capsys.readouterr().err
        assert ok or "only over a2a or all_gather" in err
    plain = _config(tmp_path, "plain", sliding_window=None)
    assert main(["best", plain, "--stages", "4", "--emit", "megatron", *CP]) == 0
    assert "--cp-comm-type" not in capsys.readouterr().out


def test_a_window_on_a_measured_profile_is_refused(capsys, tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("--num-layers 6 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*3|t*3L' "
                      "--window-size 1023,0\n")
    assert main(["rank", "gpuknap/examples/demo.json", "--from", str(script), "--capacity", "200GiB", "--quiet"]) == 2
    assert "costed only on a Hugging Face config" in capsys.readouterr().err


@pytest.mark.parametrize("flag, says", [
    ("--window-size -1,0", "write --window-size=-1,0"),  # argparse before 3.14 takes -1,0 for a flag
    ("--cp-comm-type a2a a2a all_gather", "one per layer (--num-layers 32)"),
    ("--cp-comm-type A2A", "got 'A2A'"),
    ("--window-size 10000000,0 --cp-comm-type p2p", "only over a2a or all_gather"),  # TE: still a sliding window
])
def test_context_parallel_spellings_megatron_or_transformer_engine_refuse(capsys, tmp_path, flag, says):
    config = _config(tmp_path, "mistral")
    assert main(["best", config, "--stages", "4", "--emit", "megatron", *CP]) == 0
    text = capsys.readouterr().out.replace("--cp-comm-type all_gather", "").replace("--window-size 4095,0", flag)
    script = tmp_path / "run.sh"
    script.write_text(text)
    assert main(["rank", config, "--from", str(script), *CP]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_per_layer_exchanges_and_the_fragment_note_with_context_parallelism(capsys, tmp_path):
    config = _config(tmp_path, "mistral")
    assert main(["best", config, "--stages", "4", "--emit", "megatron", *CP]) == 0
    text = capsys.readouterr().out
    script = tmp_path / "run.sh"
    script.write_text(text.replace("--cp-comm-type all_gather", "--cp-comm-type " + " ".join(["a2a"] * 32)))
    assert main(["rank", config, "--from", str(script), *CP]) == 0
    capsys.readouterr()
    script.write_text("--num-layers 32 --pipeline-model-parallel-size 4 "
                      "--pipeline-model-parallel-layout 'Et*8|t*8|t*8|t*8L'\n")
    got = _rank_flags(capsys, config, script, CP)
    assert [n for n in got["notes"] if "--window-size 4095,0 with --cp-comm-type all_gather" in n]


def _rank_flags(capsys, config, script, flags) -> dict:
    assert main(["rank", config, "--from", str(script), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_tp_comm_overlap_is_read_and_costed(capsys, tmp_path):
    """--tp-comm-overlap hides TP communication behind the GEMMs (tests/costs/test_overlap.py has the
    formula): every stage faster than as written, the same as with the command's own flag; a whole
    run without sequence parallelism is refused, as Megatron's arguments.py asserts."""
    config, text, script, want, got = _written_and_edited(capsys, tmp_path, "--window-size 4095,0 --tp-comm-overlap")
    assert all(a < b for a, b in zip(_stage_times(got), _stage_times(want)))
    assert not [n for n in got["notes"] if "tp-comm-overlap" in n]
    assert main(["rank", config, "--from", str(script), "--json", *FLAGS, "--tp-comm-overlap"]) == 0
    assert _stage_times(json.loads(capsys.readouterr().out)) == _stage_times(got)
    script.write_text(text.replace("--sequence-parallel", "--tp-comm-overlap"))
    assert main(["rank", config, "--from", str(script), *FLAGS]) == 2
    assert "--sequence-parallel" in capsys.readouterr().err
