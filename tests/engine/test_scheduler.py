"""The background scheduler (engine/scheduler.py): a failed compaction pass is kept in
``last_error`` and retried at the next wake, and the merge task is woken after it all the
same (merges rewrite what is already in the traces; a pass that keeps failing, say on a
relation whose WAL records cannot be read, must not stop them)."""

from __future__ import annotations

import threading

from sediment.clock import ManualClock
from sediment.engine.scheduler import Scheduler

TIMEOUT = 30.0


class Steps:
    """A pass that fails its first ``failures`` runs, and a merge that counts its runs."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.passes = 0
        self.merges = 0
        self.lock = threading.Lock()

    def run_pass(self) -> None:
        with self.lock:
            self.passes += 1
            if self.passes <= self.failures:
                raise OSError(f"pass {self.passes}: the blob store is unreachable")

    def run_merge(self) -> None:
        with self.lock:
            self.merges += 1


def wake_and_settle(s: Scheduler, passes: int) -> None:
    s.notify()
    assert s.wait_passes(passes, TIMEOUT)
    assert s.wait_merges_idle(TIMEOUT)


def test_the_merge_runs_after_a_failed_pass_and_the_pass_is_retried_at_the_next_wake():
    steps = Steps(failures=2)
    s = Scheduler(steps.run_pass, steps.run_merge, None, ManualClock())
    s.start()
    try:
        wake_and_settle(s, 1)
        assert steps.passes == 1 and isinstance(s.last_error, OSError) and "pass 1" in str(s.last_error)
        assert steps.merges == 1 and s.merges == 1  # woken although the pass failed
        wake_and_settle(s, 2)
        assert "pass 2" in str(s.last_error) and steps.merges == 2
        wake_and_settle(s, 3)  # the retry succeeds: the error is cleared
        assert s.last_error is None and steps.passes == 3 and steps.merges == 3
    finally:
        s.stop()


def test_a_failing_merge_does_not_stop_the_passes_or_later_merges():
    steps = Steps(failures=0)
    failing = {"left": 1}

    def run_merge() -> None:
        steps.run_merge()
        if failing["left"]:
            failing["left"] -= 1
            raise OSError("merge: the blob store is unreachable")

    s = Scheduler(steps.run_pass, run_merge, None, ManualClock())
    s.start()
    try:
        wake_and_settle(s, 1)
        assert steps.merges == 1 and s.merges == 1 and s.last_error is None
        wake_and_settle(s, 2)
        assert steps.passes == 2 and steps.merges == 2 and s.merges == 2
    finally:
        s.stop()
