"""Command-line flag types, and the one-line answer to every failure.

Every refusal of a flag is one line naming it (exit 2); :func:`guarded` maps
whatever a command raises to one line and an exit code, never a traceback.
"""
from __future__ import annotations

import argparse
import difflib
import math
import os
import sys
from typing import Any, Callable, NoReturn

from ..formats import parse_quantity

#: Exit codes: success, bad input or a refused job, an internal error (a bug).
EXIT_OK, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 2, 3


def _read(text: str, cast: Callable = float) -> Any:
    """``cast(text)`` for plain ASCII numbers only: Python's own parsers also take ``1_000`` and
    other scripts' digits, which no size (``--capacity``) or file gpuknap reads accepts."""
    if "_" in text or not text.isascii():
        raise ValueError(text)
    return cast(text)


def _hint(text: str) -> str:
    return " (write it without underscores)" if "_" in text else ""


def integer(flag: str, low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = _read(text, int)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}{_hint(text)}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high:,}, got {text}")
        return value
    return parse


def size(flag: str, zero: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = parse_quantity(text, "bytes", flag)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"expected a {'non-negative' if zero else 'positive'} size, "
                                             f"e.g. '80 GiB', got {text!r}")
        if flag == "--capacity" and _plain(text) and value < 2**20:
            guess = f"did you mean '{value:.10g}GiB'? " if 1 <= value <= 4096 else "give a unit, e.g. '80GiB' "
            raise argparse.ArgumentTypeError(f"{text.strip()} bytes is no device's memory; {guess}(a plain number "
                                             "is bytes)")
        return value
    return parse


def _plain(text: str) -> bool:
    """Whether ``text`` is a number without a unit (``80``, ``8e1``, ``+80``)."""
    try:
        _read(text.strip())
    except ValueError:
        return False
    return True


def fraction(flag: str, low: float = 0.0) -> Callable[[str], float]:
    """A number in (0, 1], or from ``low`` to 1 when ``low`` is given."""
    span = f"from {low:g} to 1" if low else "in (0, 1]"

    def parse(text: str) -> float:
        try:
            value = _read(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {span}, got {text[:40]!r}{_hint(text)}") from None
        if not (low <= value <= 1 if low else 0 < value <= 1):
            raise argparse.ArgumentTypeError(f"expected a number {span}, got {text!r}")
        return value
    return parse


def device_field(text: str) -> tuple[str, float]:
    """``--device-field FIELD=VALUE``: one number of the device."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE such as inter_bandwidth=25e9, got {text[:40]!r}")
    key = key.strip()
    try:
        number = _read(value.strip())
    except ValueError:
        if key != "memory":
            raise argparse.ArgumentTypeError(f"{key}: expected a number, got {value[:40]!r}{_hint(value)}") from None
        from ..formats import parse_quantity  # noqa: PLC0415 - the one field with units
        try:
            return key, parse_quantity(value.strip(), "bytes", "memory")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if key == "memory" and number > 2**70:  # as every memory gpuknap reads
        raise argparse.ArgumentTypeError(f"memory: {value[:40]!r} bytes is over 2**70, beyond any real device")
    if key == "memory" and 0 < number < 2**30:  # a device of under 1 GiB: a size given without its unit
        raise argparse.ArgumentTypeError(f"memory: {value[:40]!r} bytes is under 1 GiB; give the unit "
                                         f"(memory=80GiB) or the bytes")
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{key}: expected a finite number, got {value[:40]!r}")
    return key, int(number) if key == "gpus_per_node" and number.is_integer() else number


def number(low: float, what: str, cast: Callable = float, high: float = math.inf) -> Callable[[str], Any]:
    """A finite number from ``low`` to ``high`` (``what`` says what it is in the refusal)."""
    def parse(text: str) -> Any:
        try:
            value = _read(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text[:40]!r}{_hint(text)}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected {what}, finite, got {text!r}")
        if not low <= value:
            raise argparse.ArgumentTypeError(f"expected {what} >= {low:g}, got {text!r}")
        if value > high:  # beyond it, sums with the stages' times lose them to rounding
            raise argparse.ArgumentTypeError(f"expected {what} of at most {high:g}, got {text!r}")
        return cast(value)
    return parse


#: ``--max-work``: a number of DP cells.
cells = number(1, "a number of DP cells (e.g. 5e10)", int)


#: Flags users bring from other tools, and the flag gpuknap takes instead.
ALIASES = {"--pp": "--stages", "--pipeline-parallel": "--stages", "--pipeline-model-parallel-size": "--stages",
           "--tensor-parallel": "--tp", "--tensor-model-parallel-size": "--tp", "--data-parallel": "--dp",
           "--expert-parallel": "--ep", "--context-parallel": "--cp", "--vpp": "--interleave",
           "--virtual-pipeline": "--interleave", "--mbs": "--micro-batch-size", "--gbs": "--global-batch",
           "--seq-length": "--seq", "--memory": "--capacity", "--gpu": "--device"}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), as every other refusal; an unknown flag gets the
    nearest one this command takes."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            message += self._nearest(message.split(":", 1)[1].split())
        self.exit(EXIT_BAD_INPUT, f"gpuknap: error: {message}\n")

    #: The command line being parsed (set by the caller), to suggest the chosen command's flags only.
    argv: list = []

    def _nearest(self, words: list) -> str:
        known = set(self._option_string_actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = [name for name in action.choices if name in self.argv] or list(action.choices)
                for name in chosen[:1] if chosen != list(action.choices) else chosen:
                    known |= set(action.choices[name]._option_string_actions)
        for word in words:
            flag = word.split("=", 1)[0]
            if not flag.startswith("--"):
                continue
            if flag in ALIASES:
                return f" (did you mean {ALIASES[flag]}?)"
            near = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
            if near:
                return f" (did you mean {near[0]}?)"
        return ""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or exc.__class__.__name__


def guarded(command: Callable[[], int]) -> int:
    """Run a command; every failure becomes one line on stderr and an exit code."""
    try:
        rc = command()
        sys.stdout.flush()
        return rc
    except BrokenPipeError:  # the reader went away (gpuknap best | head -1): stop quietly, as Unix tools do
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return EXIT_OK
    except ValueError as exc:  # every refusal of input, BackendUnavailable and WorkTooLarge included
        print(f"gpuknap: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:  # e.g. a --plot path that became unwritable
        print(f"gpuknap: error: {exc.filename or ''}: {exc.strerror or _one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError:
        print("gpuknap: error: out of memory; lower --max-memory or use a coarser --bucket", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: still one line, never a traceback
        print(f"gpuknap: internal error (please report): {exc.__class__.__name__}: {_one_line(exc)}",
              file=sys.stderr)
        return EXIT_INTERNAL


def plural(n: int, word: str) -> str:
    """``1 stage``, ``2 stages``, ``1,000 stages``."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def counts_list(text: str) -> list[int]:
    """``--counts``: a split as comma- or space-separated integers."""
    if "," in text and any(not part.strip() for part in text.split(",")):
        raise ValueError(f"--counts: an empty count between commas in {text[:40]!r}")
    try:
        counts = [_read(x, int) for x in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"--counts: expected comma-separated integers, got {text[:40]!r}") from None
    if not counts:
        raise ValueError("--counts: no counts given")
    return counts
