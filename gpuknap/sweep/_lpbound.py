"""A configuration's bound with memory per device and per chunk: a linear program's Lagrangian.

The bounds of :mod:`._bounds` see memory only summed over the devices.  In an
interleaved split the first chunks keep the most micro-batches in flight, so
memory pushes layers to later chunks, and the uneven chunks add bubble that
no path bound with the fastest options sees (on the benchmark's Llama-2-70B
grid: bounds of 6.7 s under rows of 11.6 s).  This bound takes both into
account for models of one kind of layer between a first and a last layer
(embedding, body, output): with ``x[j, o]`` the number of body layers that
virtual stage ``j`` runs with option ``o`` (any real number >= 0, summing to
the body's layers; the first layer on stage 0 and the last on the last stage,
each at its fastest time and lightest memory),

- every device path of :func:`._bounds.device_paths` and every virtual stage
  path is at most ``T``, and
- device ``d`` holds its chunks' layers, each at the in-flight count of its
  chunk: ``sum`` of static plus option bytes ``<= capacity - reserved``.

Every split with its options, memory in exact bytes, is such an ``x``.  The
least ``T`` of this linear program is found by HiGHS (SciPy, an optional
extra); its answer is not trusted as it is: its dual values, weights
``lam >= 0`` on the paths (scaled to sum to 1) and ``mu >= 0`` on the memory
rows, give ``T >= lam . paths(x) + mu . (memory(x) - room)`` for every
feasible ``x``, whose least over ``x`` (all body layers on the ``(j, o)`` of
least coefficient) is computed here.  Whatever weights the solver returns,
that is a lower bound (weak duality); with the solver's optimum it is the
program's optimum.  Without SciPy, or for other model shapes, there is no
bound (0.0) and the sweep only prunes less.

The sweep solves these programs only on a grid where some search is costly
(:func:`worth_solving`): a program takes a few milliseconds, about what the
exact interleaved search of a configuration with few layers per device takes,
and SciPy's import half a second the first time, so on a grid of cheap
searches the programs cost more than the searches they can spare.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._bounds import device_paths


def _shape(model: Any) -> tuple | None:
    """``(head, body, tail)`` kinds when the model is one kind between a first and a last layer."""
    kinds = list(model.kinds)
    if len(kinds) < 3:
        return None
    head, body, tail = kinds[0], kinds[1], kinds[-1]
    if head == body or tail == body or any(k != body for k in kinds[1:-1]):
        return None
    return head, body, tail


#: Chunk tuples per device (see :func:`worth_solving`) from which the program is worth solving.
COSTLY_TUPLES = 200


def worth_solving(layers: int, stages: int, chunks: int) -> bool:
    """Whether a configuration's exact interleaved search is costly enough to solve programs for
    its grid: the ways ``C(n - 1, v - 1)`` to cut a device's even share ``n = ceil(layers / stages)``
    into its ``v`` chunks, a proxy for the chunk tuples the search enumerates per device, is at
    least :data:`COSTLY_TUPLES`.  On the benchmark's Llama-2-70B grid (80 layers) the searches of
    P=2 and P=4 with v=4 (9,139 and 969 ways) take 1-4 s each, every other interleaved one
    20-70 ms; Mixtral's (32 layers, v=2) at most 15 ways."""
    if chunks < 2:
        return False
    n = -(-int(layers) // int(stages))
    return n >= chunks and math.comb(n - 1, chunks - 1) >= COSTLY_TUPLES


def binds(model: Any, stages: int, chunks: int) -> bool:
    """A cheap sign that memory shapes the split: the layers shared evenly over the virtual
    stages, each with its fastest option at its chunk's in-flight count, overflow some device.
    Without it the program is not solved (no bound from it; the path bounds are close then)."""
    table = model.in_flight_table(stages, chunks)
    share = len(model.kinds) / (stages * chunks)
    weights = {}
    for kind in set(model.kinds):
        fastest = min(model.fronts[kind], key=lambda o: o.forward_time + o.backward_time)
        weights[kind] = (float(model.static[kind]), fastest)
    kinds = list(weights)
    room = float(model.capacity) - float(model.reserved)
    for row in table:
        need = 0.0
        for f in row:  # a chunk of ``share`` layers, of the kinds in the model's proportions
            need += share / len(model.kinds) * sum(model.kinds.count(k) * (weights[k][0] + weights[k][1].memory(int(f)))
                                                 for k in kinds)
        if need > room:
            return True
    return False


def memory_path_bound(model: Any, stages: int, chunks: int, time_unit: float) -> float:
    """A lower bound in seconds on the compute span (sends and tails left out) of any split of
    ``model`` over ``stages`` devices with ``chunks`` chunks each that fits memory (see the
    module docstring); 0.0 when there is none."""
    shape = _shape(model)
    p, v, m = int(stages), int(chunks), int(model.micro_batches)
    paths = device_paths(p, v, m) if v > 1 else device_paths(p, 1, m, "1f1b")
    if shape is None or paths is None:
        return 0.0
    try:
        from scipy.optimize import linprog
    except ImportError:
        return 0.0
    head, body, tail = shape
    if not binds(model, p, v):
        return 0.0
    n = p * v
    options = list(model.fronts[body])
    k = len(options)
    table = model.in_flight_table(p, v)
    flight = np.array([table[j % p][j // p] for j in range(n)])  # virtual stage j's in-flight count
    room = float(model.capacity) - float(model.reserved)
    # every path: the device paths, then each virtual stage's M forwards and backwards
    stage_paths = np.tril(np.ones((n, n)), -1) + m * np.eye(n)
    rows = np.vstack([paths, stage_paths])
    fixed = np.zeros(n)  # the first and last layers' least time on their virtual stages
    fixed[0] += min(o.forward_time + o.backward_time for o in model.fronts[head])
    fixed[-1] += min(o.forward_time + o.backward_time for o in model.fronts[tail])
    times = np.array([o.forward_time + o.backward_time for o in options])
    # x is [j, o] flattened: a path's coefficient on x[j, o] is its coefficient on stage j times o's time
    path_x = (rows[:, :, None] * times[None, None, :]).reshape(len(rows), n * k)
    path_0 = rows @ fixed
    # memory as a share of a device's room: device j % p holds x[j, o] at flight[j]
    mem = np.array([[float(model.static[body]) + o.memory(int(f)) for o in options] for f in flight]) / room
    held = np.zeros(p)
    held[0] += min(float(model.static[head]) + o.memory(int(flight[0])) for o in model.fronts[head]) / room
    held[(n - 1) % p] += min(float(model.static[tail]) + o.memory(int(flight[-1])) for o in model.fronts[tail]) / room
    mem_x = np.zeros((p, n * k))
    for j in range(n):
        mem_x[j % p, j * k:(j + 1) * k] = mem[j]
    left = 1.0 - held
    count = float(len(model.kinds) - 2)
    # the program in (x, T): min T, path_x x - T <= -path_0, mem_x x <= left, sum x = count
    a_ub = np.vstack([np.hstack([path_x, -np.ones((len(rows), 1))]), np.hstack([mem_x, np.zeros((p, 1))])])
    b_ub = np.concatenate([-path_0, left])
    a_eq = np.concatenate([np.ones(n * k), [0.0]])[None, :]
    cost = np.zeros(n * k + 1)
    cost[-1] = 1.0
    try:
        res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[count], bounds=(0, None), method="highs")
    except ValueError:
        return 0.0
    if res.status != 0:
        return 0.0
    duals = -np.asarray(res.ineqlin.marginals, dtype=np.float64)
    lam, mu = np.clip(duals[:len(rows)], 0.0, None), np.clip(duals[len(rows):], 0.0, None)
    if not lam.sum() > 0:
        return 0.0
    lam, mu = lam / lam.sum(), mu / lam.sum()
    coef = lam @ path_x + mu @ mem_x
    value = float(lam @ path_0) - float(mu @ left) + count * float(coef.min())
    unit = model.costs.time_unit if getattr(model, "costs", None) is not None else time_unit
    return max(value, 0.0) * unit * (1.0 - 1e-9)
