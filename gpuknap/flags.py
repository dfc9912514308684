"""Command-line flag types: every refusal is one line naming the flag (exit 2)."""
from __future__ import annotations

import argparse
import math
from typing import Callable, NoReturn

from .units import parse_quantity

#: Exit code of bad input (the CLI uses this one too).
EXIT_BAD_INPUT = 2


def integer(flag: str, low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high:,}, got {text}")
        return value
    return parse


def size(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = parse_quantity(text, "bytes", flag)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive size, e.g. '80 GiB', got {text!r}")
        return value
    return parse


def cells(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of DP cells (e.g. 5e10), got {text[:40]!r}") from None
    if not 1 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number of DP cells, got {text!r}")
    return int(value)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), as every other refusal."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"gpuknap: error: {message}\n")
