"""Megatron launch scripts read as Megatron reads them (red team rt13, findings 3, 7, 9, 10, 11):
Megatron's split without a layout, a whole run without a micro-batch size, deprecated recompute
flags, precision/offload/kernel flags the cost model does not model, and ``--flag=$VAR``.
Megatron's sources: NVIDIA/Megatron-LM ``megatron/training/arguments.py`` (validate_args),
``megatron/core/transformer/transformer_config.py`` (__post_init__) and
``megatron/core/transformer/transformer_block.py`` (get_num_layers_to_build)."""
from __future__ import annotations

import itertools
import os

import pytest
from paths import EXAMPLES

from gpuknap.cli import main
from gpuknap.formats import megatron
from gpuknap.formats._arguments import arguments
from gpuknap.formats._megatron_run import default_layout
from test_megatron_redteam import rank, refused, scored as _scored  # noqa: F401 (rank: the others' helper)

LLAMA = os.path.join(EXAMPLES, "llama2_7b_config.json")
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
LAYOUT = "--pipeline-model-parallel-layout 'Et*8|t*8|t*8|t*8L' "
BASE = ("python pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --num-layers 32 "
        + LAYOUT + "--micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --use-distributed-optimizer "
        "--sequence-parallel --bf16")
RUN = ["--capacity", "80GiB", "--dp", "1", "--quiet"]


def scored(capsys, tmp_path, content, *extra, spec=LLAMA, name="run.sh"):
    return _scored(capsys, tmp_path, content, *extra, spec=spec, name=name)[0]


# 9: Megatron's split without --pipeline-model-parallel-layout

def megatron_counts(layers, pp, vp_flag, first, last, embedding, loss):
    """An independent re-implementation of Megatron's rule, written from its sources: the checks of
    arguments.py (validate_args) and transformer_config.py (__post_init__), then
    get_num_layers_to_build (transformer_block.py) called for every (vp_stage, pp_rank).  ``vp_flag``
    is ``("per", n)`` for --num-layers-per-virtual-pipeline-stage, ``("ranks", n)`` for
    --num-virtual-stages-per-pipeline-rank, or None.  Decoder layers per virtual stage, chunk-major,
    or None where Megatron refuses the flags."""
    extra = int(embedding) + int(loss)
    uneven = first is not None or last is not None
    # arguments.py validate_args
    vp = None
    if vp_flag is not None and vp_flag[0] == "per":
        if uneven:
            return None
        if (layers + extra) % pp:
            return None
        stage = (layers + extra) // pp
        if stage % vp_flag[1]:
            return None
        vp = stage // vp_flag[1]
    elif vp_flag is not None:
        vp = vp_flag[1]
    elif not uneven and (layers + extra) % pp:
        return None
    if vp == 1:
        vp = None
    # transformer_config.py __post_init__
    if uneven and extra:
        return None
    if uneven:
        n, p = layers, pp
        for given in (first, last):
            if given is None:
                continue
            if given <= 0 or (vp is not None and given % vp):
                return None
            n, p = n - given, p - 1
        if bool(n) != bool(p) or (p and n % p) or (p and vp is not None and (n // p) % vp):
            return None
    elif extra:
        if (layers + extra) % pp or (vp is not None and ((layers + extra) // pp) % vp):
            return None
    # transformer_block.py get_num_layers_to_build, per (vp_stage, pp_rank)
    out = []
    for vp_stage in range(vp or 1):
        for rank_ in range(pp):
            is_first, is_last = rank_ == 0, rank_ == pp - 1
            if uneven:
                to_distribute, left = layers, pp
                if first is not None:
                    to_distribute, left = to_distribute - first, left - 1
                if last is not None:
                    to_distribute, left = to_distribute - last, left - 1
                per_rank = to_distribute // left if left > 0 else 0
                if is_first and first is not None:
                    per_rank = first
                if is_last and last is not None:
                    per_rank = last
            else:
                per_rank = (layers + extra) // pp
            if vp is not None and pp > 1:
                if per_rank % vp:
                    return None
                build = per_rank // vp
            else:
                build = per_rank
            if embedding and vp_stage == 0 and is_first:
                build -= 1
            if loss and vp_stage == (vp or 1) - 1 and is_last:
                build -= 1
            if build < 0:
                return None
            out.append(build)
    return out


def test_the_split_without_a_layout_is_megatrons_on_many_shapes():
    """Every (layers, PP, virtual stages, first/last stage layers, embedding/loss accounted) below: gpuknap's
    split is the re-implementation's, or both refuse."""
    compared = refusals = 0
    vps = [None, ("per", 1), ("per", 2), ("per", 3), ("ranks", 2), ("ranks", 3)]
    for layers, pp, vp_flag, first, last, embedding, loss in itertools.product(
            range(1, 26), range(2, 7), vps, (None, 1, 2, 4, 6), (None, 1, 3, 4, 6), (False, True), (False, True)):
        want = megatron_counts(layers, pp, vp_flag, first, last, embedding, loss)
        try:
            text = default_layout(layers, pp, 0, first, last, embedding, loss,
                                  vp_flag[1] if vp_flag and vp_flag[0] == "per" else None,
                                  vp_flag[1] if vp_flag and vp_flag[0] == "ranks" else None, "x")
        except ValueError:
            got = None
        else:
            segments = megatron.parse_layout(text, pp)
            got = [seg.count("t") for seg in segments]
            assert segments[0].startswith("E") and segments[-1].endswith("L")
            assert text.count("E") == text.count("L") == 1 and sum(got) == layers
        key = (layers, pp, vp_flag, first, last, embedding, loss)
        if want is not None and sum(want) != layers:  # Megatron's rule builds another layer count
            assert got is None, key  # the layout's decoder layers would not be --num-layers: refused
            continue
        assert got == want, (key, got, want)
        compared += got is not None
        refusals += got is None
    assert compared > 1500 and refusals > 50000, (compared, refusals)


def test_default_split_examples():
    assert default_layout(32, 4, 0, None, None, False, False, None, None, "x") == "Et*8|t*8|t*8|t*8L".replace(
        "t*8", "t" * 8)
    assert default_layout(30, 4, 0, None, None, True, True, None, None, "x") == \
        "E" + "t" * 7 + "|" + "t" * 8 + "|" + "t" * 8 + "|" + "t" * 7 + "L"
    assert default_layout(15, 4, 1, 3, 2, False, False, None, None, "x") == \
        "Ettt|" + "t" * 5 + "|" + "t" * 5 + "|ttmL"
    with pytest.raises(ValueError, match="not divisible by --pipeline-model-parallel-size 4"):
        default_layout(30, 4, 0, None, None, False, False, None, None, "x")
    # a review's findings: one stage given first and last counts builds the last (Megatron accepts it when that is
    # every layer); a refusal names the rank whose layers do not divide into its virtual stages (the middle one)
    assert default_layout(5, 1, 0, 2, 5, False, False, None, None, "x") == "E" + "t" * 5 + "L"
    with pytest.raises(ValueError, match="builds --decoder-last-pipeline-num-layers 4 layers, and the model has 5"):
        default_layout(5, 1, 0, 2, 4, False, False, None, None, "x")
    with pytest.raises(ValueError, match="^x: 3 layers on a pipeline rank are not divisible by its 2 virtual"):
        default_layout(11, 3, 0, 4, 4, False, False, None, 2, "x")


def test_a_script_with_the_default_layout_and_without_one_read_the_same(capsys, tmp_path):
    """A layout equal to Megatron's split, written or left out: the same plan."""
    written = scored(capsys, tmp_path, BASE + "\n", *RUN)
    left_out = scored(capsys, tmp_path, BASE.replace(LAYOUT, "") + "\n", *RUN, name="b.sh")
    assert left_out["best"] == written["best"]
    vpp = BASE.replace(LAYOUT, "--pipeline-model-parallel-layout 'Et*4|(t*4|)*6t*4L' ")
    ranks = BASE.replace(LAYOUT, "--num-virtual-stages-per-pipeline-rank 2 ")
    per = BASE.replace(LAYOUT, "--num-layers-per-virtual-pipeline-stage 4 ")
    want = scored(capsys, tmp_path, vpp + "\n", *RUN, name="c.sh")["best"]
    assert scored(capsys, tmp_path, ranks + "\n", *RUN, name="d.sh")["best"] == want
    assert scored(capsys, tmp_path, per + "\n", *RUN, name="e.sh")["best"] == want
    uneven = BASE.replace(LAYOUT, "--decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 6 ")
    layout = BASE.replace(LAYOUT, "--pipeline-model-parallel-layout 'Et*6|t*10|t*10|t*6L' ")
    assert scored(capsys, tmp_path, uneven + "\n", *RUN, name="f.sh")["best"] == \
        scored(capsys, tmp_path, layout + "\n", *RUN, name="g.sh")["best"]
    accounted = BASE.replace(LAYOUT, "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
                                     ).replace("--num-layers 32", "--num-layers 30")
    assert megatron.load_text(accounted, "a.sh").segments == tuple(
        megatron.parse_layout("Et*7|t*8|t*8|t*7L".replace("t*7", "t" * 7).replace("t*8", "t" * 8), 4))


def test_megatrons_refusals_of_a_split_without_a_layout(capsys, tmp_path):
    refused(capsys, tmp_path, BASE.replace(LAYOUT, "").replace("--num-layers 32", "--num-layers 30") + "\n",
            ["30 layers", "not divisible by --pipeline-model-parallel-size 4"], *RUN)
    refused(capsys, tmp_path, BASE.replace(LAYOUT, "--decoder-first-pipeline-num-layers 6 ") + "\n",
            ["26 middle layers", "3 middle pipeline stages"], *RUN)
    refused(capsys, tmp_path, BASE.replace(LAYOUT, "--num-layers-per-virtual-pipeline-stage 3 ") + "\n",
            ["8 layers per pipeline stage", "--num-layers-per-virtual-pipeline-stage 3"], *RUN)
    refused(capsys, tmp_path, BASE.replace(LAYOUT, "--decoder-first-pipeline-num-layers 8 "
                                                   "--account-for-loss-in-pipeline-split ") + "\n",
            ["--account-for-embedding/loss-in-pipeline-split"], *RUN)
    refused(capsys, tmp_path, BASE + " --decoder-first-pipeline-num-layers 8\n",  # beside a layout, as before
            ["--decoder-first-pipeline-num-layers", "beside --pipeline-model-parallel-layout"], *RUN)


def test_megatrons_own_2024_example_reads_with_its_even_split(capsys, tmp_path):
    """examples/pretrain_gpt_distributed_with_mp.sh (2024): PP 2, 24 layers, no layout: 12 a stage."""
    path = os.path.join(DATA, "megatron_2024_gpt_distributed_with_mp_bf16.sh")
    settings = megatron.load(path)
    assert [s.count("t") for s in settings.segments] == [12, 12]
    rc = main(["rank", os.path.join(DATA, "gpt_345m_like_config.json"), "--from", path, "--quiet", "--dp", "1"])
    out = capsys.readouterr()
    assert rc == 0 and "counts [13, 13]" in out.out, out.err


# 10: a whole run without --micro-batch-size

def test_a_whole_run_without_a_micro_batch_size_is_refused(capsys, tmp_path):
    """arguments.py validate_args: assert args.micro_batch_size is not None."""
    refused(capsys, tmp_path, BASE.replace("--micro-batch-size 1 ", "") + "\n",
            ["--micro-batch-size: missing", "assert args.micro_batch_size"], *RUN)
    fragment = BASE.replace("python pretrain_gpt.py --tensor-model-parallel-size 2 ", "").replace(
        "--micro-batch-size 1 ", "")
    assert rank(capsys, tmp_path, fragment + "\n", *RUN, "--tp", "2")[0] in (0, 1)  # a fragment: as before


# 7: deprecated recompute flags

@pytest.mark.parametrize("flag", ["--checkpoint-activations", "--checkpoint-num-layers 1",
                                  "--activations-checkpoint-method uniform",
                                  "--activations-checkpoint-num-layers 2", "--distribute-checkpointed-activations"])
def test_deprecated_recompute_flags_are_refused_by_name(capsys, tmp_path, flag):
    name = flag.split()[0]
    says = [name, "--recompute-granularity" if "distribute" not in name else "--distribute-saved-activations"]
    refused(capsys, tmp_path, BASE + f" {flag}\n", says, *RUN)
    refused(capsys, tmp_path, BASE.replace("python pretrain_gpt.py ", "") + f" {flag}\n", says, *RUN)


# 3: precision, offloading and kernels the cost model does not model

@pytest.mark.parametrize("flags,says", [
    ("--fp8-format hybrid --fp8-param-gather", ["--fp8-format: hybrid", "FP8 training"]),
    ("--fp4-format e2m1", ["--fp4-format", "FP4"]),
    ("--optimizer-cpu-offload --use-precision-aware-optimizer", ["--optimizer-cpu-offload"]),
    ("--use-precision-aware-optimizer --main-params-dtype fp16", ["--main-params-dtype: fp16"]),
    ("--use-precision-aware-optimizer --exp-avg-dtype bf16", ["--exp-avg-dtype: bf16"]),
    ("--use-precision-aware-optimizer --exp-avg-sq-dtype fp8", ["--exp-avg-sq-dtype: fp8"]),
    ("--main-grads-dtype bf16", ["--main-grads-dtype: bf16"]),
    ("--cpu-offloading-num-layers 4", ["--cpu-offloading-num-layers", "4", "offloads activations"]),
    ("--cpu-offloading", ["--cpu-offloading", "--cpu-offloading-num-layers N"]),
    ("--grad-reduce-in-fp32", ["--grad-reduce-in-fp32", "by default"]),
    ("--params-dtype fp16", ["--params-dtype", "--bf16 or --fp16"]),
    ("--fine-grained-activation-offloading", ["--fine-grained-activation-offloading"]),
    ("--attention-backend unfused", ["--attention-backend: unfused", "stores the attention scores"]),
    ("--attention-backend local", ["--attention-backend: local"]),
    ("--attention-backend bogus", ["'bogus' is not one of Megatron's"]),
    ("--transformer-impl local", ["--transformer-impl: local"]),
    ("--grad-reduce-in-bf16", ["--grad-reduce-in-bf16", "bf16"]),
    ("--fp16", ["--fp16", "beside --bf16"]),
])
def test_flags_the_cost_model_does_not_model_are_refused_by_name(capsys, tmp_path, flags, says):
    refused(capsys, tmp_path, BASE + f" {flags}\n", says, *RUN)


def test_precision_the_cost_model_runs_is_read(capsys, tmp_path):
    base = scored(capsys, tmp_path, BASE + "\n", *RUN)
    for flags in ("--attention-backend flash", "--attention-backend auto", "--transformer-impl transformer_engine",
                  "--use-precision-aware-optimizer --main-params-dtype fp32 --exp-avg-dtype fp32",
                  "--accumulate-allreduce-grads-in-fp32", "--cpu-offloading-num-layers 0"):
        assert scored(capsys, tmp_path, BASE + f" {flags}\n", *RUN, name="x.sh")["best"] == base["best"], flags
    fp16 = BASE.replace("--bf16", "--fp16 --accumulate-allreduce-grads-in-fp32")  # the bytes costed: fp32 gradients
    assert scored(capsys, tmp_path, fp16 + "\n", *RUN, name="y.sh")["best"] == base["best"]
    refused(capsys, tmp_path, BASE.replace("--bf16", "--fp16") + "\n", ["--fp16", "gradients in fp16"], *RUN)


def test_a_whole_run_without_bf16_or_fp16_trains_in_fp32_and_is_refused(capsys, tmp_path):
    refused(capsys, tmp_path, BASE.replace(" --bf16", "") + "\n", ["neither --bf16 nor --fp16", "fp32"], *RUN)
    fragment = BASE.replace("python pretrain_gpt.py --tensor-model-parallel-size 2 ", "").replace(" --bf16", "")
    assert rank(capsys, tmp_path, fragment + "\n", *RUN, "--tp", "2")[0] in (0, 1)  # a fragment: not said


def test_close_megatron_flags_are_not_called_misspellings():
    """Megatron's own flags beside the new read ones (--ckpt-format beside --fp8-format, ...)."""
    text = "--ckpt-format torch_dist --kitchen-attention-backend x --fp8-recipe delayed --fp8-param-gather\n"
    assert arguments(text, "a.sh") == {}  # none read, none refused as misspelt
    for field in ("--cpu-offloading-weights", "--cpu-offloading-activations", "--params-dtype fp16"):
        # TransformerConfig fields arguments.py keeps off its command line (its exclude list): refused, saying so
        with pytest.raises(ValueError, match=field.split()[0]):
            arguments(field + "\n", "a.sh")


# 11: --flag=$VAR

def test_a_variable_after_an_equals_sign_is_expanded_as_after_a_space(capsys, tmp_path):
    spaced = scored(capsys, tmp_path, "MBS=2\n" + BASE.replace("--micro-batch-size 1", "--micro-batch-size $MBS")
                    + "\n", *RUN)
    for form in ("--micro-batch-size=$MBS", "--micro-batch-size=${MBS}", '"--micro-batch-size=$MBS"'):
        got = scored(capsys, tmp_path, "MBS=2\n" + BASE.replace("--micro-batch-size 1", form) + "\n", *RUN,
                     name="b.sh")
        assert got["best"] == spaced["best"], form
    in_array = "MBS=2\nA=(--micro-batch-size=$MBS)\n" + BASE.replace("--micro-batch-size 1", '"${A[@]}"') + "\n"
    assert scored(capsys, tmp_path, in_array, *RUN, name="c.sh")["best"] == spaced["best"]
    refused(capsys, tmp_path, BASE.replace("--micro-batch-size 1", "--micro-batch-size=$UNSET") + "\n",
            ["--micro-batch-size $UNSET", "shell variable"], *RUN)


def test_an_unknown_flag_with_a_quoted_space_is_shown_with_the_space():
    """A review's finding: a quoted word with a trailing space was called unknown, suggesting itself."""
    with pytest.raises(ValueError, match=r"unknown flag '--recompute-activations ' \(did you mean --recompute-activations"):
        arguments('python pretrain_gpt.py "--recompute-activations " --num-layers 2\n', "a.sh")
