"""Progress reports from long computations, for whoever is listening.

The engine and the search call :func:`report` as they go; nothing is shown
unless a caller installed a callback with :func:`reporting` (the CLI draws a
bar on a terminal).  A context variable keeps callers in other threads apart.
"""
from __future__ import annotations

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
