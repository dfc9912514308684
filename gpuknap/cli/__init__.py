"""The command line: ``gpuknap best | rank | curve | timeline | sweep``.

Owns the commands, the flags and their one-line refusals, the exit codes,
the human tables and the stable JSON, the plots and the progress bar (a
listener on the engine's progress hook).  It sits on top of everything else
and nothing imports it.
"""
from ._main import build_parser, main

__all__ = ["build_parser", "main"]
