"""Run the ``sediment`` command line in a process that SIGKILLs itself at one step of one
relation: ``python member_kill_at.py STEP... -- SEDIMENT ARGS``, each STEP
``module:Class.method|before/after|relation``. The real step runs unchanged (for "after",
to its end); only the moment of the kill is chosen, so the process dies between two writes
that a real crash could separate (as tests/support/faults_kills.py does for the engine)."""

from __future__ import annotations

import functools
import importlib
import os
import signal
import sys


def arm(spec: str) -> None:
    """Make this process SIGKILL itself at the first call of ``spec``'s step naming its relation."""
    where, when, relation = spec.split("|")
    module, qual = where.split(":")
    owner = importlib.import_module(module)
    *path, name = qual.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, name)

    @functools.wraps(real)
    def step(self, rel, *args, **kwargs):
        if rel == relation and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(self, rel, *args, **kwargs)
        if rel == relation:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(owner, name, step)


if __name__ == "__main__":
    split = sys.argv.index("--")
    for spec in sys.argv[1:split]:
        arm(spec)
    from sediment.cli import main

    sys.exit(main(sys.argv[split + 1:]))
