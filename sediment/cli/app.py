"""The command line's entry point: parse, run one command, turn every failure into one line
on stderr and an exit code (0 ok, 1 operation failed, 2 bad command line)."""

from __future__ import annotations

import os
import sys

import pyarrow as pa

from sediment.cli.common import describe
from sediment.cli.files import UsageError
from sediment.cli.logs import configure_logging
from sediment.cli.parser import build_parser
from sediment.errors import SedimentError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
LOCAL_ONLY = frozenset({"verify", "demo", "serve", "storage-node"})  # commands --connect cannot reach


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"sediment: error: {code}\n")
    return 2


def _fail(message: str) -> None:
    try:
        sys.stderr.write(f"sediment: error: {message}\n")
        sys.stderr.flush()
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit code (0 ok, 1 operation failed, 2 bad command line, 130
    interrupted by Ctrl-C, quietly: the user asked for it, so there is nothing to report).

    The one place errors become messages, so no command needs its own handler and no
    user sees a traceback; ``SEDIMENT_DEBUG=1`` re-raises instead."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        if _debug():
            raise
        return EXIT_INTERRUPTED
    except BaseExceptionGroup as group:  # a trio loop's (storage-node): Ctrl-C arrives inside a group
        if _debug() or group.split(KeyboardInterrupt)[1] is not None:
            raise
        return EXIT_INTERRUPTED


def _debug() -> bool:
    """``SEDIMENT_DEBUG=1``: re-raise instead of printing one line."""
    return os.environ.get("SEDIMENT_DEBUG", "").strip() not in ("", "0")


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors (already printed)
        return _exit_code(exc.code)
    debug = _debug()
    configure_logging(getattr(args, "log_level", "warning"), getattr(args, "log_format", "text"))
    try:
        if getattr(args, "connect", None) and args.command in LOCAL_ONLY:
            raise UsageError(f"`sediment {args.command}` works on the data directory's files, not through "
                             "--connect: run it where the data directory is")
        return args.func(args)
    except UsageError as exc:
        if debug:
            raise
        _fail(describe(exc))
        return 2
    except BrokenPipeError:  # `sediment read ... | head`: the reader left, nothing to report
        if sys.stdout is sys.__stdout__:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush is quiet too
        return 1
    except (SedimentError, OSError, ValueError, pa.ArrowException) as exc:
        if debug:
            raise
        _fail(describe(exc))
        return 1
    except Exception as exc:  # a bug: still one line, with the way to see more
        if debug:
            raise
        _fail(f"internal error: {type(exc).__name__}: {describe(exc)} (rerun with SEDIMENT_DEBUG=1 for the "
              "traceback, and please report it)")
        return 1
