"""Logging for the command line: the standard ``logging`` module, on stderr, as text or as
one JSON object per line (``--log-level``, ``--log-format``)."""

from __future__ import annotations

import json
import logging
import sys
import time

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:

        out = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(level: str, fmt: str) -> None:
    """The standard ``logging`` module, configured once per command: stderr, ``level``, text or JSON."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        formatter: logging.Formatter = JsonLogFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_sediment", False)]:
        root.removeHandler(old)
    handler._sediment = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
