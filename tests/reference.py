"""Independent references for the tests: brute force and a plain per-stage DP.

Written from the contract alone (no gpuknap internals): every option of every
layer is considered, not only the useful ones.
"""
from __future__ import annotations

import itertools
import math


def opt_time(o):
    return o.forward_time + o.backward_time


def fastest(options, k):
    """The fastest option, lightest among the fastest."""
    return min(options, key=lambda o: (opt_time(o), o.memory(k)))


def ceil_div(a, b):
    return int(-(-a // b))


def brute_choose(groups, fronts, budget, bucket):
    """``(time, weight_buckets, memory_bytes)`` of the contract's choice, or None."""
    if budget < 0:
        return None
    layers = [(g.kind, g.in_flight) for g in groups for _ in range(g.count)]
    fast_bytes = sum(fastest(fronts[kd], k).memory(k) for kd, k in layers)
    if fast_bytes <= budget:
        ts = [opt_time(fastest(fronts[kd], k)) for kd, k in layers]
        return (math.fsum(ts), None, fast_bytes)
    cap = int(budget // bucket)
    best = None
    for combo in itertools.product(*[fronts[kd] for kd, _ in layers]):
        w = sum(ceil_div(o.memory(k), bucket) for o, (_, k) in zip(combo, layers))
        if w > cap:
            continue
        t = math.fsum(opt_time(o) for o in combo)
        if best is None or (t, w) < best[:2]:
            best = (t, w, sum(o.memory(k) for o, (_, k) in zip(combo, layers)))
    return best


def dp_stage_time(groups, fronts, budget, bucket):
    """Least time of a stage by a plain list DP over all options (no shortcut tricks)."""
    if budget < 0:
        return math.inf
    layers = [(g.kind, g.in_flight) for g in groups for _ in range(g.count)]
    fast_bytes = sum(fastest(fronts[kd], k).memory(k) for kd, k in layers)
    if fast_bytes <= budget:
        return math.fsum(opt_time(fastest(fronts[kd], k)) for kd, k in layers)
    cap = int(budget // bucket)
    best = [0.0] * (cap + 1)  # least time using at most c buckets
    for kd, k in layers:
        new = [math.inf] * (cap + 1)
        for o in fronts[kd]:
            w, t = ceil_div(o.memory(k), bucket), opt_time(o)
            for c in range(w, cap + 1):
                v = best[c - w] + t
                if v < new[c]:
                    new[c] = v
        best = new
    return best[cap]


def dp_suffix_times(layers, fronts, budgets, bucket):
    """Entry i by a separate forward DP per start (no shared backward pass)."""
    out = []
    for i, b in enumerate(budgets):
        if b < 0:
            out.append(math.inf)
            continue
        cap = int(b // bucket)
        best = [0.0] * (cap + 1)
        for g in layers[i:]:
            new = [math.inf] * (cap + 1)
            for o in fronts[g.kind]:
                w, t = ceil_div(o.memory(g.in_flight), bucket), opt_time(o)
                for c in range(w, cap + 1):
                    new[c] = min(new[c], best[c - w] + t)
            best = new
        out.append(best[cap])
    return out


def close(a, b, rel=1e-12):
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))
