"""Launch scripts read as bash passes their words, checked against bash itself: each script runs
``python pretrain_gpt.py ...`` with ``python`` replaced by a function that prints its arguments,
and gpuknap's flags must be bash's, in order (skipped where bash is not installed)."""
from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from gpuknap.formats._shell import words

BASH = shutil.which("bash")
SCRIPTS = {
    "append": """ARGS=(
    --num-layers 28
    --seq-length 4096
)
ARGS+=(--tensor-model-parallel-size 4 --lr 1e-4)
python pretrain_gpt.py "${ARGS[@]}"
""",
    "declare": """declare -a ARGS=(--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2)
declare -a UNUSED=(
    --context-parallel-size 2
)
python pretrain_gpt.py "${ARGS[@]}"
""",
    "hash inside a word": """python pretrain_gpt.py --save /ckpt/run#3 --micro-batch-size 2 \\
    --exit-interval ${#LIST[@]} --seq-length 4096 # a comment --global-batch-size 8
""",
    "substitutions end lines": """ARGS=(
    --data-path $(echo /data)
    --exit-interval $((2*3))
    --tensor-model-parallel-size 8
)
python pretrain_gpt.py "${ARGS[@]}"
""",
    "quoted parentheses": """ARGS=(
    --window-size '(2047, 0)'
    --data-path ")"
    --log-dir "()"
    --tensor-model-parallel-size 8
)
python pretrain_gpt.py "${ARGS[@]}"
""",
    "semicolon after an array": """A=(--tensor-model-parallel-size 8);
B=(--seq-length 4096)
python pretrain_gpt.py "${A[@]}" "${B[@]}"
""",
    "here-document": """cat > /dev/null <<'END'
run with --context-parallel-size 2 to go faster
END
python pretrain_gpt.py --tensor-model-parallel-size 8
""",
    "quoted here-document marks": """cat > /dev/null <<-END
	run with --context-parallel-size 2
	END
echo "<<x" > /dev/null
python pretrain_gpt.py --tensor-model-parallel-size 8 --log-dir "<<y"
""",
    "environment prefix and shifts": """UNUSED=(--fp16)
N=$((1<<3))
ALL="$UNUSED --bf16"
CUDA_VISIBLE_DEVICES=0 python pretrain_gpt.py --seq-length 4096 --log-dir "run \\
2"
""",
    "comment inside a continued array": """ARGS=( \\
  --tensor-model-parallel-size 8 \\
  # --pipeline-model-parallel-size 2 \\
  --seq-length 4096 \\
)
python pretrain_gpt.py "${ARGS[@]}"
""",
    "comment inside continued lines of an array": """ARGS=(
  --tensor-model-parallel-size 8 \\
  # --pipeline-model-parallel-size 2 \\
  --seq-length 4096
)
python pretrain_gpt.py "${ARGS[@]}"
""",
}


@pytest.mark.skipif(BASH is None, reason="bash is not installed here")
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_flags_are_the_ones_bash_passes(tmp_path, name):
    path = tmp_path / "run.sh"
    path.write_text(SCRIPTS[name])
    ran = subprocess.run([BASH, "-c", 'python(){ printf "%s\\n" "$@"; }; source "$1"', "_", str(path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=30)
    passed = [w for w in ran.stdout.split("\n") if w]
    read = [w for w, _ in words(SCRIPTS[name], str(path))]
    flags = lambda ws: [w for w in ws if w.startswith("--")]  # noqa: E731
    assert flags(read) == flags(passed), (read, passed)
    assert read[read.index(flags(read)[0]):] == passed[passed.index(flags(passed)[0]):] or "$" in SCRIPTS[name]


@pytest.mark.parametrize("script", [
    "python pretrain_gpt.py --bf16 \\\n\n  --lr 1e-4\n",  # an empty line ends the command
    "python pretrain_gpt.py --bf16 \\ \n  --lr 1e-4\n",  # so does a space after the backslash
    "python pretrain_gpt.py --bf16 \\ # fp\n  --lr 1e-4\n",  # an escaped space, then the word ' #'
    "ARGS=(--lr 1e-4)\npython pretrain_gpt.py --bf16 \\\n  # tuning\n  \"${ARGS[@]}\"\n",
])
def test_a_line_of_flags_bash_runs_as_its_own_command_is_refused(script):
    """bash runs such a line as a command of its own ('--lr: command not found'): its flags never
    reach the program, so the file is refused rather than read with them."""
    with pytest.raises(ValueError, match="bash runs this line as a command of its own"):
        words(script, "run.sh")


def test_a_file_of_flags_only_is_read_as_written():
    assert [w for w, _ in words("--num-layers 8\n\n--seq-length 4096\n", "args.txt")] == \
        ["--num-layers", "8", "--seq-length", "4096"]


def test_an_arrays_words_keep_the_lines_they_were_written_on():
    script = "ARGS=(\n  --num-layers 4\n  --seq-length 4096 \\\n    --lr 1e-4\n)\nARGS+=(--bf16)\npython p.py \"${ARGS[@]}\"\n"
    got = dict(words(script, "run.sh"))
    assert (got["--num-layers"], got["--seq-length"], got["--lr"], got["--bf16"]) == (2, 3, 4, 6)


@pytest.mark.parametrize("seed", range(20))
def test_a_continued_commands_words_carry_their_own_lines(seed):
    """A launch continued over lines (``python p.py \\`` then a flag or more per line, now and then a
    quoted value over two lines): each word reports the line it starts on, found here by where its
    unique text first appears, so an error about a flag points at the line that gives it."""
    rng = random.Random(seed)
    text = "python p.py"
    for k in range(rng.randint(1, 12)):
        if rng.random() < 0.5:
            text += " \\\n "
        text += f' --flag-{k} ' + (f'"v{k}\nw{k}"' if rng.random() < 0.2 else f"{k}x")
    expected = {}
    for number, line in enumerate(text.split("\n"), 1):
        for word in line.split():
            if word.startswith("--"):
                expected.setdefault(word, number)
    got = {w: at for w, at in words(text + "\n", "run.sh") if w.startswith("--")}
    assert got == expected
