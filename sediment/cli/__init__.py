"""The ``sediment`` command line: manage relations, append files, seal, read, verify a data
directory, serve it (``sediment --help`` lists the commands, sediment/cli/parser.py builds them).

Users never see a traceback: every failure is one ``sediment: error: ...`` line on
stderr, exit code 2 for a malformed command line and 1 for an operation that
failed (``SEDIMENT_DEBUG=1`` re-raises, for developers); Ctrl-C exits quietly with 130.
A failed command leaves the data directory's contents as they were: inputs are
checked before anything is written, and an append is one transaction, so it lands
whole or not at all.
"""


from __future__ import annotations

import os
from typing import Any

__all__ = ["InputError", "UsageError", "build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point (:func:`sediment.cli.app.main`). Its modules load here,
    not when the console script imports this package, so a Ctrl-C while they load (about
    0.3 s) is the same quiet exit 130 as one during the command, not a traceback."""
    try:
        from sediment.cli.app import main as run
    except KeyboardInterrupt:
        if os.environ.get("SEDIMENT_DEBUG", "").strip() not in ("", "0"):
            raise
        return 130  # app.EXIT_INTERRUPTED, which did not finish loading
    return run(argv)


def __getattr__(name: str) -> Any:
    if name in ("InputError", "UsageError"):
        from sediment.cli import files

        return getattr(files, name)
    if name == "build_parser":
        from sediment.cli.parser import build_parser

        return build_parser
    raise AttributeError(f"module 'sediment.cli' has no attribute {name!r}")
