"""Progress for long operations (append, compaction, verify, the demo's phases), on stderr.

Three ways to show it, chosen once per display:

- ``bar``: a live ``tqdm`` bar, when the stream is a terminal;
- ``lines``: when progress is asked for (``force=True``, ``--progress`` or
  ``SEDIMENT_PROGRESS=1``) but the stream is not a terminal (a log file, CI): one line
  when the phase starts and one when it ends, so a log says what is being done while it
  is done without filling up with redraws;
- ``off``: by default when the stream is not a terminal (a pipe or file gets nothing it
  did not ask for), and with ``force=False``, ``--no-progress`` or ``SEDIMENT_PROGRESS=0``.

A phase counts when it has a unit or a total: its closing line then gives the count and
rate; one that counts nothing (a compaction pass, say) gives the time only.

    with Progress(total=size, label="append", unit="B") as bar:
        for chunk in chunks:
            ...
            bar.update(len(chunk))
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from tqdm import tqdm

from sediment.clock import MONOTONIC, Clock


def progress_forced() -> bool | None:
    """``SEDIMENT_PROGRESS``: 1/yes forces progress on, 0/no off, unset leaves it to the TTY check."""
    value = os.environ.get("SEDIMENT_PROGRESS", "").strip().lower()
    if value in ("1", "yes", "true", "on"):
        return True
    if value in ("0", "no", "false", "off"):
        return False
    return None


def _human(n: float, unit: str, *, rate: bool = False) -> str:
    """``1536, "B"`` -> ``1.5 KiB``; other units step by 1000 (``12.3k rows``), and a count of
    exactly one takes the singular (``1 row``; a rate keeps ``rows/s``)."""
    binary = unit == "B"
    steps, base = (("B", "KiB", "MiB", "GiB", "TiB"), 1024.0) if binary else (("", "k", "M", "G", "T"), 1000.0)
    for step in steps:
        if abs(n) < base or step == steps[-1]:
            text = f"{n:.0f}" if step in ("", "B") else f"{n:.1f}"
            if not rate and text == "1" and step == "" and unit.endswith("s"):
                unit = unit[:-1]
            return f"{text} {step}" if binary else f"{text}{step}" + (f" {unit}" if unit else "")
        n /= base
    raise AssertionError("unreachable")


class Progress:
    """Progress of ``total`` units (0 or None when unknown), advanced by :meth:`update`. Callers
    never test for a terminal themselves: the display picks its mode (see the module doc)."""

    def __init__(self, total: int | None, label: str = "", unit: str = "", *,
                 stream: TextIO | None = None, force: bool | None = None,
                 clock: Clock = MONOTONIC) -> None:
        self.total = int(total) if total else 0
        self.label = label or "working"
        self.unit = unit
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        if force is None:
            force = progress_forced()
        isatty = getattr(self._stream, "isatty", None)
        terminal = bool(isatty and isatty())
        if force is False or (force is None and not terminal):
            self.mode = "off"
        else:
            self.mode = "bar" if terminal else "lines"
        self.counts = bool(unit or self.total)
        self._clock = clock
        self._start = clock.current_time()
        self._bar: tqdm | None = None
        if self.mode == "bar":
            self._bar = tqdm(total=self.total or None, desc=self.label, unit=unit or "it",
                             unit_scale=unit == "B" or self.total >= 10_000,
                             unit_divisor=1024 if unit == "B" else 1000,
                             file=self._stream, mininterval=0.1, dynamic_ncols=True, leave=True,
                             **({} if self.counts else {"bar_format": "{desc}: {elapsed}"}))
        elif self.mode == "lines":
            of = f", {_human(self.total, unit)}" if self.total else ""
            self._write(f"{self.label}: started{of}")

    def _write(self, line: str) -> None:
        self._stream.write(line + "\n")
        self._stream.flush()

    def update(self, n: int = 1) -> None:
        """Advance by ``n`` units."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def set(self, done: int) -> None:
        """Set the absolute position (for sources that report where they are, like a file offset)."""
        self.update(done - self.done)

    def summary(self, now: float | None = None) -> str:
        """The closing line: label, count, time and rate (the time only for a phase that counts nothing)."""
        now = self._clock.current_time() if now is None else now
        elapsed = max(now - self._start, 1e-9)
        if not self.counts:
            return f"{self.label}: done in {elapsed:.1f} s"
        return (f"{self.label}: done, {_human(self.done, self.unit)} in {elapsed:.1f} s "
                f"({_human(self.done / elapsed, self.unit, rate=True)}/s)")

    def close(self) -> None:
        """End the display: the bar's final state, or the closing line. Idempotent."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.mode == "lines":
            self._write(self.summary())
        self.mode = "off"

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None and self.mode == "lines":
            line = self.summary().replace(": done,", ": stopped after", 1)
            self._write(line.replace(": done in", ": stopped after", 1))
            self.mode = "off"
        self.close()
