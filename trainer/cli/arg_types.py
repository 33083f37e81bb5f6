"""Typed, range-checked argparse option values: a bad number is argparse's own clean error.

``--port 70000`` used to reach ``socket.bind`` and end in a raw ``OverflowError``; with these types
argparse prints ``asyncrl run: error: argument --port: 70000 is not a port: give 0..65535 ...`` and
exits 2 before anything starts.
"""

import argparse
import math
from collections.abc import Callable

MAX_PORT = 65535


def integer(low: int, high: int | None = None, what: str = "a whole number") -> Callable[[str], int]:
    """An int in ``[low, high]`` (``high`` None: no upper bound)."""
    span = f"{low}..{high}" if high is not None else f">= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}: give an integer {span}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {what} {span}")
        return value

    parse.__name__ = "integer"  # argparse names the type in "invalid <name> value" messages
    return parse


def port(text: str) -> int:
    """A TCP port, 0..65535 (0: any free port)."""
    return integer(0, MAX_PORT, "a port (0 = any free port)")(text)


def number(low: float | None = None, *, above: float | None = None, what: str = "a number") -> Callable[[str], float]:
    """A finite float ``>= low`` or ``> above`` (both None: any finite number)."""
    if above is not None:
        span = f" > {above:g}"
    elif low is not None:
        span = f" >= {low:g}"
    else:
        span = ""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}: give a finite number{span}") from None
        if not math.isfinite(value) or (low is not None and value < low) or (above is not None and value <= above):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give {what}, a finite number{span}")
        return value

    parse.__name__ = "number"
    return parse


def seconds(*, zero: bool = False) -> Callable[[str], float]:
    """A finite duration in seconds: ``> 0``, or ``>= 0`` when ``zero``."""
    return number(0.0, what="seconds") if zero else number(above=0.0, what="seconds")
