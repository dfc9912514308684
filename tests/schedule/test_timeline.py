"""gpuknap timeline: the schedule of a solved split, as numbers and as a picture."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from paths import EXAMPLES

from gpuknap.formats import load_spec
from gpuknap.schedule import simulate

DEMO = os.path.join(EXAMPLES, "demo.json")
INTERLEAVED = ["--capacity", "160GiB", "--micro-batches", "16", "--interleave", "2",
               "--counts", ",".join(["6"] * 15 + ["8"])]


def cli(*args):
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy"}
    return subprocess.run([sys.executable, "-m", "gpuknap", *args], capture_output=True, text=True, env=env)


def test_timeline_of_the_best_split_matches_a_simulation_of_its_plan():
    p = cli("timeline", DEMO, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)["timeline"]
    spec = load_spec(DEMO)
    names = spec.model.plan(out["counts"], spec.bucket)
    fwd, bwd, layer = [], [], 0
    for n in out["counts"]:  # per-stage sums of the plan's option times, computed apart
        opts = [next(o for o in spec.model.fronts[spec.model.kinds[i]] if o.name == names[i])
                for i in range(layer, layer + n)]
        fwd.append([sum(o.forward_time for o in opts)])
        bwd.append([sum(o.backward_time for o in opts)])
        layer += n
    want = simulate(fwd, bwd, spec.model.micro_batches)
    assert out["iteration_time"] == pytest.approx(want.iteration_time, rel=1e-12)
    assert out["peak_in_flight"] == [[min(16 - s, 32)] for s in range(16)]
    assert len(out["ops"]) == 2 * 16 * 32 and 0 < out["bubble"] < 1


def test_interleaved_timeline_and_picture(tmp_path):
    png = tmp_path / "t.png"
    p = cli("timeline", DEMO, *INTERLEAVED, "--plot", str(png), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)["timeline"]
    assert out["chunks"] == 2 and len(out["ops"]) == 2 * 8 * 2 * 16
    assert png.stat().st_size > 10_000
    human = cli("timeline", DEMO, *INTERLEAVED).stdout
    assert "bubble" in human and "peak in flight per chunk" in human


@pytest.mark.parametrize("args, words", [
    (["--micro-batches", "12", "--interleave", "2", "--counts", ",".join(["6"] * 15 + ["8"])], "multiple"),
    (["--interleave", "2", "--counts", "1,2,95"], "--counts"),
    (["--interleave", "2", "--micro-batches", "20"], "multiple of stages"),
    (["--p2p", "-1", "--counts", "98"], "p2p"),
])
def test_bad_timelines_exit_2_with_one_line(args, words):
    p = cli("timeline", DEMO, "--capacity", "160GiB", *args)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and words in lines[0], p.stderr


def test_timeline_without_counts_draws_the_best_interleaved_split():
    """``timeline --interleave v`` with no --counts takes best_splits(..., interleave=v, score='1f1b')."""
    from gpuknap import best_splits
    from gpuknap.formats import load_spec

    p = cli("timeline", DEMO, "--capacity", "160GiB", "--stages", "4", "--interleave", "2", "--json")
    assert p.returncode == 0, p.stderr
    spec = load_spec(DEMO, capacity="160GiB")
    want = best_splits(spec.model, 4, 1, "1f1b", spec.bucket, backend="numpy", interleave=2)[0][0]
    assert json.loads(p.stdout)["timeline"]["counts"] == list(want)
