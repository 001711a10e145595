"""A cluster client's call that meets its deadline while the partition has no owner that
serves it ends with the client's deadline error: ``CoordinatorUnavailable`` (nothing was
tried in doubt), ``OutcomeUnknown`` for a write after a try in doubt; never with the last
redirect itself (``NotPartitionOwner``, a NothingWritten error: for a keyed append whose
earlier try may have landed that would say nothing was written). Real processes: an
S3-only cluster of one member behind a fault proxy that refuses every write of partition
0's log, so the member cannot open it and answers "owner being chosen"; the member is
SIGSTOPped while the call is at it, so that the answer arrives past the deadline."""

from __future__ import annotations

import re
import signal
import threading
from pathlib import Path

import pytest
from support.cluster_procs import TOKEN, S3Cluster
from support.faulty_proxy import FaultyProxy
from support.waiting import poll_until
from test_cluster import SCHEMA, rows

import sediment
from sediment.errors import CoordinatorUnavailable

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.timeout(180)]
LEASE = 10.0  # the member stays in touch through its pause (renewed within two thirds of it)
DEADLINE = 1.0
PAUSE = 2.5  # longer than the deadline: the member's answer arrives after it


def test_a_redirect_met_past_the_deadline_is_no_answer(tmp_path, moto_server, s3_bucket):
    with FaultyProxy(moto_server.endpoint, serialize_conditional=True) as proxy:
        cluster = S3Cluster(tmp_path, proxy.endpoint, s3_bucket[1], partitions=1, lease_time=LEASE)
        try:
            first = cluster.start_member()
            cluster.wait_assigned([first], timeout=60)
            with sediment.connect(cluster.uri, token=TOKEN, timeout=30) as db:
                db.add_relation("r0", SCHEMA, partition=0)
                db.append("r0", rows([1]))
            name = cluster.uri.split("/")[3].split("?")[0]
            log_put = re.compile(rf"^/[^/]+/{re.escape(name)}-wal/p0/")
            proxy.fail_next(10**6, 503, match=lambda method, path: method == "PUT" and bool(log_put.match(path)))
            first.signal(signal.SIGKILL)
            first.wait()
            member = cluster.start_member()  # its open of partition 0 cannot claim the log
            poll_until(lambda: "could not open partition 0" in Path(member.log.name).read_text(), 90,
                       "the member's try to open partition 0")
            with sediment.connect(cluster.uri, token=TOKEN, timeout=30, deadline=DEADLINE) as db:
                outcome: list[object] = []

                def append() -> None:
                    try:
                        db.append("r0", rows([2]))
                        outcome.append("acknowledged")
                    except Exception as exc:  # noqa: BLE001 - the answer under test
                        outcome.append(exc)

                member.signal(signal.SIGSTOP)
                try:
                    sender = threading.Thread(target=append, daemon=True)
                    sender.start()
                    sender.join(PAUSE)  # the call waits on the stopped member meanwhile
                finally:
                    member.signal(signal.SIGCONT)
                sender.join(60)
            assert len(outcome) == 1 and isinstance(outcome[0], CoordinatorUnavailable), outcome
            assert "being chosen" in str(outcome[0]) or "cannot open it" in str(outcome[0]), outcome
        finally:
            cluster.close()
