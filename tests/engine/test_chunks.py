"""Chunks built with arrays (longest shared prefix with the sequence before) equal the
chunks of the node-by-node dict trie, level by level, whatever order the entries come in;
chunk plans made with integer arrays equal those made one sequence at a time."""
from __future__ import annotations

import random

import numpy as np
import pytest
from chunk_reference import build_chunk_by_dict, plan_chunks_by_loop

from gpuknap.engine import FrontTable, LayerOption
from gpuknap.engine._batch import Knapsack, build_chunk, plan_chunks, row_bytes


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


def random_problems(rng: random.Random, canonical: float) -> list:
    """Up to 120 problems over keys a-d: random runs, prefixes and extensions of earlier
    ones, repeats of earlier runs; a share ``1 - canonical`` with adjacent runs of one key
    left unmerged (steps equal to another sequence's, runs not)."""
    problems: list = []
    for i in range(rng.randint(1, 120)):
        runs = [((rng.choice("abcd"), rng.randint(1, 3)), rng.randint(1, 4)) for _ in range(rng.randint(1, 5))]
        if problems and rng.random() < 0.5:
            base = list(rng.choice(problems).runs)
            runs = base[:rng.randint(1, len(base))] + (runs[:rng.randint(0, 2)] if rng.random() < 0.7 else [])
        if problems and rng.random() < 0.1:
            runs = list(rng.choice(problems).runs)
        problems.append(Knapsack(canonical_runs(runs) if rng.random() < canonical else tuple(runs),
                                 rng.randint(0, 300), i))
    return problems


@pytest.mark.parametrize("seed", range(60))
def test_array_made_plans_equal_the_loop(seed):
    """The same chunks, sequences and readouts in the same order as the plan made one
    sequence at a time, under a loose limit, cache targets and limits that cut chains
    (half the seeds with some runs left unmerged); a row too wide for the limit is
    refused with the same message.  Where every sequence is canonical (as the engine
    makes them), the chunks built equal the dict trie's (unmerged runs give the array
    builder a node twice where the dict trie has it once)."""
    rng = random.Random(500 + seed)
    fronts = {k: [LayerOption(f"{k}{j}", rng.randint(0, 60), rng.uniform(0, 3), rng.uniform(0, 3))
                  for j in range(rng.randint(1, 4))] for k in "abcd"}
    table = FrontTable(fronts, 1.0)
    canonical = seed % 2 == 0
    problems = random_problems(rng, 1.0 if canonical else 0.8)
    widest = max(p.capacity for p in problems)
    for limit, target in ((2**30, None), (2**30, rng.choice([500, 4000, 20000])),
                          (row_bytes(widest) * rng.randint(1, 6), rng.choice([None, 3000]))):
        want = plan_chunks_by_loop(problems, limit, 1.0, target)
        got = plan_chunks(problems, limit, 1.0, target)
        assert got == want
        for entries in got if canonical else ():
            assert_same_chunk(build_chunk(entries, table), build_chunk_by_dict(entries, table))
    narrow = row_bytes(rng.randint(0, widest - 1)) if widest else 1
    with pytest.raises(ValueError) as want_error:
        plan_chunks_by_loop(problems, narrow, 1.0)
    with pytest.raises(ValueError) as got_error:
        plan_chunks(problems, narrow, 1.0)
    assert str(got_error.value) == str(want_error.value)
