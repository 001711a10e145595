"""``sediment serve`` stops on SIGTERM whatever its main thread is doing when the handler runs.

Why: Python runs a signal handler in the main thread between two bytecodes, wherever that
thread is. The handler sets the stop event, and ``Event.set`` takes the event's lock; the
main thread holds that same lock for a few bytecodes after each of its timed waits on the
event (``Condition.wait`` re-takes it). A SIGTERM landing there made the handler wait for a
lock its own thread held: serve hung for good, a second SIGTERM too (seen once by hand,
rare, so the test puts the main thread in that state on purpose, in a child process it can
time out)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import signal
    from sediment.cli.serve import _stop_on_signals

    with _stop_on_signals() as (stop, signalled):
        with stop._cond:  # held, as Event.wait holds it right after each timed wake
            signal.raise_signal(signal.SIGTERM)  # its handler runs in this thread, here
            ran = True
        assert stop.wait(0) and signalled.is_set()
    print("stopped")
""")


def test_a_sigterm_handled_while_the_main_thread_holds_the_stop_events_lock_stops_serve():
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        raise AssertionError("the SIGTERM handler waited for the lock its own thread held: serve would hang") from None
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"
