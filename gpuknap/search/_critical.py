"""Lower bounds on a split's simulated 1F1B time, from paths of the schedule.

The simulated iteration time is the longest path through the schedule's
operations (each forward or backward of a micro-batch on a stage, chained on
its stage and to its input), so the length of *any* path is a lower bound.
With ``t = f + b`` a stage's forward plus backward time, ``Pre_s`` and
``Suf_s`` the sums of ``t`` before and after stage s, ``w = min(P - s - 1, M)``
stage s's warm-up and ``c = min(w, M - 1)``, these paths exist for every P and
M (each built from the schedule's order in ``tests/search/test_critical.py``):

- **A** (stay on s): up on micro-batch x to stage s, its whole chain from
  ``F(s, x)`` to ``B(s, M-1-y)``, down: ``Pre_s + M t_s + x (f_j - f_s) + y (b_j' - b_s)``
  for any ``x, y <= c`` and stages ``j, j' < s`` (x more forwards in the warm-up of
  stage j, y more backwards in the cool-down of stage j').
- **F** (over the top first): up on micro-batch 0 to the last stage, down to
  ``B(s, 0)``, the rest of s's chain: ``Pre_s + a f_s + M b_s + Suf_s + y (b_j' - b_s)``
  with ``a = max(M - w, 1)``; and when ``M - w >= 2``, going up again on the last
  micro-batch through the next m stages: ``Pre_s + (M - w) f_s + (M - m) b_s + Suf_s
  + (t_{s+1} + ... + t_{s+m}) + (w - m) (b_j' - b_s)``, m = 1..w (m = w: the next
  stages all run two rounds, ``(M - w) t_s + 2 Suf_s``).
- **B** (up on the last micro-batch): ``Pre_s + M f_s + a b_s + Suf_s + x (f_j - f_s)``.

Each bump ``x (f_j - f_s)`` is taken only where positive.  For equal stages
they all give the closed form ``(M + P - 1) t``.  A stage's forward time may
depend on its plan (options of one kind with different forward times): the
bounds then take, term by term, the forward time in ``[f_low, f_high]`` that
makes the term least, so they hold for every plan.
"""
from __future__ import annotations

import numpy as np


def caps(stages: int, micro_batches: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per stage s: ``w`` (its warm-up), ``c`` (the most bump operations) and ``a``."""
    s = np.arange(stages)
    w = np.minimum(stages - 1 - s, micro_batches)
    return w, np.minimum(w, micro_batches - 1), np.maximum(micro_batches - w, 1)


def least(alpha: float | np.ndarray, beta: float | np.ndarray, t: np.ndarray, f_low: np.ndarray,
          f_high: np.ndarray) -> np.ndarray:
    """The least ``alpha f + beta b`` over ``f`` in ``[f_low, f_high]`` with ``b = t - f``."""
    return np.where(alpha >= beta, beta * t + (alpha - beta) * f_low, alpha * t + (beta - alpha) * (t - f_high))


def _least(alpha: int | np.ndarray, beta: int | np.ndarray, t: np.ndarray, f_low: np.ndarray,
           f_high: np.ndarray) -> np.ndarray:
    """:func:`least` on ``[N, P]`` times, ``alpha`` and ``beta`` per column or one for all:
    only each column's own branch is computed (the same values, in less time)."""
    alpha, beta = np.broadcast_to(alpha, t.shape[1:]), np.broadcast_to(beta, t.shape[1:])
    up = alpha >= beta
    if up.all():
        return beta * t + (alpha - beta) * f_low
    if not up.any():
        return alpha * t + (beta - alpha) * (t - f_high)
    out = np.empty(t.shape)
    out[:, up] = beta[up] * t[:, up] + (alpha - beta)[up] * f_low[:, up]
    down = ~up
    out[:, down] = alpha[down] * t[:, down] + (beta - alpha)[down] * (t[:, down] - f_high[:, down])
    return out


def stage_terms(s: int, stages: int, m: int, t: np.ndarray, f_low: np.ndarray, f_high: np.ndarray,
                forward_max: np.ndarray | float | None, backward_max: np.ndarray | float) -> tuple:
    """Stage s's terms of the bounds, grouped by what multiplies ``Suf_s`` (0, 1, 2), without
    ``Pre_s``: ``forward_max`` / ``backward_max`` are lower bounds on the largest forward and
    backward time among the stages before s (for the bumps); ``forward_max=None``: no forward
    bump (the same numbers as 0 with forward times >= 0, in less time)."""
    return terms_of(stage_parts(s, stages, m, t, f_low, f_high), backward_max, forward_max)


def stage_parts(s: int, stages: int, m: int, t: np.ndarray, f_low: np.ndarray, f_high: np.ndarray) -> tuple:
    """What :func:`stage_terms` computes before the bumps (the same for every largest forward
    and backward time placed before): kept by a caller that asks for many."""
    w, c, a = (int(x[s]) for x in caps(stages, m))
    last = s == stages - 1
    return (c, m * t, t - f_low, f_high, last, None if last else least(a, m, t, f_low, f_high),
            None if last else least(m, a, t, f_low, f_high), (m - w) * t if not last and m - w >= 2 else None)


def terms_of(parts: tuple, backward_max: np.ndarray | float, forward_max: np.ndarray | float | None = None) -> tuple:
    """:func:`stage_terms` from :func:`stage_parts` (no forward bump when ``forward_max`` is None)."""
    c, mt, back, f_high, last, up, down, h2 = parts
    bump_b = c * np.maximum(0.0, backward_max - back)
    if forward_max is None:
        h0 = mt + bump_b
    else:
        bump_f = c * np.maximum(0.0, forward_max - f_high)
        h0 = mt + bump_f + bump_b
        down = None if last else down + bump_f
    if last:
        none = np.full(np.shape(h0), -np.inf)
        return h0, none, none
    return h0, np.maximum(up + bump_b, down), np.full(np.shape(h0), -np.inf) if h2 is None else h2


def split_bounds(t: np.ndarray, f_low: np.ndarray, f_high: np.ndarray, micro_batches: int,
                 chains: bool = True) -> np.ndarray:
    """The largest of every bound above for complete splits: ``t``, ``f_low``, ``f_high`` are
    ``[N, P]`` stage times; returns ``[N]`` lower bounds on the simulated times.  Without
    ``chains``, the "up again through m stages" paths are left out (a quicker, lower bound)."""
    n, p = t.shape
    m = micro_batches
    w, c, _ = caps(p, m)
    pre = np.cumsum(t, axis=1)
    pre -= t
    suf = t.sum(axis=1, keepdims=True) - pre
    suf -= t
    zero = np.zeros((n, 1))
    fmax = np.maximum.accumulate(np.concatenate((zero, f_low[:, :-1]), axis=1), axis=1)
    back = t - f_high  # the least backward time
    bmax = np.maximum.accumulate(np.concatenate((zero, back[:, :-1]), axis=1), axis=1)
    # stage_terms for every stage at once (in place: the same operations in the same order)
    a = np.maximum(m - w, 1)
    bump_f = fmax - f_high
    np.maximum(0.0, bump_f, out=bump_f)
    bump_f *= c
    bump_b = t - f_low
    np.subtract(bmax, bump_b, out=bump_b)
    np.maximum(0.0, bump_b, out=bump_b)
    bump_b *= c
    out = m * t
    out += bump_f
    out += bump_b
    np.add(pre, out, out=out)  # h0
    q, two = p - 1, max(0, p + 1 - m)  # h1 on stages before the last; h2 where m - w >= 2: stages two..p-2
    if q > 0:
        x = _least(a[:q], m, t[:, :q], f_low[:, :q], f_high[:, :q])
        x += bump_b[:, :q]
        y = _least(m, a[:q], t[:, :q], f_low[:, :q], f_high[:, :q])
        y += bump_f[:, :q]
        np.maximum(x, y, out=x)
        np.add(pre[:, :q], x, out=x)
        x += suf[:, :q]
        np.maximum(out[:, :q], x, out=out[:, :q])
    if two < q:
        x = (m - w[two:q]) * t[:, two:q]
        np.add(pre[:, two:q], x, out=x)
        x += 2 * suf[:, two:q]
        np.maximum(out[:, two:q], x, out=out[:, two:q])
    out = out.max(axis=1)
    for s in range(p):
        if chains and s < p - 1 and m - w[s] >= 2 and w[s] >= 2:  # over the top, then up again: k stages
            bump = np.maximum(0.0, bmax[:, s:s + 1] - (t[:, s:s + 1] - f_low[:, s:s + 1]))
            k = np.arange(1, int(w[s]))
            run = np.cumsum(t[:, s + 1:s + int(w[s])], axis=1)  # [N, k]: t_{s+1} + ... + t_{s+k}
            body = least(m - w[s], m - k, t[:, s:s + 1], f_low[:, s:s + 1], f_high[:, s:s + 1])
            chain = pre[:, s:s + 1] + body + suf[:, s:s + 1] + run + (w[s] - k) * bump
            out = np.maximum(out, chain.max(axis=1))
    return out


def segment_floor(stage: np.ndarray, start: np.ndarray, end: np.ndarray, stages: int, micro_batches: int,
                  fastest: np.ndarray, f_low: np.ndarray, f_high: np.ndarray) -> np.ndarray:
    """A lower bound on the simulated time of every split in which stage ``stage`` takes the
    layers ``start:end`` (arrays of one shape), from prefix sums over the layers of their
    fastest option's time (``fastest``) and of their least and most forward time.

    With ``x`` the segment's fastest time (its stage takes ``t >= x``) and the other stages
    at least the rest of the layers' fastest time: path A gives ``fastest[start] + M x``;
    the paths F and B, ``Pre + Suf + a f + M b`` and ``Pre + Suf + M f + a b``, are one
    falling and one rising in the forward time ``f``, so the larger of the two is least
    where they cross (``f = t / 2``) or, when the segment's forward range excludes that,
    at the nearer end of the range; both grow with ``t``, so ``t = x`` bounds them."""
    m = micro_batches
    x = fastest[end] - fastest[start]
    f = np.clip(x / 2, f_low[end] - f_low[start], f_high[end] - f_high[start])
    a = caps(stages, m)[2][stage]
    over = np.maximum(m * x - (m - a) * f, a * x + (m - a) * f)
    return np.maximum(fastest[start] + m * x, fastest[-1] - x + over)
