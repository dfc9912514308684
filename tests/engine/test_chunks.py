"""Chunks built with arrays (longest shared prefix with the sequence before) equal the
chunks of the node-by-node dict trie, level by level, whatever order the entries come in."""
from __future__ import annotations

import random

import numpy as np
import pytest
from chunk_reference import build_chunk_by_dict

from gpuknap.engine import FrontTable, LayerOption
from gpuknap.engine._batch import Knapsack, build_chunk, plan_chunks


def assert_same_chunk(a, b) -> None:
    assert a.root_width == b.root_width
    assert len(a.levels) == len(b.levels)
    for x, y in zip(a.levels, b.levels):
        assert np.array_equal(x.parent, y.parent) and x.width == y.width
        assert [(s.start, s.stop, s.source, s.weights.tolist(), s.times.tolist()) for s in x.segments] == \
               [(s.start, s.stop, s.source, s.weights.tolist(), s.times.tolist()) for s in y.segments]
        for name in ("read_rows", "read_cols", "read_ids"):
            assert np.array_equal(getattr(x, name), getattr(y, name)), name


def canonical_runs(runs: list) -> tuple:
    merged: list = []
    for key, n in runs:
        if merged and merged[-1][0] == key:
            merged[-1][1] += n
        else:
            merged.append([key, n])
    return tuple((k, n) for k, n in merged)


@pytest.mark.parametrize("seed", range(40))
def test_array_built_chunks_equal_the_dict_trie(seed):
    rng = random.Random(seed)
    fronts = {k: [LayerOption(f"{k}{j}", rng.randint(0, 60), rng.uniform(0, 3), rng.uniform(0, 3))
                  for j in range(rng.randint(1, 4))] for k in "abcd"}
    table = FrontTable(fronts, 1.0)
    problems = []
    for i in range(rng.randint(1, 70)):
        runs = [((rng.choice("abcd"), rng.randint(1, 3)), rng.randint(1, 4)) for _ in range(rng.randint(1, 4))]
        if problems and rng.random() < 0.3:  # a prefix or an extension of an earlier sequence
            base = list(rng.choice(problems).runs)
            runs = base[:rng.randint(1, len(base))] + (runs[:1] if rng.random() < 0.5 else [])
        problems.append(Knapsack(canonical_runs(runs), rng.randint(0, 300), i))
    for entries in plan_chunks(problems, 2**30, 1.0, target=rng.choice([2**30, 4000])):
        assert_same_chunk(build_chunk(entries, table), build_chunk_by_dict(entries, table))
        shuffled = list(entries)
        rng.shuffle(shuffled)
        assert_same_chunk(build_chunk(shuffled, table), build_chunk_by_dict(shuffled, table))
