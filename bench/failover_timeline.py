"""Where a failover's time goes: the members' log lines of one move of a partition, read back
beside the bench's own clock (kill sent, first acknowledgement), as phases in seconds.

Members log in the text format (``%(asctime)s``: local time, milliseconds); the bench runs on
the same machine, so ``time.time()`` and those stamps share a clock.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from pathlib import Path

PHASES = ("detect", "assign", "notify", "fence", "open", "client")
LABELS = {
    "detect": "kill -> manager sees the member gone",
    "assign": "-> assignment written",
    "notify": "-> new owner starts opening",
    "fence": "-> its store session fences the old one",
    "open": "-> new owner serves",
    "client": "-> client's first acknowledgement",
}


def _stamp(line: str) -> float | None:
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def _lines(logs: list[Path]) -> list[tuple[float, str]]:
    out = []
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            t = _stamp(line)
            if t is not None:
                out.append((t, line))
    return sorted(out)


def _first(lines: list[tuple[float, str]], after: float, *needles: str) -> float | None:
    return next((t for t, line in lines if t >= after and all(n in line for n in needles)), None)


def timeline(logs: list[Path], kill: float, acked: float, victim: str, partition: int, owner: str,
             generation: int, *, handover: bool = False) -> dict[str, float | None]:
    """Phase durations of one failover (None: its log line was not found). ``kill`` and
    ``acked`` are ``time.time()`` values taken by the bench. A ``handover`` (SIGTERM) has
    no detection: the leaving member announces itself, and is seen gone only once it exits."""
    lines = _lines(logs)
    seen = None if handover else _first(lines, kill - 0.01, "sees", victim, "gone")
    assigned = _first(lines, kill - 0.01, "assigned", f"{partition}: ('{owner}', {generation})")
    opens = _first(lines, kill - 0.01, f"{owner} opens partition {partition} (generation {generation})")
    serves = _first(lines, kill - 0.01, f"{owner} serves partition {partition} (generation {generation})")
    fence = None if opens is None else _first(lines, opens, f"partition {partition}: store session")
    points = [kill, seen, assigned, opens, fence, serves, acked]
    out: dict[str, float | None] = {}
    for name, a, b in zip(PHASES, points[:-1], points[1:], strict=True):
        out[name] = None if a is None or b is None else b - a
    if seen is None:  # a leaving member is never seen gone: the hand-over starts at the signal
        out["detect"], out["assign"] = None, None if assigned is None else assigned - kill
    return out


def summary(rows: list[dict[str, float | None]]) -> str:
    """A markdown table: per phase, the median and min-max over the failovers that logged it."""
    out = ["| phase | median | min-max | failovers |", "|---|---|---|---|"]
    for name in PHASES:
        got = [r[name] for r in rows if r.get(name) is not None]
        if got:
            out.append(f"| {LABELS[name]} | {statistics.median(got):.3f} s | {min(got):.3f}-{max(got):.3f} s "
                       f"| {len(got)} |")
        else:
            out.append(f"| {LABELS[name]} | - | - | 0 |")
    return "\n".join(out)
