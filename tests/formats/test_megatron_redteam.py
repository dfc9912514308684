"""Megatron launch scripts read by ``rank --from`` as Megatron runs them (red-team findings F3, F4,
F7, F8, F9, F11): settings gpuknap does not cost are refused by name, a whole launch's unwritten
sizes are Megatron's defaults, and the shell constructs the reader cannot follow are refused.
Megatron's sources are cited from NVIDIA/Megatron-LM (megatron/training/arguments.py,
megatron/core/model_parallel_config.py, megatron/core/pipeline_parallel/schedules.py)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from paths import EXAMPLES

from gpuknap.cli import main
from gpuknap.formats import megatron
from gpuknap.formats._arguments import KNOWN, NOT_FLAGS, READ
from gpuknap.formats._settings import misspelt
from gpuknap.formats._shell import words
from gpuknap.schedule import in_flight_table

LLAMA = os.path.join(EXAMPLES, "llama2_7b_config.json")
MIXTRAL = os.path.join(EXAMPLES, "mixtral_8x7b_config.json")
BASH = shutil.which("bash")
MIRROR = "/work/.mirror/NVIDIA+Megatron-LM/repo"
BASE = ("python pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --num-layers 32 "
        "--pipeline-model-parallel-layout 'Et*8|t*8|t*8|t*8L' --micro-batch-size 1 --global-batch-size 64 "
        "--seq-length 4096 --use-distributed-optimizer --sequence-parallel --bf16")
VPP = BASE.replace("'Et*8|t*8|t*8|t*8L'", "'Et*4|(t*4|)*6t*4L'")
RUN = ["--capacity", "80GiB", "--dp", "1", "--quiet"]


def rank(capsys, tmp_path, content, *extra, spec=LLAMA, name="run.sh"):
    path = tmp_path / name
    path.write_text(content)
    rc = main(["rank", spec, "--from", str(path), *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err, str(path)


def refused(capsys, tmp_path, content, says, *extra, spec=LLAMA, absent=()):
    rc, _, err, path = rank(capsys, tmp_path, content, *extra, spec=spec)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    for word in [path, *says]:
        assert word in lines[0], (word, lines[0])
    for word in absent:
        assert word not in lines[0], (word, lines[0])


def scored(capsys, tmp_path, content, *extra, spec=LLAMA, name="run.sh"):
    rc, out, err, _ = rank(capsys, tmp_path, content, "--json", *extra, spec=spec, name=name)
    assert rc in (0, 1), err
    payload = json.loads(out)
    payload.pop("from")
    return payload, err


# F3: --microbatch-group-size-per-virtual-pipeline-stage (model_parallel_config.py 431-436, default P at 567-568)

def test_the_group_changes_what_megatron_keeps_in_flight():
    """schedules.py 960-965: the interleaved warm-up is (P - s - 1) x 2 + (v - 1) x G, so a group of 16
    on 4 stages keeps more micro-batches in flight than the default group (4): the refusal guards a real
    difference."""
    default, g16 = in_flight_table(4, 2, 64), in_flight_table(4, 2, 64, group=16)
    assert sum(g16[0]) > sum(default[0]) and g16 != default


def test_a_group_other_than_the_pipeline_size_is_refused(capsys, tmp_path):
    flag = "--microbatch-group-size-per-virtual-pipeline-stage"
    refused(capsys, tmp_path, VPP + f" {flag} 16\n", [f"{flag} 16", "pipeline size (4)", "line 1"], *RUN)
    refused(capsys, tmp_path, VPP + f" {flag} 2\n", [f"{flag} 2", "smaller than the pipeline size"], *RUN)
    plain, _ = scored(capsys, tmp_path, VPP + "\n", *RUN)
    same, _ = scored(capsys, tmp_path, VPP + f" {flag} 4\n", *RUN)  # Megatron's default, written out
    assert same == plain
    one = BASE + f" {flag} 16\n"  # no virtual stages: Megatron's 1F1B schedule takes no group
    assert scored(capsys, tmp_path, one, *RUN)[0] == scored(capsys, tmp_path, BASE + "\n", *RUN)[0]


# F4: a whole launch's unwritten sizes are Megatron's defaults

def test_a_whole_run_without_a_global_batch_runs_one_micro_batch(capsys, tmp_path):
    """arguments.py 702-704: no --global-batch-size is micro-batch size x DP, one micro-batch an iteration."""
    bare = BASE.replace(" --global-batch-size 64", "") + "\n"
    got, err = scored(capsys, tmp_path, bare, *RUN)
    want, _ = scored(capsys, tmp_path, BASE.replace("--global-batch-size 64", "--global-batch-size 1") + "\n", *RUN)
    assert got["best"] == want["best"] and "no --global-batch-size" in " ".join(got["notes"])
    refused(capsys, tmp_path, bare, ["micro_batches = 1", "no --global-batch-size", "--micro-batches 64"], *RUN,
            "--micro-batches", "64")
    fragment = bare.replace("python pretrain_gpt.py --tensor-model-parallel-size 2 ", "")  # flags only: as before
    assert rank(capsys, tmp_path, fragment, *RUN, "--tp", "2", "--micro-batches", "64")[0] in (0, 1)


def test_a_launch_without_tensor_parallelism_runs_megatrons_tp_1(capsys, tmp_path):
    """model_parallel_config.py 55: TP defaults to 1. A file that launches pretrain_gpt.py states the whole
    run: TP 1 is costed (not the command line's or the spec's), with a note; a flags-only file stays a
    fragment whose TP comes from the command line."""
    launch = BASE.replace("python pretrain_gpt.py --tensor-model-parallel-size 2",
                          "torchrun --nproc_per_node 8 /opt/megatron/pretrain_gpt.py") + "\n"
    got, _ = scored(capsys, tmp_path, launch, *RUN)
    tp1, _ = scored(capsys, tmp_path, launch.replace("--num-layers", "--tensor-model-parallel-size 1 --num-layers"),
                    *RUN, name="tp1.sh")
    assert got["best"] == tp1["best"] and any("TP 1" in n for n in got["notes"])
    refused(capsys, tmp_path, launch, ["tp = 1", "no --tensor-model-parallel-size", "--tp 2"], *RUN, "--tp", "2")
    flags = launch.replace("torchrun --nproc_per_node 8 /opt/megatron/pretrain_gpt.py ", "")
    assert rank(capsys, tmp_path, flags, *RUN, "--tp", "2")[0] in (0, 1)


def test_a_whole_moe_run_without_expert_tensor_parallelism_runs_etp_tp(capsys, tmp_path):
    """arguments.py 587-588: no --expert-tensor-parallel-size is ETP = TP; an --etp that says otherwise is
    a contradiction, refused as other flags against the file are; EP defaults to 1
    (model_parallel_config.py 127)."""
    moe = BASE.replace("--use-distributed-optimizer", "--use-distributed-optimizer --moe-grouped-gemm "
                                                      "--num-experts 8 --moe-router-topk 2 "
                                                      "--moe-token-dispatcher-type alltoall "
                                                      "--expert-model-parallel-size 2") + "\n"
    run = ["--capacity", "200GiB", "--dp", "2", "--quiet"]
    refused(capsys, tmp_path, moe, ["no --expert-tensor-parallel-size", "ETP = TP = 2", "--etp 1"], *run, "--etp", "1",
            spec=MIXTRAL)
    plain, _ = scored(capsys, tmp_path, moe, *run, spec=MIXTRAL)
    assert scored(capsys, tmp_path, moe, *run, "--etp", "2", spec=MIXTRAL)[0] == plain
    written = moe.replace("--moe-grouped-gemm", "--moe-grouped-gemm --expert-tensor-parallel-size 1")
    assert rank(capsys, tmp_path, written, *run, "--etp", "1", spec=MIXTRAL)[0] in (0, 1)
    no_ep = moe.replace(" --expert-model-parallel-size 2", "")
    refused(capsys, tmp_path, no_ep, ["ep = 1", "no --expert-model-parallel-size", "--ep 2"], *run, "--ep", "2",
            spec=MIXTRAL)


# F7: indexed array assignments and unset

INDEXED = """A=(--recompute-activations)
A[0]=--recompute-granularity
A[1]=full
python pretrain_gpt.py --num-layers 32 ${A[@]}
"""
UNSET = """A=(--recompute-activations)
unset A
python pretrain_gpt.py --num-layers 32 ${A[@]}
"""
ELEMENT_UNSET = """A=(--recompute-activations --seq-length 4096)
unset 'A[0]'
python pretrain_gpt.py --num-layers 32 "${A[@]}"
"""
UNSET_IN_IF = """A=(--recompute-activations)
if [ -n "$X" ]; then
  unset A
fi
python pretrain_gpt.py --num-layers 32 "${A[@]}"
"""
RESET = """A=(--recompute-activations)
A[0]=--seq-length
A=(--tensor-model-parallel-size 2)
python pretrain_gpt.py --num-layers 32 "${A[@]}"
"""


def _flags(script: str) -> list[str]:
    return [w for w, _ in words(script, "run.sh") if w is not None]


@pytest.mark.parametrize("script, says", [
    (INDEXED, ["line 4", "${A[@]}", "line 2", "A[0]=--recompute-granularity: one element assigned"]),
    (ELEMENT_UNSET, ["line 3", "unset A[0]: one element unset"]),
    (UNSET_IN_IF, ["line 5", "line 3", "inside an if or case block"]),
])
def test_arrays_changed_element_by_element_are_refused_where_read(script, says):
    with pytest.raises(ValueError) as err:
        _flags(script)
    for word in says:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize("script, want", [
    (UNSET, ["python", "pretrain_gpt.py", "--num-layers", "32"]),
    (RESET, ["python", "pretrain_gpt.py", "--num-layers", "32", "--tensor-model-parallel-size", "2"]),
])
def test_unset_and_a_whole_reassignment_pass_what_bash_passes(script, want, tmp_path):
    got = [w for w in _flags(script) if not w.startswith("$")]  # an unset variable passes nothing
    assert got == want
    if BASH is not None:
        path = tmp_path / "run.sh"
        path.write_text(script)
        ran = subprocess.run([BASH, "-c", 'python(){ printf "%s\\n" python "$@"; }; source "$1"', "_", str(path)],
                             capture_output=True, text=True, check=True)
        assert ran.stdout.split() == want


def test_an_unset_recompute_array_is_read_as_no_recompute(capsys, tmp_path):
    script = "A=(--recompute-activations)\nunset A\n" + BASE + " ${A[@]}\n"
    got, _ = scored(capsys, tmp_path, script, *RUN)
    assert got == scored(capsys, tmp_path, BASE + "\n", *RUN, name="plain.sh")[0]


# F8: Megatron's own flags are not misspellings

def test_megatrons_param_gather_flags_are_left_alone(capsys, tmp_path):
    """arguments.py 2012-2016 define --fp4-param-gather and --fp8-param-gather."""
    for flag in ("--fp8-param-gather", "--fp4-param-gather", "--mtp-hybrid-override-pattern x"):
        assert rank(capsys, tmp_path, BASE + f" {flag}\n", *RUN)[0] in (0, 1), flag


def test_a_hybrid_override_pattern_is_refused_as_the_hybrid_pattern_is(capsys, tmp_path):
    """arguments.py 743-754: --hybrid-override-pattern is the deprecated name of --hybrid-layer-pattern."""
    refused(capsys, tmp_path, BASE + " --hybrid-override-pattern M-M-\n", ["--hybrid-override-pattern", "hybrid"],
            *RUN, absent=["did you mean"])


def test_overlapped_param_gather_is_checked_as_arguments_py_checks_it(capsys, tmp_path):
    """arguments.py 1024-1029: --overlap-param-gather runs with the distributed optimizer, Megatron FSDP or
    the dist_muon optimizer, and --overlap-grad-reduce. FSDP and other optimizers are then refused as not
    modelled, by their own flag."""
    plain = BASE.replace(" --use-distributed-optimizer", "")
    overlap = " --overlap-grad-reduce --overlap-param-gather\n"
    refused(capsys, tmp_path, plain + " --use-megatron-fsdp" + overlap, ["--use-megatron-fsdp:", "optim_grads_params"],
            *RUN, absent=["--overlap-param-gather"])
    refused(capsys, tmp_path, plain + " --optimizer dist_muon" + overlap, ["--optimizer: dist_muon", "Adam"], *RUN,
            absent=["--overlap-param-gather"])
    refused(capsys, tmp_path, plain + overlap, ["--overlap-param-gather", "--use-megatron-fsdp"], *RUN)
    refused(capsys, tmp_path, BASE + " --overlap-param-gather\n", ["--overlap-param-gather", "--overlap-grad-reduce"],
            *RUN)
    refused(capsys, tmp_path, BASE + " --use-torch-fsdp2\n", ["--use-torch-fsdp2:"], *RUN)
    assert rank(capsys, tmp_path, BASE + " --optimizer adam" + overlap, *RUN)[0] in (0, 1)
    refused(capsys, tmp_path, BASE + " --optimizer hybridadam\n", ["hybridadam", "not one of Megatron's"], *RUN)


@pytest.mark.skipif(not os.path.isdir(MIRROR), reason="no Megatron-LM mirror here")
def test_no_flag_of_megatrons_arguments_py_is_called_a_misspelling():
    text = subprocess.run(["git", "-C", MIRROR, "show", "HEAD:megatron/training/arguments.py"], capture_output=True,
                          text=True, check=True).stdout
    flags = set(re.findall(r"add_argument\(\s*'(--[a-z0-9-]+)'", text))
    assert "--fp8-param-gather" in flags and len(flags) > 300
    called = {f: misspelt(f, READ, KNOWN) for f in sorted(flags) if f not in READ and f not in NOT_FLAGS}
    # --batch-size: arguments.py asserts it is unset ("no longer valid, use --micro-batch-size")
    assert {f: near for f, near in called.items() if near} == {"--batch-size": "--micro-batch-size"}


# F9: a Megatron file never gives DP

def test_settings_without_dp_say_dp_1_was_assumed(capsys, tmp_path):
    rc, _, err, _ = rank(capsys, tmp_path, BASE + "\n", "--capacity", "80GiB", "--quiet")
    assert rc in (0, 1)
    lines = [line for line in err.splitlines() if "data-parallel" in line]
    assert len(lines) == 1 and "do not give the data-parallel size" in lines[0]
    assert "world size" in lines[0] and "DP 1 assumed" in lines[0] and "give --dp" in lines[0]
    rc, _, err, _ = rank(capsys, tmp_path, BASE + "\n", "--capacity", "80GiB", "--quiet", "--dp", "2")
    assert rc in (0, 1) and "data-parallel size" not in err


# F11: an unclosed array

def test_an_unclosed_array_is_named_not_a_missing_layout(capsys, tmp_path):
    text = ("A=(\n --num-layers 32 --pipeline-model-parallel-size 4 "
            "--pipeline-model-parallel-layout \"Et*8|t*8|t*8|t*8L\"\n")
    refused(capsys, tmp_path, text, ["line 1", "A=( is never closed"], *RUN, absent=["missing"])
    with pytest.raises(ValueError, match="never closed"):
        megatron.load_text(text, "x.sh")
    if BASH is not None:  # bash refuses it too
        assert subprocess.run([BASH, "-n"], input=text, text=True, capture_output=True).returncode != 0


@pytest.mark.parametrize("tail", ['"$@"', "$EXTRA_ARGS", "${MORE_ARGS[@]}", "--overlap-grad-reduce $EXTRA", "`cat a`"])
def test_a_launch_passing_words_it_cannot_see_is_a_fragment(capsys, tmp_path, tail):
    """Words the file does not define (a sourced file's arrays, "$@", an unset $EXTRA_ARGS) may carry
    any flag: Megatron's defaults are not applied; what the file does not say comes from the command
    line, as for a flags-only file, with a note naming the word. A variable after an unread flag is
    that flag's value, not such a word."""
    launch = BASE.replace(" --global-batch-size 64", "").replace(" --tensor-model-parallel-size 2", "")
    rc, out, err, _ = rank(capsys, tmp_path, f"{launch} {tail}\n", *RUN, "--tp", "2", "--micro-batches", "64",
                           "--json")
    assert rc in (0, 1), err
    notes = " ".join(json.loads(out)["notes"])
    assert "passes words gpuknap cannot see" in notes and tail.split()[-1].strip('"`')[:8] in notes
    valued = f"{launch} --data-path $DATA_PATH\n"  # an unread flag's value: the launch is whole
    refused(capsys, tmp_path, valued, ["tp = 1", "--tp 2"], *RUN, "--tp", "2")


def test_batch_schedules(capsys, tmp_path):
    """num_microbatches_calculator.py: --step-batch-size-schedule sets the batch step by step (costed at
    its largest, the phase with the most micro-batches), and arguments.py 698-701 refuses it beside
    --global-batch-size; --rampup-batch-size (deprecated) ends at --global-batch-size."""
    plain = BASE.replace("--global-batch-size 64", "--global-batch-size 32") + "\n"
    want, _ = scored(capsys, tmp_path, plain, *RUN, name="plain.sh")
    steps = BASE.replace("--global-batch-size 64", "--step-batch-size-schedule '0:8 250B:16 500B:32'") + "\n"
    got, _ = scored(capsys, tmp_path, steps, *RUN)
    assert got["best"] == want["best"] and got["micro_batches"] == 32
    assert any("largest global batch, 32" in n for n in got["notes"])
    refused(capsys, tmp_path, steps.replace("--seq-length", "--global-batch-size 32 --seq-length"),
            ["--step-batch-size-schedule", "beside --global-batch-size"], *RUN)
    refused(capsys, tmp_path, steps.replace("0:8", "0:x"), ["--step-batch-size-schedule", "THRESHOLD:BATCH"], *RUN)
    refused(capsys, tmp_path, steps.replace("0:8", "1K:8"), ["threshold 0"], *RUN)
    refused(capsys, tmp_path, steps.replace("500B:32", "250B:32"), ["strictly increasing"], *RUN)
    refused(capsys, tmp_path, steps.replace("'0:8 250B:16 500B:32'", "0:8 500B:32"), ["quote the schedule"], *RUN)
    commas = steps.replace("'0:8 250B:16 500B:32'", "0:8,0.25T:16,500B:0.032K")  # Megatron's own spellings
    assert scored(capsys, tmp_path, commas, *RUN)[0]["best"] == want["best"]
    # a fragment's schedule too (a launch passing "$@" is one)
    frag, _ = scored(capsys, tmp_path, steps.replace("\n", ' "$@"\n'), *RUN, "--tp", "2", name="frag.sh")
    assert frag["micro_batches"] == 32
    ramp = plain.replace("--seq-length", "--rampup-batch-size 16 8 300000 --seq-length")
    got, _ = scored(capsys, tmp_path, ramp, *RUN)
    assert got["best"] == want["best"] and any("--rampup-batch-size" in n for n in got["notes"])


def test_a_batch_rounded_down_as_megatron_does(capsys, tmp_path):
    """num_microbatches_calculator.py (_round): --decrease-batch-size-if-needed runs the largest multiple of
    micro-batch size x DP under the global batch; without it such a batch is refused."""
    odd = BASE.replace("--global-batch-size 64", "--global-batch-size 70") + "\n"
    refused(capsys, tmp_path, odd, ["not a multiple"], "--capacity", "80GiB", "--dp", "4")
    rounded = odd.replace("--seq-length", "--decrease-batch-size-if-needed --seq-length")
    refused(capsys, tmp_path, rounded, ["evaluation batch"], "--capacity", "80GiB", "--dp", "4")  # arguments.py 708-720
    rc, out, err, _ = rank(capsys, tmp_path, rounded.replace("--seq-length", "--eval-global-batch-size 64 --seq-length"),
                           "--capacity", "80GiB", "--dp", "4", "--json")
    assert rc in (0, 1), err
    assert json.loads(out)["micro_batches"] == 17 and "global batch of 68, not 70" in err


def test_a_launchers_own_variables_do_not_make_a_fragment(capsys, tmp_path):
    """torchrun's arguments ($DISTRIBUTED_ARGS, set outside the file) are not the program's: the launch
    stays whole, at Megatron's defaults."""
    launch = BASE.replace(" --global-batch-size 64", "").replace("python pretrain_gpt.py",
                                                                  "torchrun $DISTRIBUTED_ARGS pretrain_gpt.py") + "\n"
    refused(capsys, tmp_path, launch, ["micro_batches = 1", "--micro-batches 64"], *RUN, "--micro-batches", "64")


@pytest.mark.parametrize("extra", ["| tee ${LOG_DIR}/train.log", "> $LOG 2>&1", "&& echo $DONE",
                                   "--data-path 0.7 ${DIR}/a 0.3 ${DIR}/b"])
def test_ordinary_variables_keep_a_launch_whole(capsys, tmp_path, extra):
    """A log file, a following command, a blended data path or the program's own path in a variable
    pass no flags to the program: the launch stays whole, at Megatron's defaults."""
    launch = BASE.replace(" --global-batch-size 64", "").replace("python pretrain_gpt.py",
                                                                  "python ${MEGATRON}/pretrain_gpt.py")
    refused(capsys, tmp_path, f"{launch} {extra}\n", ["micro_batches = 1", "--micro-batches 64"], *RUN,
            "--micro-batches", "64")


def test_the_token_dispatcher_is_the_one_gpuknap_costs_or_is_named(capsys, tmp_path):
    """transformer_config.py: Megatron's default token dispatcher is allgather (every token gathered
    over the EP x ETP ranks), and gpuknap costs the alltoall dispatcher: a whole MoE launch with EP x
    ETP > 1 that leaves the flag out, or gives allgather, is refused naming the flag; alltoall is read;
    flex (DeepEP, HybridEP) is read and costed as ``--dispatcher flex`` (a token once to each rank
    holding one of its experts, once per node across nodes: cheaper), and a ``--dispatcher`` that says otherwise is refused; a value
    Megatron's parser refuses is refused; with EP x ETP = 1 no dispatcher communicates, and none is
    refused."""
    moe = BASE.replace("--use-distributed-optimizer", "--use-distributed-optimizer --moe-grouped-gemm "
                                                      "--num-experts 8 --moe-router-topk 2 "
                                                      "--expert-model-parallel-size 2 --expert-tensor-parallel-size 1"
                       ) + "\n"
    run = ["--capacity", "200GiB", "--dp", "2", "--quiet"]

    def using(value):
        return moe.replace("--moe-grouped-gemm", f"--moe-grouped-gemm --moe-token-dispatcher-type {value}")

    refused(capsys, tmp_path, moe, ["without --moe-token-dispatcher-type", "default dispatcher, allgather",
                                    "write --moe-token-dispatcher-type alltoall"], *run, spec=MIXTRAL)
    refused(capsys, tmp_path, using("allgather"), ["--moe-token-dispatcher-type allgather all-gathers"], *run,
            spec=MIXTRAL)
    refused(capsys, tmp_path, using("a2a"), ["expected allgather or alltoall or flex"], *run, spec=MIXTRAL)
    # a --recompute on the command line is refused beside settings (they give the recompute), so it
    # cannot strip the MoE options the dispatcher check looks at either
    refused(capsys, tmp_path, using("allgather"), ["--recompute:", "gives the recompute"], *run, "--recompute",
            "full", spec=MIXTRAL)
    alltoall, _ = scored(capsys, tmp_path, using("alltoall"), *run, spec=MIXTRAL)
    flex, _ = scored(capsys, tmp_path, using("flex"), *run, spec=MIXTRAL)
    # EP 2 on one node, 4 of Mixtral's 8 experts a rank: a top-2 token reaches the other rank with
    # chance 1 - C(4, 2) / C(8, 2) = 22 / 28 under flex, where alltoall sends it one copy on average
    assert flex["best"]["iteration_time_s"] < alltoall["best"]["iteration_time_s"]
    assert 0 < flex["best"]["breakdown"]["ep"] < alltoall["best"]["breakdown"]["ep"]
    refused(capsys, tmp_path, using("flex"), ["run --moe-token-dispatcher-type flex, but --dispatcher alltoall"],
            *run, "--dispatcher", "alltoall", spec=MIXTRAL)
    # EP 8 over two nodes of 4: the flex dispatcher sends a token once per node, costed as --dispatcher flex
    wide = [*run[:3], "4", "--gpus-per-node", "4", "--quiet"]
    spread = lambda value: using(value).replace("--expert-model-parallel-size 2", "--expert-model-parallel-size 8")
    across = {value: scored(capsys, tmp_path, spread(value), *wide, spec=MIXTRAL)[0] for value in ("alltoall", "flex")}
    flagged, _ = scored(capsys, tmp_path, spread("flex"), *wide, "--dispatcher", "flex", spec=MIXTRAL)
    assert flagged == across["flex"]
    run_time = {value: got["best"]["iteration_time_s"] for value, got in across.items()}
    assert run_time["flex"] < run_time["alltoall"], run_time
    one = moe.replace("--expert-model-parallel-size 2", "--expert-model-parallel-size 1")
    scored(capsys, tmp_path, one, *run, spec=MIXTRAL)
    # one expert rank, or a dense model, sends no tokens: flex reads as alltoall, with no note
    for launch, spec in ((one.replace("--moe-grouped-gemm", "--moe-grouped-gemm --moe-token-dispatcher-type flex"),
                          MIXTRAL), (BASE.replace("--use-distributed-optimizer", "--use-distributed-optimizer "
                                                  "--moe-token-dispatcher-type flex") + "\n", None)):
        got, _ = scored(capsys, tmp_path, launch, *run, **({"spec": spec} if spec else {}))
        plain, _ = scored(capsys, tmp_path, launch.replace("type flex", "type alltoall"), *run,
                          **({"spec": spec} if spec else {}))
        assert not any("flex" in n for n in got["notes"]) and got == plain, got["notes"]
