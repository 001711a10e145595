"""A tiny progress bar on stderr for long operations (append, compaction, the demo).

It draws only when the stream is a terminal, or when forced (``force=True``, or the
environment variable ``SEDIMENT_PROGRESS=1``), so pipes, logs and tests stay clean.
No dependencies: one line rewritten with ``\\r``, at most ten times a second.

    with Progress(total=size, label="append", unit="B") as bar:
        for chunk in chunks:
            ...
            bar.update(len(chunk))
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

_WIDTH = 24
_INTERVAL = 0.1  # seconds between redraws


def progress_forced() -> bool | None:
    """``SEDIMENT_PROGRESS``: 1/yes forces the bar on, 0/no off, unset leaves it to the TTY check."""
    value = os.environ.get("SEDIMENT_PROGRESS", "").strip().lower()
    if value in ("1", "yes", "true", "on"):
        return True
    if value in ("0", "no", "false", "off"):
        return False
    return None


def _human(n: float, unit: str) -> str:
    """``1536, "B"`` -> ``1.5 KiB``; other units step by 1000 with no unit (``12.3k``)."""
    binary = unit == "B"
    steps, base = (("B", "KiB", "MiB", "GiB", "TiB"), 1024.0) if binary else (("", "k", "M", "G", "T"), 1000.0)
    for step in steps:
        if abs(n) < base or step == steps[-1]:
            text = f"{n:.0f}" if step in ("", "B") else f"{n:.1f}"
            return f"{text} {step}" if binary else f"{text}{step}"
        n /= base
    raise AssertionError("unreachable")


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """A progress bar: ``total`` units (0 or None when unknown), advanced by :meth:`update`.

    A no-op unless enabled, so callers never need to test for a terminal themselves.
    """

    def __init__(self, total: int | None, label: str = "", unit: str = "", *,
                 stream: TextIO | None = None, force: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = int(total) if total else 0
        self.label = label
        self.unit = unit
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        if force is None:
            force = progress_forced()
        if force is None:
            isatty = getattr(self._stream, "isatty", None)
            force = bool(isatty and isatty())
        self.enabled = bool(force)
        self._clock = clock
        self._start = clock()
        self._last_draw = float("-inf")
        self._suffix = f" {unit}" if unit and unit != "B" else ""
        self._width = 0  # length of the last line drawn, to blank leftovers of a longer one

    def update(self, n: int = 1) -> None:
        """Advance by ``n`` units; redraws at most every 0.1 s."""
        self.done += n
        if not self.enabled:
            return
        now = self._clock()
        if now - self._last_draw >= _INTERVAL:
            self._draw(now)

    def set(self, done: int) -> None:
        """Set the absolute position (for sources that report where they are, like a file offset)."""
        self.update(done - self.done)

    def line(self, now: float | None = None) -> str:
        """The bar's text: label, bar, percentage, count, rate and ETA (when the total is known)."""
        now = self._clock() if now is None else now
        elapsed = max(now - self._start, 1e-9)
        rate = self.done / elapsed
        parts = [self.label] if self.label else []
        if self.total:
            frac = min(1.0, self.done / self.total)
            filled = int(frac * _WIDTH)
            parts.append("[" + "#" * filled + "." * (_WIDTH - filled) + f"] {frac * 100:5.1f}%")
            parts.append(f"{_human(self.done, self.unit)}/{_human(self.total, self.unit)}{self._suffix}")
        else:
            parts.append(_human(self.done, self.unit) + self._suffix)
        parts.append(f"{_human(rate, self.unit)}{self._suffix}/s")
        if self.total and rate > 0 and self.done < self.total:
            parts.append(f"ETA {_clock((self.total - self.done) / rate)}")
        else:
            parts.append(f"in {_clock(elapsed)}")
        return " ".join(parts)

    def _draw(self, now: float) -> None:
        self._last_draw = now
        text = self.line(now)
        self._stream.write("\r" + text + " " * max(0, self._width - len(text)))
        self._stream.flush()
        self._width = len(text)

    def close(self) -> None:
        """Draw the final state and end the line (nothing if disabled)."""
        if self.enabled:
            self._draw(self._clock())
            self._stream.write("\n")
            self._stream.flush()
            self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
