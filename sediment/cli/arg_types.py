"""Argument types for durations and sizes on the command line, shared by the commands' parsers.

``type=float`` took ``-1``, ``nan`` and ``inf``: a ``tail --idle-timeout nan`` then waited
forever and a negative ``--shutdown-grace`` was used as given. A duration is a finite number
of seconds; argparse reports anything else as a usage error (exit 2) before anything opens.
"""

from __future__ import annotations

import argparse
import math


def _seconds(text: str, *, zero: bool) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: give a finite number of seconds {bound}")
    return seconds


def seconds(text: str) -> float:
    """A duration of zero or more seconds."""
    return _seconds(text, zero=True)


def positive_seconds(text: str) -> float:
    """A duration of more than zero seconds."""
    return _seconds(text, zero=False)


def _positive(text: str, what: str, unit: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: give a positive integer{unit}")
    return n


def positive_count(text: str) -> int:
    """A count of one or more."""
    return _positive(text, "count", "")


def positive_bytes(text: str) -> int:
    """A size of one or more bytes (an integer)."""
    return _positive(text, "size", " number of bytes")
