"""A whole cluster stopped at once (every member SIGTERMed together, as a deployment's stop
does) exits promptly: no member can hand its partitions over when every other one is leaving
too, so none waits out the 20 s hand-over timeout for a taker that never comes, and each says
why it closed them instead."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from sediment.cli.cluster import LEAVE_TIMEOUT

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(120)]


def test_members_stopped_together_exit_without_waiting_out_the_hand_over(cluster):
    members = [cluster.start_member() for _ in range(2)]
    cluster.wait_assigned(members)
    stopped = time.monotonic()
    for m in members:
        m.signal(signal.SIGTERM)
    assert [m.wait(timeout=LEAVE_TIMEOUT + 30) for m in members] == [0, 0]
    took = time.monotonic() - stopped
    logs = [Path(m.log.name).read_text() for m in members]
    assert took < LEAVE_TIMEOUT / 2, (took, logs)
    assert not any("still held after" in log for log in logs), logs
    said = [line for log in logs for line in log.splitlines() if "partitions not handed over" in line]
    assert said and all(line.endswith("(every other member is leaving too); closing them") for line in said), logs
