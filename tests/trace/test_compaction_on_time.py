"""Compaction on time: the compacter finishes a segment whose data is ``compact_interval``
old, so a sealed update reaches a batch within about two intervals even on a quiet log."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from trio.testing import MockClock

import sediment
from sediment.trace.wal_cut import SegmentAge

SCHEMA = pa.schema([("k", pa.int64())])


def ups(ks, t):
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array([t] * len(ks), pa.int64()),
                     "diff": pa.array([1] * len(ks), pa.int64())})


def run_model(interval: int, gaps: tuple[int, ...], arrivals: set[int], size_finishes: set[int]):
    """Replay one schedule: wakes separated by ``gaps`` (each <= interval), records arriving
    at ``arrivals``, the log rolling by size at ``size_finishes``. Returns, per record, its
    arrival time and the time its segment finished (None if never)."""
    age = SegmentAge(started=0)
    wakes, t = set(), 0
    for g in gaps:
        t += g
        wakes.add(t)
    end = finished = 0
    arrived: list[int] = []
    done: dict[int, int] = {}
    for now in range(0, t + 1):
        if now in wakes:  # a wake sees what arrived strictly before it
            if age.due(finished, end, now, interval):
                finished = end
                age.finished()
        if now in size_finishes:
            finished = end
        if now in arrivals:
            arrived.append(now)
            end += 1
        for lsn in range(len(arrived)):
            if lsn < finished and lsn not in done:
                done[lsn] = now
    return arrived, done, t


@pytest.mark.parametrize("interval", [1, 2, 3])
def test_every_record_is_finished_within_two_intervals_brute_force(interval):
    """All wake schedules with gaps <= interval, all arrival and size-roll patterns over a
    short horizon: a record is finished at most 2 * interval after it arrived."""
    horizon = 7
    checked = 0
    for n in range(1, horizon + 1):
        for gaps in itertools.product(range(1, interval + 1), repeat=n):
            if sum(gaps) > horizon + 2 * interval or sum(gaps) < horizon:
                continue
            for arrivals_bits in range(1 << horizon):
                arrivals = {i for i in range(horizon) if arrivals_bits >> i & 1}
                for sizes in ({}, {3}, {1, 5}):
                    arrived, done, last = run_model(interval, gaps, arrivals, set(sizes))
                    for lsn, at in enumerate(arrived):
                        if at + 2 * interval <= last:
                            assert lsn in done and done[lsn] - at <= 2 * interval, (gaps, arrivals, sizes, lsn)
                    checked += 1
    assert checked > 100


def test_segment_age_waits_a_full_interval_and_resets():
    age = SegmentAge()
    assert not age.due(0, 0, 0.0, 5.0)  # nothing unfinished
    assert not age.due(0, 3, 1.0, 5.0)  # first seen at 1.0: arrived after the wake at 0.0
    assert age.since == 0.0
    assert not age.due(0, 3, 4.9, 5.0)
    assert age.due(0, 3, 5.0, 5.0)
    age.finished()
    assert not age.due(3, 3, 7.0, 5.0) and age.since is None
    assert not age.due(3, 4, 8.0, None), "no interval, no finishing by age"
    first = SegmentAge(started=2.0)
    assert not first.due(0, 3, 6.0, 5.0) and first.since == 2.0, "written before the start: counted from it"
    assert first.due(0, 3, 7.0, 5.0)


def test_a_quiet_relation_reaches_a_batch_within_two_intervals(tmp_path):
    """A local engine with the default 64 MiB segments and the background compacter on,
    under a MockClock moved by the test: the sealed update is in a batch by 2 intervals."""
    interval = 30.0
    clock = MockClock(rate=0)
    eng = sediment.open(tmp_path / "d", compact_interval=interval, clock=clock)
    try:
        eng.add_relation("r", SCHEMA)
        eng.append("r", ups([1, 2, 3], 1))
        eng.seal("r", 1)
        sealed_at = clock.current_time()
        compacter = eng.scheduler
        passes = compacter.passes
        steps = 0
        while eng.trace_info("r")["upper"] <= 1:
            clock.jump(interval / 2)
            compacter.tick()  # the loop notices the jumped clock; its own timer runs the pass
            steps += 1
            if steps % 2 == 0:
                passes += 1
                assert compacter.wait_passes(passes, 30), "the compacter's timer did not fire"
            assert steps <= 8, "the sealed update never reached a batch"
        assert clock.current_time() - sealed_at <= 2 * interval
        assert clock.current_time() - sealed_at >= interval, "finished by age before the data was old"
        info = eng.trace_info("r")
        assert info["batches"] >= 1 and info["tail_records"] == 0
        assert sorted(eng.snapshot("r", 1).column("k").to_pylist()) == [1, 2, 3]
        assert eng.wal.finished_lsn > 0, "the 64 MiB segment was finished by age, not by size"
    finally:
        eng.close()
