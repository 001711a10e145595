"""Run the ``sediment`` command line in a process whose steps a test can hold:
``python member_hold_at.py DIR STEP... -- SEDIMENT ARGS``, each STEP ``module:Class.method``.
While the file ``DIR/<method>.hold`` exists, a call of that step touches ``DIR/<method>.reached``
and waits (a trio task's step: only that task) (at most ``HOLD_LIMIT`` seconds) until the test removes the hold file, then runs
the real step unchanged. The process stays live and in touch meanwhile: only that step is
late, as a slow request or a long pause of one thread would make it (a control pass whose
read of the assignment lags, say), which a proxy cannot arrange when two steps send the
same request."""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import time
from pathlib import Path

HOLD_LIMIT = 120.0  # seconds a held step waits at most
POLL = 0.01


def hold_file(directory: Path, spec: str) -> Path:
    return directory / f"{spec.rsplit('.', 1)[1]}.hold"


def reached_file(directory: Path, spec: str) -> Path:
    return directory / f"{spec.rsplit('.', 1)[1]}.reached"


def arm(directory: Path, spec: str) -> None:
    """Make ``spec``'s step wait while its hold file exists."""
    module, qual = spec.split(":")
    owner = importlib.import_module(module)
    *path, name = qual.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, name)
    hold, reached = hold_file(directory, spec), reached_file(directory, spec)

    def held() -> bool:
        if hold.exists():
            reached.touch()
            return True
        return False

    @functools.wraps(real)
    def step(*args, **kwargs):
        deadline = time.monotonic() + HOLD_LIMIT
        while held() and time.monotonic() < deadline:
            time.sleep(POLL)
        return real(*args, **kwargs)

    @functools.wraps(real)
    async def async_step(*args, **kwargs):  # a trio task: only it waits, not its event loop
        import trio

        deadline = time.monotonic() + HOLD_LIMIT
        while held() and time.monotonic() < deadline:
            await trio.sleep(POLL)
        return await real(*args, **kwargs)

    setattr(owner, name, async_step if inspect.iscoroutinefunction(real) else step)


if __name__ == "__main__":
    split = sys.argv.index("--")
    where = Path(sys.argv[1])
    for spec in sys.argv[2:split]:
        arm(where, spec)
    from sediment.cli import main

    sys.exit(main(sys.argv[split + 1:]))
