"""The command line's progress line: a listener for the engine's progress reports.

One line on stderr, only on a terminal and when not ``--quiet``, shown once a job has run
for half a second (short jobs print nothing).  It names the phase it is in (segments, DP
passes, bottlenecks, plans...) with that phase's share done and the time since the start,
and for a phase of equal units (a sweep's configurations) the time left at its pace so far;
it is erased, not left behind, when the job ends or a note is printed, so what follows
starts on a clean line.
"""
from __future__ import annotations

import sys
import time

from ..engine import format_seconds

#: Phases whose units take about equal time, so that the line says the time left: a sweep's
#: configurations (its pilot, run first, is spread over the grid).
PACED = ("configurations",)
#: Seconds a paced phase runs before its time left is shown.
PACE_AFTER = 2.0
#: Seconds before the line first appears.
DELAY = 0.5
WIDTH = 72

_active: "Bar | None" = None


class Bar:
    """A callback for :func:`gpuknap.engine.reporting` (see the module docstring)."""

    def __init__(self, quiet: bool):
        global _active
        self.on = not quiet and sys.stderr.isatty()
        self.start = self.drawn = time.perf_counter()
        self.shown = False
        self.phases: list[str] = []
        self.began: dict[str, float] = {}
        _active = self

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if stage not in self.phases:
            self.phases.append(stage)
            self.began[stage] = now
        if not self.on or now - self.start < DELAY or (now - self.drawn < 0.1 and done < total):
            return
        self.drawn, self.shown = now, True
        filled = int(20 * done / max(total, 1))
        running = now - self.began[stage]
        paced = stage in PACED  # (its one phase is named alone: the room goes to the time left)
        line = (f"{stage}{'' if paced else f' (phase {len(self.phases)})'} [{'#' * filled}{'.' * (20 - filled)}] "
                f"{100 * done / max(total, 1):3.0f}%  {now - self.start:5.1f} s")
        if paced and 0 < done < total and running >= PACE_AFTER:
            line += f", ~{format_seconds(running * (total - done) / done)} left"
        sys.stderr.write("\r" + line[:WIDTH].ljust(WIDTH))
        sys.stderr.flush()

    def clear(self) -> None:
        """Erase the line (the next output starts on a clean line)."""
        if self.shown:
            sys.stderr.write("\r" + " " * WIDTH + "\r")
            sys.stderr.flush()
            self.shown = False

    def close(self) -> None:
        global _active
        self.clear()
        if _active is self:
            _active = None


#: Notes of the command running, written when it ends without an error (None: write at once).
_pending: list[str] | None = None


def note(text: str) -> None:
    """A ``note: ...`` line on stderr, the progress line erased first; while a command runs it is
    held until the command ends, so that a refusal stays the one line on stderr."""
    if _pending is not None:
        _pending.append(text)
        return
    if _active is not None:
        _active.clear()
    print(f"note: {text}", file=sys.stderr)


def hold_notes() -> None:
    """Hold the notes from now on (the command starts)."""
    global _pending
    _pending = []


def release_notes(write: bool) -> None:
    """Write the notes held (the command ended without an error), or drop them; stop holding."""
    global _pending
    held, _pending = _pending or [], None
    for text in held if write else ():
        note(text)
