"""The command line's progress bar: a listener for the engine's progress reports."""
from __future__ import annotations

import sys
import time


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
