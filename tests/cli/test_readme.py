"""Every ``$ gpuknap ...`` example in the README runs from a clean clone: exit 0 (or 1 where
the README shows that nothing is feasible), never an error."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def readme_commands() -> list[str]:
    with open(os.path.join(ROOT, "README.md")) as fh:
        lines = fh.read().splitlines()
    out = []
    for line in lines:
        m = re.match(r"^\$ (gpuknap .*)$", line)
        if m:  # drop comments, pipes into other tools and '; echo $?'
            command = re.split(r"\s+#|\s\|\s|;", m.group(1))[0].strip()
            out.append(command)
    return out


COMMANDS = readme_commands()


def test_the_readme_has_examples():
    assert len(COMMANDS) >= 6


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_example_runs(command, tmp_path):
    os.symlink(os.path.join(ROOT, "gpuknap"), tmp_path / "gpuknap")  # the clone's relative paths
    argv = shlex.split(command)[1:]
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy"}
    p = subprocess.run([sys.executable, "-m", "gpuknap", *argv], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode in (0, 1), (command, p.stderr)
    assert all(line.startswith("note: ") for line in p.stderr.splitlines()), p.stderr  # no warnings, no errors
    if p.returncode == 1:
        assert "no feasible split" in p.stdout
    for flag in ("--out", "--plot"):
        if flag in argv:
            assert (tmp_path / argv[argv.index(flag) + 1]).stat().st_size > 0


def test_readme_python_blocks_run(tmp_path):
    """Every ```python block of the README runs as written, from a clean clone's root."""
    with open(os.path.join(ROOT, "README.md")) as fh:
        blocks = re.findall(r"```python\n(.*?)```", fh.read(), re.S)
    assert blocks
    os.symlink(os.path.join(ROOT, "gpuknap"), tmp_path / "gpuknap")
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy"}
    for block in blocks:
        p = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
