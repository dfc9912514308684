"""Progress reports from long computations, for whoever is listening.

The engine and the search call :func:`report` as they go; nothing is shown
unless a caller installed a callback with :func:`reporting` (the CLI draws a
bar on a terminal).  A context variable keeps callers in other threads apart.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

#: ``callback(stage, done, total)``: ``stage`` names the phase, ``done`` of ``total`` units in it.
Callback = Callable[[str, int, int], None]

_listener: ContextVar[Callback | None] = ContextVar("gpuknap_progress", default=None)


@contextmanager
def reporting(callback: Callback) -> Iterator[None]:
    """Send progress reports to ``callback`` inside the ``with`` block."""
    token = _listener.set(callback)
    try:
        yield
    finally:
        _listener.reset(token)


def report(stage: str, done: int, total: int) -> None:
    """Tell the listener, if any, that ``done`` of ``total`` units of ``stage`` are done."""
    callback = _listener.get()
    if callback is not None:
        callback(stage, done, total)


class Bar:
    """A one-line progress bar on stderr, shown only on a terminal and when not ``quiet``.

    A callback for :func:`reporting`: each phase (segments, DP passes,
    bottlenecks, plans) redraws the bar, at most ten times a second."""

    def __init__(self, quiet: bool):
        self.on = not quiet and sys.stderr.isatty()
        self.start = self.drawn = time.perf_counter()
        self.shown = False

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if not self.on or (now - self.drawn < 0.1 and done < total):
            return
        self.drawn, self.shown = now, True
        filled = int(30 * done / max(total, 1))
        sys.stderr.write(f"\r{stage:>12} [{'#' * filled}{'.' * (30 - filled)}] {100 * done / max(total, 1):5.1f}% "
                         f"{now - self.start:6.1f}s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
