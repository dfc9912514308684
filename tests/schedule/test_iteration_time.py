"""One pipeline's iteration time by whichever simulator is quicker for its shape."""
from __future__ import annotations

import numpy as np
import pytest

from gpuknap.schedule import WAVES_FROM, iteration_time, simulate
from gpuknap.schedule import _simulate


@pytest.mark.parametrize("p, v, m", [(1, 1, 9), (3, 1, 5), (4, 2, 8), (8, 2, 16), (16, 1, 7), (20, 1, 33), (6, 3, 12)])
def test_iteration_time_equals_the_event_simulator(p, v, m, monkeypatch):
    """Bit for bit, below and past the shape where it takes the waves (and it does take them)."""
    rng = np.random.default_rng(p * 100 + v * 10 + m)
    fwd, bwd = rng.random((p, v)) * 3, rng.random((p, v)) * 7
    schedule = "1f1b" if v == 1 else "interleaved"
    calls = []
    batched = _simulate.unbounded_iteration_times
    monkeypatch.setattr(_simulate, "unbounded_iteration_times", lambda *a, **k: calls.append(1) or batched(*a, **k))
    for p2p in (0.0, 0.3):
        want = simulate(fwd.tolist(), bwd.tolist(), m, schedule, p2p).iteration_time
        assert iteration_time(fwd.tolist(), bwd.tolist(), m, schedule, p2p) == want
    assert bool(calls) == (p * v >= WAVES_FROM)
