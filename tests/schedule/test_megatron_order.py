"""The interleaved orders against an event simulation written from Megatron-Core's own code.

The reference below follows ``forward_backward_pipelining_with_interleaving`` in
``megatron/core/pipeline_parallel/schedules.py`` step by step (not gpuknap's
order function): ``get_pp_rank_microbatches`` for the warm-up count,
``get_schedule_table`` for which micro-batch and chunk each virtual micro-batch
is, forwards ``k`` and backwards ``k`` paired in the steady loop, and each
chunk's backwards popping its saved inputs first in, first out.  The legacy
order is Megatron-Core 0.9's (every forward first when M equals P, groups of
P).  A small discrete-event loop then runs the ranks.
"""
from __future__ import annotations

import heapq
import random

import pytest

from gpuknap.schedule import in_flight_table, iteration_times, simulate


def megatron_rank_ops(p, rank, v, m, group=None, legacy=False):
    """One rank's operations ``(kind, chunk, micro_batch)`` in Megatron's order."""
    g = p if group is None else group
    total = m * v
    if legacy:
        warm = total if m == p else min((p - rank - 1) * 2 + (v - 1) * p, total)
    else:
        warm = min((p - rank - 1) * 2 + (v - 1) * g, total)
    table = []  # get_schedule_table
    for first in range(0, m, g):
        last = m if first + g >= m else first + g
        table += [(mb, c) for c in range(v) for mb in range(first, last)]
    saved = [[] for _ in range(v)]  # input tensors per chunk, popped first in first out

    def forward(k):
        mb, c = table[k]
        saved[c].append(mb)
        return ("F", c, mb)

    def backward(k):
        c = v - 1 - table[k][1]
        return ("B", c, saved[c].pop(0))

    ops = [forward(k) for k in range(warm)]
    for k in range(total - warm):
        ops.append(forward(warm + k))
        ops.append(backward(k))
    for k in range(total - warm, total):
        ops.append(backward(k))
    return ops


def event_simulation(p, v, m, fwd, bwd, group=None, legacy=False):
    """Iteration time of the ranks running their orders: an operation starts when its rank
    is free and its input is done (a forward: the same micro-batch's forward on the previous
    virtual stage; a backward: its backward on the next one, or its own forward on the last)."""
    orders = [megatron_rank_ops(p, r, v, m, group, legacy) for r in range(p)]
    done = {}  # (kind, virtual stage, micro-batch) -> end time
    free = [0.0] * p
    nxt = [0] * p
    last = p * v - 1
    remaining = sum(len(o) for o in orders)
    while remaining:
        ready = []
        for r in range(p):
            if nxt[r] == len(orders[r]):
                continue
            kind, c, mb = orders[r][nxt[r]]
            vs = c * p + r
            if kind == "F":
                need = ("F", vs - 1, mb) if vs > 0 else None
            else:
                need = ("B", vs + 1, mb) if vs < last else ("F", vs, mb)
            if need is None or need in done:
                heapq.heappush(ready, (max(free[r], done[need] if need else 0.0), r))
        assert ready, "deadlock"
        start, r = heapq.heappop(ready)
        kind, c, mb = orders[r][nxt[r]]
        end = start + (fwd[r][c] if kind == "F" else bwd[r][c])
        done[(kind, c * p + r, mb)] = end
        free[r] = end
        nxt[r] += 1
        remaining -= 1
    return max(done.values())


def megatron_in_flight(p, v, m, group=None, legacy=False):
    out = []
    for r in range(p):
        alive, peak = [0] * v, [0] * v
        for kind, c, _ in megatron_rank_ops(p, r, v, m, group, legacy):
            alive[c] += 1 if kind == "F" else -1
            peak[c] = max(peak[c], alive[c])
        out.append(peak)
    return out


def random_case(rng, equal_m=False):
    p, v = rng.randint(2, 6), rng.randint(2, 4)
    if equal_m:
        return p, v, p, None
    group = rng.choice([None, None, rng.randint(p, 2 * p + 2)])
    g = p if group is None else group
    m = rng.choice([g * rng.randint(1, 3), g * rng.randint(1, 3) + rng.randint(p, max(p, g - 1))])
    if m % g and m % g < p or g > m:
        m = g * rng.randint(1, 3)
    return p, v, m, group


@pytest.mark.parametrize("seed", range(40))
def test_interleaved_equals_megatrons_order_simulated(seed):
    """Current Megatron-Core, M = P cases first (where it stopped running every forward first)
    and then any M and micro-batch group size it accepts: the same iteration time (bit for bit:
    the same additions) and the same in-flight peaks."""
    rng = random.Random(seed)
    p, v, m, group = random_case(rng, equal_m=seed < 20)
    fwd = [[rng.choice([0.5, 1.0, 1.25, 2.0, 3.5]) for _ in range(v)] for _ in range(p)]
    bwd = [[rng.choice([1.0, 2.0, 2.5, 4.0, 7.0]) for _ in range(v)] for _ in range(p)]
    want = event_simulation(p, v, m, fwd, bwd, group)
    assert simulate(fwd, bwd, m, "interleaved", group=group).iteration_time == want
    assert iteration_times([fwd], [bwd], m, "interleaved", group=group)[0] == want
    assert in_flight_table(p, v, m, group=group) == megatron_in_flight(p, v, m, group)


@pytest.mark.parametrize("seed", range(12))
def test_the_legacy_order_equals_megatron_core_0_9(seed):
    rng = random.Random(100 + seed)
    p, v = rng.randint(2, 5), rng.randint(2, 3)
    m = p * rng.randint(1, 3)
    fwd = [[rng.choice([0.5, 1.0, 2.0]) for _ in range(v)] for _ in range(p)]
    bwd = [[rng.choice([1.0, 2.0, 3.0]) for _ in range(v)] for _ in range(p)]
    want = event_simulation(p, v, m, fwd, bwd, legacy=True)
    assert simulate(fwd, bwd, m, "interleaved-legacy").iteration_time == want
    assert in_flight_table(p, v, m, "interleaved-legacy") == megatron_in_flight(p, v, m, legacy=True)


def test_the_last_rank_keeps_one_micro_batch_on_its_last_chunk_when_m_equals_p():
    """P=4, v=2, M=4: today's Megatron warms the last rank up with 4 forwards (all of chunk 0),
    then alternates, so its chunk 1 holds one micro-batch at a time; the legacy order ran
    all 8 forwards first and held 4."""
    assert in_flight_table(4, 2, 4)[3] == [4, 1]
    assert in_flight_table(4, 2, 4, "interleaved-legacy")[3] == [4, 4]


def test_group_sizes_megatron_refuses_are_refused():
    with pytest.raises(ValueError, match="group"):
        simulate([[1.0, 1.0]] * 4, [[1.0, 1.0]] * 4, 6, "interleaved", group=5)  # last group of 1 < P
    with pytest.raises(ValueError, match="group"):
        simulate([[1.0, 1.0]] * 4, [[1.0, 1.0]] * 4, 8, "interleaved", group=3)  # group below P
    with pytest.raises(ValueError, match="group"):
        simulate([[1.0, 1.0]] * 2, [[1.0, 1.0]] * 2, 4, "interleaved-legacy", group=3)
    # M not a multiple of P is fine once the group allows it (M = 7, P = 2, group 4: groups 4 and 3)
    assert simulate([[1.0, 1.0]] * 2, [[1.0, 1.0]] * 2, 7, "interleaved", group=4).iteration_time > 0
