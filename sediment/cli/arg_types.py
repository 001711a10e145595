"""Argument types for durations and sizes on the command line, shared by the commands' parsers,
and the action that tells a flag given on the command line from its default.

``type=float`` took ``-1``, ``nan`` and ``inf``: a ``tail --idle-timeout nan`` then waited
forever and a negative ``--shutdown-grace`` was used as given. A duration is a finite number
of seconds; argparse reports anything else as a usage error (exit 2) before anything opens.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

_GIVEN = "given_on_command_line_"


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


class Given(argparse.Action):
    """Stores the value as ``store`` does and notes that the flag was on the command line.

    Several global options default to an environment variable, so their value alone does not
    say whether the user typed them: ``serve --cluster`` refuses storage options typed for it,
    but must not refuse the same ones exported for the shell's other commands."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, _GIVEN + self.dest, True)


def given_on_command_line(args: argparse.Namespace, dest: str) -> bool:
    """Whether the option stored in ``dest`` (with :class:`Given`) was given on the command line."""
    return bool(getattr(args, _GIVEN + dest, False))
