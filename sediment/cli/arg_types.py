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


def positive_bytes(text: str) -> int:
    """A size of one or more bytes (an integer)."""
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size <= 0:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: give a positive integer number of bytes")
    return size
