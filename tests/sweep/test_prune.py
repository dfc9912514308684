"""Certified pruning across configurations: ``sweep(top=N)`` against the first N rows of the full
sweep (dense, MoE, callables with exact ties), the bound against every searched row, the tie rule,
and the grid's new keys (CP, EP, ETP, devices)."""
from __future__ import annotations

import json
import random
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import EXAMPLES

from gpuknap import LayerOption, PipelineModel, sweep
from gpuknap.sweep import GRID_KEYS, MAX_CONFIGS_TOP, builder_of, expand, lower_bounds, order_rows
from gpuknap.sweep._prune import TIME_KEYS, fastest_seconds

LLAMA = os.path.join(EXAMPLES, "llama2_70b.json")
MIXTRAL = os.path.join(EXAMPLES, "mixtral_8x7b_config.json")
MIB, GIB = 2**20, 2**30


def same_rows(got, want):
    """Rows equal, floats to the bit (the pruned sweep searches the same configurations alone)."""
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


def check_top(source, grid, tops, **kw):
    full = sweep(source, grid, backend="numpy", **kw)
    assert full.top is None and full.pruned == 0
    for n in tops:
        got = sweep(source, grid, backend="numpy", top=n, **kw)
        same_rows(got.rows, full.rows[:n])
        assert got.searched + got.pruned <= full.searched and got.top == n
    return full


def test_top_equals_the_first_rows_of_the_full_sweep_dense():
    grid = {"stages": [1, 2, 4, 8], "tensor_parallel": [2, 4, 8], "micro_batch_size": [1, 2], "interleave": [1, 2]}
    full = check_top(LLAMA, grid, [1, 3, 10], gpus=64, global_batch=128, bucket=16 * MIB, device="h100")
    pruned = sweep(LLAMA, grid, backend="numpy", top=1, gpus=64, global_batch=128, bucket=16 * MIB, device="h100")
    assert pruned.pruned > 0 and pruned.searched < full.searched


def test_top_equals_the_first_rows_of_the_full_sweep_moe():
    grid = {"stages": [1, 2, 4], "tensor_parallel": [1, 2], "expert_parallel": [1, 2, 4, 8],
            "expert_tensor_parallel": [1, None], "micro_batch_size": [1, 2]}
    check_top(MIXTRAL, grid, [1, 5, 12], gpus=32, global_batch=128, seq=4096, device="h100", bucket=16 * MIB)


def test_top_with_splits_per_configuration_and_context_parallel():
    grid = {"stages": [2, 4], "tensor_parallel": [4, 8], "context_parallel": [1, 2], "interleave": [1, 2]}
    check_top(LLAMA, grid, [2, 7], gpus=64, global_batch=64, bucket=16 * MIB, top_splits=2, device="h200")


def _tied(config):
    """A callable source with exact ties: a micro-batch takes 1/M (powers of two: exact sums), so
    one stage's iteration time is the same for every TP and micro-batch size; memory differs."""
    t = 1.0 / config["micro_batches"]
    keep = LayerOption("keep", 3e9 * config["micro_batch_size"] / config["tensor_parallel"], t, 2 * t)
    full = LayerOption("full", 1e9, t, 3 * t)
    return PipelineModel(["x"] * 16, {"x": [keep, full]}, {"x": 2e9 / config["tensor_parallel"]}, 40e9,
                         config["micro_batches"])


def test_top_with_exact_ties_follows_the_tie_rule():
    grid = {"stages": [1, 2, 4], "tensor_parallel": [1, 2, 4], "micro_batch_size": [1, 2]}
    full = check_top(_tied, grid, [1, 2, 4, 9], gpus=16, global_batch=64)
    feasible = [r for r in full.rows if r["feasible"]]
    ties = 0
    for a, b in zip(feasible, feasible[1:]):
        sa, sb = a["throughput"]["samples_per_second"], b["throughput"]["samples_per_second"]
        assert sa >= sb
        if sa == sb:
            ties += 1
            key = lambda r: (r["idle_share"], max(r["peak_memory_bytes"]), r["config"]["tensor_parallel"])  # noqa: E731
            assert key(a) <= key(b)
    assert ties >= 2


def test_order_rows_tie_rule_on_hand_made_rows():
    def row(tp, idle, peak, speed=10.0):
        c = {"stages": 2, "tensor_parallel": tp}
        return {"config": c, "rank": 1, "feasible": True, "throughput": {"samples_per_second": speed},
                "idle_share": idle, "peak_memory_bytes": [peak, peak / 2]}

    rows = [row(4, 0.1, 5), row(2, 0.1, 5), row(1, 0.1, 6), row(8, 0.05, 9), row(1, 0.0, 1, speed=9.0)]
    configs = [r["config"] for r in rows]
    got = [(r["config"]["tensor_parallel"], r["idle_share"]) for r in order_rows(rows, configs)]
    assert got == [(8, 0.05), (2, 0.1), (4, 0.1), (1, 0.1), (1, 0.0)]


def _random_model(seed):
    import random
    rng = random.Random(seed)
    kinds = [rng.choice("ab") for _ in range(rng.randint(4, 14))]
    fronts = {}
    for k in "ab":
        opts = []
        for i in range(rng.randint(1, 3)):
            f = rng.uniform(0.5, 3.0)
            opts.append(LayerOption(f"o{i}", rng.uniform(0.2, 3.0) * 1e9, f, f * rng.uniform(1.5, 3.0)))
        fronts[k] = opts
    static = {k: rng.uniform(0.1, 2.0) * 1e9 for k in "ab"}
    return kinds, fronts, static, rng.uniform(12, 40) * 1e9


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6))
def test_the_bound_is_below_every_searched_row(seed):
    kinds, fronts, static, capacity = _random_model(seed)

    def build(config):
        scale = 1.0 / config["tensor_parallel"]
        f = {k: [LayerOption(o.name, o.per_micro_batch * config["micro_batch_size"], o.forward_time * scale,
                             o.backward_time * scale * config["micro_batch_size"]) for o in v]
             for k, v in fronts.items()}
        return PipelineModel(kinds, f, static, capacity, config["micro_batches"])

    grid = {"stages": [1, 2, 3, 4], "tensor_parallel": [1, 2], "micro_batch_size": [1, 2], "interleave": [1, 2]}
    configs, _ = expand(grid, 24, 48)
    bounds, errors = lower_bounds(configs, build, 1e-3)
    result = sweep(build, grid, gpus=24, global_batch=48, backend="numpy")
    where = {json.dumps(c, sort_keys=True): i for i, c in enumerate(configs)}
    for r in result.rows:
        if r["feasible"]:
            i = where[json.dumps(r["config"], sort_keys=True)]
            assert bounds[i] <= r["iteration_time_s"], (r["config"], bounds[i], r["iteration_time_s"])
    for n in (1, 3):
        same_rows(sweep(build, grid, gpus=24, global_batch=48, backend="numpy", top=n).rows, result.rows[:n])


@pytest.mark.parametrize("source, kw, grid", [
    (LLAMA, dict(gpus=256, global_batch=256), {"stages": [1, 2, 4, 5, 8, 10, 16], "tensor_parallel": [1, 2, 4],
                                                "micro_batch_size": [1, 2], "interleave": [1, 2, 4]}),
    (MIXTRAL, dict(gpus=64, global_batch=256, seq=4096),
     {"stages": [1, 2, 4, 8], "tensor_parallel": [1, 2], "expert_parallel": [1, 2, 8], "interleave": [1, 2]})])
def test_lazy_bounds_come_out_in_the_order_of_the_tight_ones(source, kw, grid):
    """The queue refines a bound only when its cheap bound comes first, and tightens it only when
    its refined bound does and a cutoff is set: cheap <= refined <= tight; under a cutoff the
    configurations come out in the order of the tight bounds (then fewer chunks, then grid
    order), each exactly when its tight bound is within it; with no cutoff yet (inf) nothing can
    be pruned, so none is tightened and they come out in the order of the refined bounds."""
    from gpuknap.sweep._prune import Bounds, _Queue

    builder, _, _, _ = builder_of(source, None, None, kw.get("seq"), 16 * MIB, {"device": "h100"})
    configs, _ = expand(grid, kw["gpus"], kw["global_batch"], builder.layers)
    bounds = Bounds(configs, builder, 1e-3)
    first = np.array([math.inf if i in bounds.errors else bounds.refined(i) for i in range(len(configs))])
    refined = np.array([math.inf if i in bounds.errors else bounds.tight(i) for i in range(len(configs))])
    ok = np.isfinite(refined)
    assert ok.sum() > 20 and (bounds.cheap[ok] <= first[ok]).all() and (first[ok] <= refined[ok]).all()
    chunks = np.array([c["interleave"] for c in configs])
    want = [i for i in np.lexsort((np.arange(len(configs)), chunks, refined)).tolist() if ok[i]]
    unset = [i for i in np.lexsort((np.arange(len(configs)), chunks, first)).tolist() if ok[i]]
    queue = _Queue(Bounds(configs, builder, 1e-3))
    assert [queue.next(math.inf) for _ in unset] == unset and queue.next(math.inf) is None
    cutoff = float(np.median(refined[ok]))
    queue = _Queue(Bounds(configs, builder, 1e-3))
    got = []
    while (i := queue.next(cutoff)) is not None:
        got.append(i)
    assert got == [i for i in want if refined[i] <= cutoff] and len(queue) == len(want) - len(got)


def test_one_model_per_group_gives_every_configuration_its_own_fastest_time():
    """The bound builds one model per TIME_KEYS group: a layer's times must not depend on P, DP or M."""
    builder, _, _, _ = builder_of(MIXTRAL, None, None, 4096, 16 * MIB, {"device": "h100"})
    grid = {"stages": [1, 2, 4, 8], "tensor_parallel": [1, 2, 4], "expert_parallel": [1, 8],
            "expert_tensor_parallel": [1, None], "micro_batch_size": [1, 2]}
    configs, _ = expand(grid, 128, 512)
    groups = {}
    checked = 0
    for c in configs:
        try:
            own = fastest_seconds(builder(dict(c)), 1e-3)
        except ValueError:
            continue
        key = tuple(c[k] for k in TIME_KEYS)
        assert groups.setdefault(key, own) == own
        checked += 1
    assert checked > 40 and len(groups) < checked


def test_mixtral_on_64_h100s_ep_8_inside_a_node_wins_and_why():
    grid = {"stages": [1, 2, 4], "tensor_parallel": [1, 2], "expert_parallel": [1, 2, 4, 8],
            "expert_tensor_parallel": [1, 2], "micro_batch_size": [1]}
    result = sweep(MIXTRAL, grid, gpus=64, global_batch=256, seq=4096, device="h100", backend="numpy", top=40)
    best = result.best["config"]
    assert best["expert_parallel"] == 8 and best["expert_tensor_parallel"] * 8 <= 8  # one node of 8 GPUs
    rows = {(r["config"]["stages"], r["config"]["tensor_parallel"], r["config"]["expert_parallel"],
             r["config"]["expert_tensor_parallel"]): r for r in result.rows if r["feasible"]}
    win = result.best
    # why: fewer experts per GPU than EP 4 (less compute and memory per device) ...
    smaller = [r for k, r in rows.items() if k[2] == 4 and k[:2] == (best["stages"], best["tensor_parallel"])]
    assert smaller and all(win["iteration_time_s"] < r["iteration_time_s"] for r in smaller)
    # ... and the all-to-all of an EP group inside a node costs less than one spanning two nodes
    across = [r for k, r in rows.items() if k[2] * k[3] > 8]
    assert across and all(r["breakdown"]["ep"] > win["breakdown"]["ep"] for r in across)
    assert win["breakdown"]["ep"] > 0 and win["mfu"] < 0.73


def test_infeasible_rows_say_which_stage_and_how_much_over():
    grid = {"stages": [1, 2], "tensor_parallel": [1, 2]}
    result = sweep(LLAMA, grid, gpus=8, global_batch=64, capacity="8GiB", backend="numpy", top=4)
    assert result.best is None and result.rows
    for r in result.rows:
        assert "GiB over the 8.0 GiB device" in r["reason"] and r["reason"].startswith("stage ")


def test_grid_keys_devices_and_megatron_rules():
    grid = {"stages": [2], "tensor_parallel": [2, 4], "context_parallel": [1, 2], "expert_parallel": [1, 16],
            "expert_tensor_parallel": [1], "device": ["h100", "a100-80gb"]}
    valid, skipped = expand(grid, 16, 64)
    assert {c["device"] for c in valid} == {"h100", "a100-80gb"}
    assert all(set(c) >= set(GRID_KEYS) for c in valid)
    assert any("does not divide the 8 ranks" in s["reason"] for s in skipped)  # EP 16 over P 2 x 8 ranks
    for bad, words in (({"device": ["h900"]}, "h900"), ({"context_parallel": {"a": 1}}, "list"),
                       ({"expert_paralel": [2]}, "did you mean"), ({"stages": [1]}, None)):
        if words is None:
            continue
        with pytest.raises(ValueError, match=words):
            expand(bad, 8, 8)
    with pytest.raises(ValueError, match="both"):
        sweep(MIXTRAL, {"expert_parallel": [2]}, gpus=8, global_batch=8, seq=4096, expert_parallel=2)
    with pytest.raises(ValueError, match="2 x CP|2 x the context-parallel"):
        sweep(MIXTRAL, {"context_parallel": [3]}, gpus=3, global_batch=3, seq=4095, top=1)


def test_a_grid_of_over_100000_configurations_is_taken_with_top():
    grid = {"stages": list(range(1, 49)), "tensor_parallel": [1, 2, 4, 8], "context_parallel": [1, 2, 4],
            "micro_batch_size": [1, 2, 4, 8], "interleave": [1, 2, 3, 4, 5], "expert_parallel": [1, 2, 4, 8, 16],
            "expert_tensor_parallel": [1, 2]}
    total = math.prod(len(v) for v in grid.values())
    assert 100_000 <= total <= MAX_CONFIGS_TOP
    valid, skipped = expand(grid, 1920, 3840, limit=MAX_CONFIGS_TOP)
    assert len(valid) + len(skipped) == total
    with pytest.raises(ValueError, match="give top="):
        expand(grid, 1920, 3840)


def cli(*args):
    env = {**os.environ, "GPUKNAP_BACKEND": "numpy"}
    return subprocess.run([sys.executable, "-m", "gpuknap", "sweep", *args], capture_output=True, text=True, env=env)


def test_cli_top_all_lists_and_pruned_count(tmp_path):
    args = [MIXTRAL, "--gpus", "32", "--global-batch", "128", "--seq", "4096", "--device", "h100,h200",
            "--stages", "1,2", "--tp", "1,2", "--ep", "4,8", "--etp", "1", "--bucket", "16MiB", "--quiet"]
    top = cli(*args, "--top", "3", "--json", "--plot", str(tmp_path / "top.png"))
    assert top.returncode == 0, top.stderr
    out = json.loads(top.stdout)
    assert len(out["rows"]) == 3 and out["top"] == 3 and out["searched"] + out["pruned"] >= 8
    every = cli(*args, "--all", "--json", "--plot", str(tmp_path / "all.png"))
    assert every.returncode == 0, every.stderr
    full = json.loads(every.stdout)
    assert out["rows"] == full["rows"][:3] and full["pruned"] == 0 and full["top"] is None
    assert {r["config"]["device"] for r in full["rows"]} == {"h100", "h200"}
    text = cli(*args, "--top", "2")
    assert "pruned by bound" in text.stdout and "EP=" in text.stdout and "h200" in text.stdout + "h100"
    assert (tmp_path / "top.png").stat().st_size > 10_000 and (tmp_path / "all.png").stat().st_size > 10_000


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6))
def test_whole_layer_bound_is_below_the_simulated_1f1b_time_of_every_split(seed):
    """Brute force: every split of a few layers with random forward and backward times, each
    simulated as Megatron's 1F1B schedule; the bound from the layers' times is never above the best."""
    import itertools
    from gpuknap.schedule import iteration_times
    from gpuknap.sweep._prune import span_bound, whole_layer_bound
    rng = random.Random(seed)
    layers, stages, m = rng.randint(2, 9), rng.randint(1, 5), rng.choice([1, 2, 3, 5, 8, 16])
    stages = min(stages, layers)
    fwd = [rng.choice([0.25, 0.5, 1.0, 3.0]) * rng.uniform(0.5, 2.0) for _ in range(layers)]
    bwd = [f * rng.uniform(1.0, 3.0) for f in fwd]
    prefix = np.concatenate(([0.0], np.cumsum([f + b for f, b in zip(fwd, bwd)])))
    splits = [(0,) + cut + (layers,) for cut in itertools.combinations(range(1, layers), stages - 1)]
    f = np.array([[[sum(fwd[a:b])] for a, b in zip(s, s[1:])] for s in splits])
    b = np.array([[[sum(bwd[a:b])] for a, b in zip(s, s[1:])] for s in splits])
    best = float(iteration_times(f, b, m, "1f1b").min())
    bound = whole_layer_bound(prefix, stages, m)
    assert span_bound(float(prefix[-1]), stages, 1, m) * (1 - 1e-9) <= bound <= best * (1 + 1e-12)
    # sends between stages: on every path, so the bound with them is still below the best
    send = rng.choice([0.05, 0.3, 2.0])
    best_sent = float(iteration_times(f, b, m, "1f1b", send).min())
    sent = whole_layer_bound(prefix, stages, m, send=send)
    assert bound * (1 - 1e-9) <= sent <= best_sent * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6))
def test_interleaved_bound_is_below_the_simulated_time_of_every_interleaved_split(seed):
    """Brute force: every interleaved split (chunk-major, every chunk at least one layer) of a few
    layers, simulated in Megatron's interleaved order; the bound is never above the best."""
    import itertools
    from gpuknap.schedule import iteration_times
    from gpuknap.sweep._prune import interleaved_bound, span_bound
    rng = random.Random(seed)
    p, v = rng.randint(2, 3), rng.randint(2, 3)
    layers, m = rng.randint(p * v, min(10, p * v + 3)), p * rng.choice([1, 2, 3, 4])
    fwd = [rng.choice([0.25, 0.5, 1.0, 3.0]) * rng.uniform(0.5, 2.0) for _ in range(layers)]
    bwd = [f * rng.uniform(1.0, 3.0) for f in fwd]
    prefix = np.concatenate(([0.0], np.cumsum([f + b for f, b in zip(fwd, bwd)])))
    splits = [(0,) + cut + (layers,) for cut in itertools.combinations(range(1, layers), p * v - 1)]

    def per_chunk(times):
        out = np.zeros((len(splits), p, v))
        for i, s in enumerate(splits):
            for j, (a, b) in enumerate(zip(s, s[1:])):
                out[i, j % p, j // p] = sum(times[a:b])
        return out

    best = float(iteration_times(per_chunk(fwd), per_chunk(bwd), m, "interleaved").min())
    bound = interleaved_bound(prefix, p, v, m)
    assert span_bound(float(prefix[-1]), p, v, m) * (1 - 1e-9) <= bound <= best * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_busiest_device_is_below_every_assignment_of_layers_to_devices(seed):
    """Brute force: every way of giving whole layers to devices (contiguous or not); the bound on
    the busiest device's work equals the best (at most 3 layers differ from the others here)."""
    import itertools
    from gpuknap.sweep._prune import busiest_device
    rng = random.Random(seed)
    devices = rng.randint(1, 4)
    body = rng.choice([1.0, 0.7, 3.0])
    times = [body] * rng.randint(1, 7) + [rng.choice([0.1, 0.5, body * 1.5, 2.5]) for _ in range(rng.randint(0, 3))]
    rng.shuffle(times)
    best = min(max(sum(t for t, d in zip(times, who) if d == k) for k in range(devices))
               for who in itertools.product(range(devices), repeat=len(times)))
    bound = busiest_device(np.array(times), devices)
    assert bound <= best * (1 + 1e-12)
    assert math.isclose(bound, best, rel_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_interleaved_path_factor_is_below_the_simulated_time_of_any_chunk_times(seed):
    """The bubble bound holds for every split, whole layers or not: random per-chunk forward and
    backward times (some chunks empty, any forward/backward ratio), simulated in the interleaved
    orders (current Megatron with its group sizes, and the legacy order); F z never above."""
    from gpuknap.schedule import iteration_times
    from gpuknap.sweep._bounds import interleaved_path_factor, interleaved_path_sends
    rng = np.random.default_rng(seed)
    p, v = int(rng.integers(2, 6)), int(rng.integers(2, 5))
    schedule = "interleaved-legacy" if rng.random() < 0.25 else "interleaved"
    m = p * int(rng.integers(1, 5))
    group = None
    if schedule == "interleaved" and rng.random() < 0.4:
        group = int(rng.integers(p, m + 1))
        m = max(m, group)
        if 0 < m % group < p:
            m += p - m % group
    z = interleaved_path_factor(p, v, m, schedule, group)
    fwd = rng.uniform(0.0, 2.0, (200, p, v)) * (rng.random((200, p, v)) < 0.85)
    bwd = fwd * rng.uniform(0.5, 3.0, (200, p, v)) + rng.uniform(0.0, 0.2, (200, p, v))
    simulated = iteration_times(fwd, bwd, m, schedule, 0.0, group)
    assert (z * (fwd + bwd).sum(axis=(1, 2)) <= simulated * (1 + 1e-12)).all()
    # with sends between stages: each weighted path crosses its virtual stages' boundaries twice
    h, send = interleaved_path_sends(p, v, m, schedule, group), float(rng.uniform(0.01, 1.0))
    assert 0 < h <= 2 * (p * v - 1)
    sent = iteration_times(fwd, bwd, m, schedule, send, group)
    assert (z * (fwd + bwd).sum(axis=(1, 2)) + h * send <= sent * (1 + 1e-12)).all()
    # it sees the bubble: above the busiest device's even share, below equal chunks' time
    equal = np.ones((1, p, v))
    assert m / p < z <= float(iteration_times(equal, 2 * equal, m, schedule, 0.0, group)[0]) / (3 * p * v) * (1 + 1e-12)


def test_interleaved_bounds_in_the_sweep_use_the_bubble_factor():
    """Every interleaved configuration's refined bound is at least its factor times F (it sees the
    bubble); a schedule that cannot be built gives no factor rather than an error."""
    from gpuknap.sweep._bounds import fastest_prefix_seconds, interleaved_path_factor
    kinds, fronts, static, capacity = _random_model(7)

    def build(config):
        return PipelineModel(kinds, fronts, static, capacity, config["micro_batches"])

    configs, _ = expand({"stages": [2, 4], "micro_batch_size": [1, 2], "interleave": [2]}, 16, 64)
    bounds, errors = lower_bounds(configs, build, 1e-3)
    assert configs and not errors
    for c, b in zip(configs, bounds):
        z = interleaved_path_factor(c["stages"], 2, c["micro_batches"])
        total = float(fastest_prefix_seconds(build(c), 1e-3)[-1])
        assert z > c["micro_batches"] / c["stages"] and b >= z * total * (1 - 2e-9)
    assert interleaved_path_factor(4, 2, 6) == 0.0  # M not a multiple of P: no order, no factor


def _small_split_model(rng: random.Random, kinds: list, fronts: dict, static: dict, least_gb: float,
                       most_groups: int) -> tuple:
    """``(model, P, v, M)`` for the brute-force memory tests: 1-3 stages, one chunk or two (two
    only when P > 1 and every virtual stage can hold a layer), M a multiple of P."""
    p, v = rng.randint(1, 3), rng.choice([1, 2])
    if p * v > len(kinds) or p == 1:
        v = 1
    m = p * rng.randint(1, most_groups)
    capacity = rng.uniform(least_gb, least_gb + 10) * 1e9
    return PipelineModel(kinds, fronts, static, capacity, m, reserved=rng.uniform(0, 1e9)), p, v, m


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10**6))
def test_fitting_seconds_is_below_every_split_that_fits(seed):
    """Brute force on small models: every assignment of options to layers that some split (one
    chunk or two) holds within every device's memory takes at least ``fitting_seconds`` in all."""
    import itertools
    from gpuknap.sweep._bounds import fitting_seconds
    rng = random.Random(seed)
    layers = rng.randint(3, 6)
    kinds = [rng.choice("ab") for _ in range(layers)]
    fronts = {k: [LayerOption(f"o{i}", rng.uniform(0.5, 2.0) * 1e9 / (i + 1), f, 2 * f, held_once=rng.uniform(0, 1e9),
                              excess=((2, rng.uniform(0, 0.3e9)),))  # slower options mostly lighter
                  for i, f in enumerate(sorted(rng.uniform(0.5, 3.0) for _ in range(rng.randint(1, 3))))]
              for k in "ab"}
    static = {k: rng.uniform(0.1, 1.0) * 1e9 for k in "ab"}
    model, p, v, m = _small_split_model(rng, kinds, fronts, static, 4, 2)
    bound = fitting_seconds(model, p, v, 1.0)
    table = model.in_flight_table(p, v)
    room = model.capacity - model.reserved
    splits = [(0,) + cut + (layers,) for cut in itertools.combinations(range(1, layers), p * v - 1)]
    fits_any = False
    for choice in itertools.product(*[range(len(fronts[k])) for k in kinds]):
        options = [fronts[k][i] for k, i in zip(kinds, choice)]
        for s in splits:
            used = [0.0] * p
            for j, (a, b) in enumerate(zip(s, s[1:])):
                for layer in range(a, b):
                    used[j % p] += static[kinds[layer]] + options[layer].memory(table[j % p][j // p])
            if all(u <= room for u in used):
                fits_any = True
                assert bound is not None and bound <= sum(o.time for o in options) * (1 + 1e-12)
                break
    assert fits_any or bound is None or bound > 0  # no split fits: a bound is allowed (a relaxation)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6))
def test_memory_path_bound_is_below_every_split_that_fits(seed):
    """Brute force on small embedding/body/output models: every split (one chunk or two) and
    every assignment of options that fits every device's memory in exact bytes simulates (its
    schedule, no sends) to at least the bound."""
    import itertools
    pytest.importorskip("scipy")
    from gpuknap.schedule import iteration_times
    from gpuknap.sweep._lpbound import memory_path_bound
    rng = random.Random(seed)
    body = rng.randint(2, 5)
    kinds = ["h"] + ["b"] * body + ["t"]

    def options(n):
        return [LayerOption(f"o{i}", rng.uniform(0.5, 2.0) * 1e9 / (i + 1), f, f * rng.uniform(1.5, 3.0),
                            held_once=rng.uniform(0, 1e9), excess=((2, rng.uniform(0, 0.3e9)),))
                for i, f in enumerate(sorted(rng.uniform(0.5, 3.0) for _ in range(n)))]

    fronts = {"h": options(rng.randint(1, 2)), "b": options(rng.randint(1, 3)), "t": options(rng.randint(1, 2))}
    static = {k: rng.uniform(0.1, 1.0) * 1e9 for k in "hbt"}
    model, p, v, m = _small_split_model(rng, kinds, fronts, static, 3, 3)
    bound = memory_path_bound(model, p, v, 1.0)
    table = model.in_flight_table(p, v)
    room = model.capacity - model.reserved
    layers = len(kinds)
    fwd, bwd = [], []
    for cut in itertools.combinations(range(1, layers), p * v - 1):
        s = (0,) + cut + (layers,)
        for choice in itertools.product(*[range(len(fronts[k])) for k in kinds]):
            opts = [fronts[k][i] for k, i in zip(kinds, choice)]
            used, f, b = [0.0] * p, np.zeros((p, v)), np.zeros((p, v))
            for j, (lo, hi) in enumerate(zip(s, s[1:])):
                for layer in range(lo, hi):
                    used[j % p] += static[kinds[layer]] + opts[layer].memory(table[j % p][j // p])
                    f[j % p, j // p] += opts[layer].forward_time
                    b[j % p, j // p] += opts[layer].backward_time
            if all(u <= room for u in used):
                fwd.append(f)
                bwd.append(b)
    if fwd:
        simulated = iteration_times(np.array(fwd), np.array(bwd), m, "interleaved" if v > 1 else "1f1b")
        assert bound <= float(simulated.min()) * (1 + 1e-9)


def test_memory_path_bound_sees_memory_the_other_bounds_miss():
    """On the Llama-2-70B example at P=2, v=4, TP=4, 1,024 H100s (memory pushes layers to later
    chunks), the tightened bound is well above the refined one and still below the row."""
    pytest.importorskip("scipy")
    from gpuknap.sweep._prune import Bounds
    builder, _, bucket, _ = builder_of(LLAMA, None, None, None, 16 * MIB, {"device": "h100"})
    configs, _ = expand({"stages": [2], "tensor_parallel": [4], "micro_batch_size": [1], "interleave": [4]},
                        1024, 1024, builder.layers)
    bounds = Bounds(configs, builder, 1e-3)
    row = sweep(LLAMA, {"stages": [2], "tensor_parallel": [4], "micro_batch_size": [1], "interleave": [4]},
                gpus=1024, global_batch=1024, device="h100", backend="numpy").rows[0]
    assert bounds.refined(0) * 1.05 < bounds.tight(0) <= row["iteration_time_s"]


def test_memory_path_bound_without_scipy_gives_no_bound(monkeypatch):
    """SciPy is an optional extra: without it the bound is 0.0 (the sweep prunes less, same rows)."""
    from gpuknap.sweep._lpbound import memory_path_bound
    builder, _, _, _ = builder_of(LLAMA, None, None, None, 16 * MIB, {"device": "h100"})
    configs, _ = expand({"stages": [2], "tensor_parallel": [4], "micro_batch_size": [1], "interleave": [4]},
                        1024, 1024, builder.layers)
    model = builder(dict(configs[0]))
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)
    assert memory_path_bound(model, 2, 4, 1e-3) == 0.0


def test_programs_are_solved_only_on_a_grid_with_a_costly_search(monkeypatch):
    """The linear programs (and SciPy's import) are for grids where some exact interleaved search
    enumerates many chunk tuples: on the Mixtral example (32 layers, v=2) none is solved and the
    tight bound is the refined one; add P=2, v=4 on the Llama example and they are."""
    import importlib

    prune = importlib.import_module("gpuknap.sweep._prune")
    from gpuknap.sweep._lpbound import COSTLY_TUPLES, worth_solving

    assert not worth_solving(80, 2, 1) and not worth_solving(32, 2, 2) and not worth_solving(8, 4, 4)
    assert worth_solving(80, 2, 4) and worth_solving(80, 4, 4) and not worth_solving(80, 8, 4)
    assert math.comb(80 // 4 - 1, 3) >= COSTLY_TUPLES > math.comb(80 // 8 - 1, 3)
    solved = []
    monkeypatch.setattr(prune, "memory_path_bound", lambda *a: solved.append(a[1:3]) or 0.0)
    builder, _, _, _ = builder_of(MIXTRAL, None, None, 4096, 16 * MIB, {"device": "h100"})
    configs, _ = expand({"stages": [2, 4], "expert_parallel": [8], "interleave": [1, 2]}, 64, 256, builder.layers)
    bounds = prune.Bounds(configs, builder, 1e-3)
    assert all(bounds.tight(i) == bounds.refined(i) for i in range(len(configs)) if i not in bounds.errors)
    assert not solved and any(c["interleave"] == 2 for c in configs)
    builder, _, _, _ = builder_of(LLAMA, None, None, None, 16 * MIB, {"device": "h100"})
    configs, _ = expand({"stages": [2, 8], "tensor_parallel": [4], "interleave": [2, 4]}, 1024, 1024, builder.layers)
    bounds = prune.Bounds(configs, builder, 1e-3)
    for i in range(len(configs)):
        bounds.tight(i)
    assert sorted(set(solved)) == [(2, 2), (2, 4), (8, 2), (8, 4)]


@pytest.mark.parametrize("source, kw, grid", [
    (os.path.join(EXAMPLES, "llama2_7b_config.json"), dict(gpus=128, global_batch=128, seq=4096),
     {"stages": [1, 2, 4], "tensor_parallel": [1, 2, 8], "micro_batch_size": [1, 2], "interleave": [1, 2]}),
    (MIXTRAL, dict(gpus=64, global_batch=128, seq=4096),
     {"stages": [1, 2, 4], "tensor_parallel": [1, 2], "expert_parallel": [1, 8], "micro_batch_size": [1, 2]})])
def test_bounds_with_data_parallel_tails_stay_below_every_row(source, kw, grid):
    """Few micro-batches per replica: the tails (exposed gradient and parameter traffic) weigh, and
    the bounds count the part of them no split avoids; never above a row, and top=N unchanged."""
    builder, _, bucket, _ = builder_of(source, None, None, kw.get("seq"), 16 * MIB, {"device": "h100"})
    configs, _ = expand(grid, kw["gpus"], kw["global_batch"], builder.layers)
    bounds, _ = lower_bounds(configs, builder, 1e-3)
    result = sweep(source, grid, backend="numpy", bucket=16 * MIB, device="h100", **kw)
    where = {json.dumps(c, sort_keys=True): i for i, c in enumerate(configs)}
    tails = 0
    for r in result.rows:
        if r["feasible"]:
            i = where[json.dumps(r["config"], sort_keys=True)]
            assert bounds[i] <= r["iteration_time_s"], (r["config"], bounds[i], r["iteration_time_s"])
            tails += r["breakdown"]["dp"] > 0.05 * r["iteration_time_s"]
    assert tails  # some rows expose a real share of data-parallel traffic
    same_rows(sweep(source, grid, backend="numpy", bucket=16 * MIB, device="h100", top=5, **kw).rows,
              result.rows[:5])


@pytest.mark.parametrize("source, seq", [(MIXTRAL, 4096), (LLAMA, None)])
def test_bounds_are_below_random_splits_with_random_options(source, seq):
    """Independent of the search: with memory out of the way (a huge capacity), every split with any
    options, estimated as a run (simulated schedule with its sends, then each stage's exposed DP
    traffic and optimizer step), takes at least the configuration's bound.  Data-parallel groups
    span nodes here, so ring latencies and network ports weigh in the tails."""
    from gpuknap.costs import estimate
    builder, _, _, _ = builder_of(source, 2**60, None, seq, 16 * MIB, {"device": "h100"})
    grid = {"stages": [2, 4, 8], "micro_batch_size": [1, 2], "interleave": [1, 2]}
    configs, _ = expand(grid, 512, 512 if source == MIXTRAL else 1024, builder.layers)
    bounds, errors = lower_bounds(configs, builder, 1e-3)
    rng = random.Random(7)
    checked = 0
    for i, c in enumerate(configs):
        if i in errors:
            continue
        model = builder(dict(c))
        p, v = c["stages"], c["interleave"]
        n = len(model.kinds)
        for _ in range(6):
            cuts = sorted(rng.sample(range(1, n), p * v - 1))
            counts = np.diff([0] + cuts + [n]).tolist()
            names = [rng.choice(model.fronts[k]).name for k in model.kinds]
            run = estimate(model, counts, names, v)
            assert bounds[i] <= run.iteration_time, (c, counts, bounds[i], run.iteration_time)
            checked += 1
        assert bounds[i] > 0
    assert checked > 50
    # the tails weigh: the bound is above the schedule's span bound alone for some configuration
    assert any(r > 0.1 for r in _tail_shares(configs, builder, errors))


def _tail_shares(configs, builder, errors):
    """Each configuration's share of its bound that its tail bounds add."""
    from gpuknap.sweep._prune import Bounds
    b = Bounds(configs, builder, 1e-3)
    for i in range(len(configs)):
        if i not in errors:
            floor, most, m = b._tails[i]
            yield max(floor, most) / b.refined(i)
