"""Launch scripts read as bash passes their words, checked against bash itself: each script runs
``python pretrain_gpt.py ...`` with ``python`` replaced by a function that prints its arguments,
and gpuknap's flags must be bash's, in order (skipped where bash is not installed)."""
from __future__ import annotations

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
