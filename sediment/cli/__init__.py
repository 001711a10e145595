"""The ``sediment`` command line: manage relations, append files, seal, read, verify a data
directory, serve it (``sediment --help`` lists the commands, sediment/cli/parser.py builds them).

Users never see a traceback: every failure is one ``sediment: error: ...`` line on
stderr, exit code 2 for a malformed command line and 1 for an operation that
failed (``SEDIMENT_DEBUG=1`` re-raises, for developers); Ctrl-C exits quietly with 130.
A failed command leaves the data directory's contents as they were: inputs are
checked before anything is written, and an append is one transaction, so it lands
whole or not at all.
"""

from sediment.cli.app import main
from sediment.cli.files import InputError, UsageError
from sediment.cli.parser import build_parser

__all__ = ["InputError", "UsageError", "build_parser", "main"]
