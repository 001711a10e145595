"""Child processes that take Ctrl-C as they would at a terminal.

Why: a shell without job control starts a background job with SIGINT ignored, children
inherit that, and Python then installs no KeyboardInterrupt handler. A suite run that way
(a script's `make test &`) would see every test that sends SIGINT hang; the tests that do
pass this as ``preexec_fn`` so the child starts with SIGINT's default action.
"""

from __future__ import annotations

import signal


def sigint_as_at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
