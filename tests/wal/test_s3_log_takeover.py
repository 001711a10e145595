"""Taking the log on S3 over from a writer that appends back to back (an S3-only deployment's
documented takeover, README "An S3-only deployment"): the open must win within a bounded
number of requests whatever the old writer does, every append the old writer acknowledged
must be in what the new epoch reads, and the old writer must be fenced.

The old writer is a real process (tests/support/s3_writer.py: several appender threads keep
its one PUT always in flight, and every other generation trims); the opens run here. S3 is a process of its own
(support/s3_process.py: a race between two processes must not be skewed by the test's
interpreter lock), reached through the proxy that serializes conditional requests, as S3
does: moto alone can let a claim and a racing PUT both win."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from support.fixtures_s3 import unique_bucket_name
from support.s3_process import s3_process
from support.s3_writer import Writer, start_writer

from sediment.errors import WalFenced, WalTakenOverInFlight
from sediment.wal import record as rec
from sediment.wal.s3_log import S3Log

pytestmark = [pytest.mark.s3, pytest.mark.timeout(240)]
OPENS = 20
PUTS = 10 + 63  # an open's PUTs at most: 10 claims and the plugs of the last step (docs/formats.md, "The bound")


@pytest.fixture
def spec(moto_server) -> Iterator[str]:
    """A log's spec on S3 in a process of its own (``moto_server`` for its credentials)."""
    bucket = unique_bucket_name()
    with s3_process(bucket) as endpoint:
        yield f"s3://{bucket}/log?endpoint={endpoint}"


def check_read_back(log: S3Log, writer: Writer, gen: int) -> None:
    """Every append acknowledged by generations up to ``gen`` at its LSN, once (those the
    writer's trims left); nothing else but appends in doubt; LSNs one after another."""
    every = list(log.scan())
    assert [r.lsn for r in every] == list(range(log.start_lsn, log.end_lsn)), "a gap or a repeat in the LSNs"
    records = [r for r in every if r.kind == rec.RecordKind.UPDATES]
    at = {bytes(r.body): r.lsn for r in records}
    assert len(at) == len(records), "an append twice"
    lost = {b: lsn for b, lsn in writer.acked.items()
            if int(b.split(b"-")[0]) <= gen and lsn >= log.start_lsn and at.get(b) != lsn}
    assert not lost, f"acknowledged appends missing or moved: {sorted(lost.items())[:5]}"
    phantom = set(at) - set(writer.acked) - writer.doubt
    assert not phantom, f"appends never acknowledged nor in doubt: {sorted(phantom)[:5]}"


def test_an_open_takes_the_log_over_from_a_writer_appending_back_to_back(spec):
    S3Log.open(spec, create=True).close()
    writer = start_writer(spec)
    took, puts = [], []
    try:
        for gen in range(1, OPENS + 1):
            writer.wait_acks(gen, 20)
            began = time.monotonic()
            log = S3Log.open(spec)
            took.append(time.monotonic() - began)
            puts.append(log.requests["put"])
            try:
                writer.wait_fenced(gen)
                check_read_back(log, writer, gen)
            finally:
                log.close()
            writer.again()
        assert set(writer.errors) <= {WalFenced.__name__, WalTakenOverInFlight.__name__}, writer.errors
    finally:
        writer.stop()
    assert max(puts) <= PUTS and max(took) < 20.0, (puts, took)
