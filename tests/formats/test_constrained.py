"""The framework-constrained search against brute force: every split and every setting the framework
can express, each scored by ``framework.evaluate`` (exact bytes), on tiny random models.

The brute force is written from the frameworks' rules directly (docs/training_settings.md), not from
the search's patterns: Megatron's one setting for every stage (none, selective modules, block N,
uniform N), MindFormers' first-layers counts per stage.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from gpuknap.engine import LayerOption
from gpuknap.formats import framework
from gpuknap.schedule import chunk_times, iteration_times
from gpuknap.search import PipelineModel, constrained_splits, score_of, with_grouped
from gpuknap.search import GROUPED

DENSE = ("NONE", "SLCT", "FULL")
MOE = ("NONE", "SLCT", "MOEACT", "SLCT+MOEACT", "FULL")
SAPP = ("NONE", "SLCT", "COMM", "BOTH", "FULL")


def tiny_model(seed: int, costed: bool, mixed: bool, decoders: int, m: int = 4) -> PipelineModel:
    """HEAD, ``decoders`` decoder layers (dense, or dense and MoE mixed), TAIL; integer bytes and
    dyadic times, so sums are exact."""
    rng = np.random.default_rng(seed)
    kinds = ["E"] + [("moe" if mixed and rng.random() < 0.5 else "dense") for _ in range(decoders)] + ["T"]
    if mixed and len(set(kinds)) < 4:
        kinds[1], kinds[2] = "dense", "moe"
    fronts = {"E": [LayerOption("HEAD", float(rng.integers(1, 8)), 1.0, 2.0)],
              "T": [LayerOption("TAIL", float(rng.integers(1, 8)), 2.0, 4.0, held_once=float(rng.integers(0, 20)))]}
    for kind in set(kinds) - {"E", "T"}:
        names = (MOE if kind == "moe" else DENSE) if costed else SAPP
        fwd = float(rng.integers(2, 9))
        opts = []
        for i, name in enumerate(names):  # later options: more recompute, less memory
            extra = 0.0 if name == "NONE" else float(rng.integers(1, 6)) * (1 + i) / 2
            mem = float(max(1, 40 - 7 * i + int(rng.integers(-3, 4))))
            opts.append(LayerOption(name, mem, fwd if costed else fwd + float(rng.integers(0, 2)),
                                    2 * fwd + extra))
        fronts[kind] = opts
    static = {k: float(rng.integers(0, 30)) for k in fronts}
    heavy = sum(static[k] for k in kinds) + 40 * len(kinds) * 2
    capacity = float(int(heavy * rng.uniform(0.25, 0.6)))
    return PipelineModel(kinds, fronts, static, capacity, m, 0.0, costs=object() if costed else None)


def compositions(total: int, parts: int):
    for cut in itertools.combinations(range(1, total), parts - 1):
        yield [b - a for a, b in zip((0,) + cut, cut + (total,))]


def decoder_positions(model, counts, chunks):
    """Per layer: its position among the decoder layers of its (virtual) stage, or None."""
    dec = [framework.roles(model)[j] == "t" for j in range(model.layers)]
    out, start = [], 0
    for n in counts:
        pos = 0
        for j in range(start, start + n):
            out.append(pos if dec[j] else None)
            pos += dec[j]
        start += n
    return out


def megatron_settings(model):
    """Every recompute Megatron can set, as a function (kind options, position) -> option name."""
    costed = model.costs is not None
    out = [lambda opts, p: "NONE"]
    if costed:
        for mods in ({"core_attn"}, {"moe_act"}, {"core_attn", "moe_act"}):
            def sel(opts, p, mods=mods):
                got = mods if "MOEACT" in opts else mods - {"moe_act"}
                return {frozenset(): "NONE", frozenset({"core_attn"}): "SLCT", frozenset({"moe_act"}): "MOEACT",
                        frozenset({"core_attn", "moe_act"}): "SLCT+MOEACT"}[frozenset(got)]
            out.append(sel)
    for n in range(1, model.layers + 1):
        out.append(lambda opts, p, n=n: "FULL" if p < n else "NONE")
        out.append(lambda opts, p, n=n: "FULL" if p % n == 0 else GROUPED)
    return out


def mindformers_stage_names(model, kinds, costed):
    """Every way MindFormers' counts run a stage's decoder layers (``kinds`` in order)."""
    n = len(kinds)
    seen = set()
    for r, sel, com in itertools.product(range(n + 1), repeat=3):
        if costed and (sel or com):
            continue
        names = tuple("FULL" if j < r else "BOTH" if j < sel and j < com else "SLCT" if j < sel
                      else "COMM" if j < com else "NONE" for j in range(n))
        if names not in seen:
            seen.add(names)
            yield names


def score_value(model, ev, names, counts, chunks, score):
    if score == "slowest":
        return ev.slowest
    if score == "1f1b":
        if chunks == 1:
            return score_of(ev.times, "1f1b", model.micro_batches)
        return ((chunks * model.micro_batches - 1) * ev.slowest + sum(ev.times)) / chunks
    t = chunk_times(model, counts, names, chunks)
    return float(iteration_times(np.array([t.forward]), np.array([t.backward]), model.micro_batches,
                                 "interleaved" if chunks > 1 else "1f1b")[0])


def brute(model, p, fw, score, chunks=1):
    """Every (split, setting) the framework runs, scored: sorted ``[(score, counts)]``."""
    gm = with_grouped(model)
    role = framework.roles(model)
    out, seen = [], set()
    for counts in compositions(model.layers, p * chunks):
        if fw == "megatron":
            pos = decoder_positions(model, counts, chunks)
            for rule in megatron_settings(model):
                names = [rule({o.name for o in model.fronts[k]}, q) if q is not None else model.fronts[k][0].name
                         for k, q in zip(model.kinds, pos)]
                try:
                    ev = framework.evaluate(gm, counts, names, None, chunks)
                except ValueError:
                    continue
                if ev.feasible and (tuple(counts), tuple(names)) not in seen:
                    seen.add((tuple(counts), tuple(names)))
                    out.append((score_value(gm, ev, names, counts, chunks, score), tuple(counts)))
        else:  # per stage, the fastest of its MindFormers settings that fits
            bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
            best_names = []
            for s in range(p):
                layers = range(bounds[s], bounds[s + 1])
                dec = [j for j in layers if role[j] == "t"]
                best = None
                for run in mindformers_stage_names(model, [model.kinds[j] for j in dec], model.costs is not None):
                    names = [model.fronts[model.kinds[j]][0].name for j in range(model.layers)]
                    for j, name in zip(dec, run):
                        names[j] = name
                    try:
                        ev = framework.evaluate(model, counts, names, None, 1)
                    except ValueError:
                        continue
                    if ev.memory[s] <= ev.budgets[s] and (best is None or ev.times[s] < best[0]):
                        best = (ev.times[s], [names[j] for j in layers])
                if best is None:
                    break
                best_names += best[1]
            else:
                ev = framework.evaluate(model, counts, best_names, None, 1)
                out.append((score_value(model, ev, best_names, counts, 1, score), tuple(counts)))
    return sorted(out)


def check(model, p, fw, score, chunks=1, top=3):
    want = brute(model, p, fw, score, chunks)
    got = constrained_splits(model, p, fw, top, score, bucket=1.0, backend="numpy", interleave=chunks)
    if not want:
        assert not got
        return False
    assert got, "the search found nothing, brute force found a plan"
    assert math.isclose(got[0][1], want[0][0], rel_tol=1e-12), (got[0][:2], want[:3])
    if fw == "megatron":  # plans are (split, setting) pairs: the same k best scores
        assert [round(v, 9) for _, v, *_ in got] == [round(v, 9) for v, _ in want[:len(got)]]
    for counts, value, choice, names, _ in got:  # each plan evaluates to its score and fits
        ev = framework.evaluate(with_grouped(model), list(counts), names, None, chunks)
        assert ev.feasible and choice.times == ev.times  # the choice is best_splits' third element
        assert math.isclose(score_value(with_grouped(model), ev, names, list(counts), chunks, score), value,
                            rel_tol=1e-12)
    return True


@pytest.mark.parametrize("score", ["slowest", "1f1b", "simulated"])
@pytest.mark.parametrize("costed, mixed", [(True, False), (True, True), (False, False)])
def test_megatron_search_is_exact_against_brute_force(score, costed, mixed):
    feasible = sum(check(tiny_model(seed, costed, mixed, 4 + seed % 3), 2 + seed % 2, "megatron", score)
                   for seed in range(12))
    assert feasible >= 4


@pytest.mark.parametrize("score", ["slowest", "1f1b"])
@pytest.mark.parametrize("costed, mixed", [(True, False), (True, True), (False, False)])
def test_mindformers_search_is_exact_against_brute_force(score, costed, mixed):
    feasible = sum(check(tiny_model(seed, costed, mixed, 4 + seed % 3), 2 + seed % 2, "mindformers", score, top=1)
                   for seed in range(12))
    assert feasible >= 4


@pytest.mark.parametrize("score", ["slowest", "1f1b"])
def test_interleaved_megatron_on_one_body_kind_is_exact(score):
    feasible = 0
    for seed in range(8):
        model = tiny_model(seed, seed % 2 == 0, False, 6, m=4)
        feasible += check(model, 2, "megatron", score, chunks=2, top=1)
    assert feasible >= 3


@pytest.mark.parametrize("name", ["megatron", "mindformers"])
def test_best_splits_framework_argument_is_the_constrained_search_and_never_beats_the_free_one(name):
    from gpuknap import best_splits
    feasible = 0
    for seed in range(8):
        model = tiny_model(seed, True, seed % 2 == 1, 5)
        via = best_splits(model, 2, top=3, score="1f1b", bucket=1, framework=name)
        direct = constrained_splits(model, 2, name, 3, "1f1b", bucket=1)
        assert [(e[0], e[1], e[3]) for e in via] == [(e[0], e[1], e[3]) for e in direct]
        # Megatron's uniform recompute keeps one input per group: an option the free search has
        # only on the model with that option added
        free = best_splits(with_grouped(model), 2, top=1, score="1f1b", bucket=1)
        if via:
            feasible += 1
            assert free and free[0][1] <= via[0][1]  # the framework's plans are a subset of all plans
    assert feasible >= 3
    model = tiny_model(0, True, False, 5)
    with pytest.raises(ValueError, match="framework"):
        best_splits(model, 2, framework=name, bound=True)
    with pytest.raises(ValueError):
        best_splits(model, 2, framework="deepspeed")
