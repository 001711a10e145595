"""Time passed in (sediment.clock): read-plan leases and the device ring's wait for room expire
on the clock they were given, at exactly the deadline, and never sleep in the test."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pyarrow as pa
import pytest

import sediment
from sediment.clock import Clock, ManualClock, MonotonicClock
from sediment.engine.collector import ReaderPins
from sediment.errors import WalFull
from sediment.wal.device.log import DeviceLog
from sediment.wal.record import Record, RecordKind

SCHEMA = pa.schema([("k", pa.int64())])


def rows(ks: list[int], t: int) -> pa.Table:
    return pa.table({"k": ks, "time": [t] * len(ks), "diff": [1] * len(ks)})


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(10.0)
    moved: list[float] = []
    clock.on_advance(lambda: moved.append(clock.current_time()))
    assert isinstance(clock, Clock) and isinstance(MonotonicClock(), Clock)
    assert clock.current_time() == 10.0
    assert clock.deadline_to_sleep_time(10.0) == 0.0 and clock.deadline_to_sleep_time(10.5) > 3600
    assert clock.advance(2.5) == 12.5 and moved == [12.5]
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1)
    assert clock.current_time() == 12.5 and moved == [12.5]


def test_reader_pins_against_a_model() -> None:
    """Random pins, leases, releases, new generations and clock moves: idle exactly when the
    model says no read is in progress and no lease is both unreleased and before its deadline,
    and the oldest generation held is the model's."""
    for seed in range(200):
        rnd = random.Random(seed)
        clock = ManualClock()
        pins = ReaderPins(clock)
        model_pins: list[int] = []
        model_leases: dict[int, float] = {}
        lease_starts: dict[int, int] = {}
        generation = 0
        for _ in range(40):
            op = rnd.randrange(6)
            if op == 0:
                assert pins.pin() == generation
                model_pins.append(generation)
            elif op == 1 and model_pins:
                pins.unpin(model_pins.pop(rnd.randrange(len(model_pins))))
            elif op == 2:
                seconds = rnd.choice([0, 1, 2.5, 10])
                lease = pins.lease(seconds)
                model_leases[lease], lease_starts[lease] = clock.current_time() + seconds, generation
            elif op == 3:
                lease = rnd.randrange(1, 12)
                assert pins.release(lease) == (lease in model_leases)
                model_leases.pop(lease, None)
            elif op == 4:
                generation += 1
                assert pins.advance() == generation
            else:
                clock.advance(rnd.choice([0, 0.5, 1, 3]))
            ended = pins.expire()
            due = sorted(k for k, d in model_leases.items() if d <= clock.current_time())
            assert sorted(ended) == due
            for k in due:
                del model_leases[k]
            assert pins.leases == model_leases
            starts = model_pins + [lease_starts[k] for k in model_leases]
            assert pins.oldest() == (min(starts) if starts else None)
            assert pins.idle == (not model_pins and not model_leases)


def test_read_plan_lease_expires_on_the_engine_clock(tmp_path: Path) -> None:
    """A read plan's lease keeps replaced batches in the blob store until its deadline on the
    clock the engine was opened with; at the deadline they are deleted."""
    clock = ManualClock()
    with sediment.open(tmp_path / "d", clock=clock) as eng:
        eng.add_relation("r", SCHEMA)
        eng.append("r", rows([1, 2], 1))
        eng.append("r", rows([3], 5))  # above the seal: kept in a pending blob
        eng.seal("r", 1)
        eng.compact()
        (pending,) = [p.key for p in eng.view.relations["r"].trace.pending]
        plan = eng.plan_read("r", as_of=1, lease_seconds=60)
        assert eng.collector.readers.leases == {plan.lease: 60.0}

        eng.seal("r", 5)
        eng.compact()  # the pending blob is folded into a batch: garbage, but leased
        assert pending not in [p.key for p in eng.view.relations["r"].trace.pending]
        clock.advance(59.999)
        eng.compact()
        assert pending in eng.traces.blobs.list("trace/"), "deleted while a lease still held it"
        assert eng.collector.readers.leases == {plan.lease: 60.0}

        clock.advance(0.001)
        eng.compact()
        assert eng.collector.readers.leases == {}
        assert pending not in eng.traces.blobs.list("trace/"), "kept after the lease expired"
        eng.release_read(plan.lease)  # expired already: nothing to do
        assert eng.snapshot("r", 5).column("k").to_pylist() == [1, 2, 3]


def test_device_ring_waits_for_room_until_its_clock_says_full_timeout(tmp_path: Path) -> None:
    """An append to a full ring waits for a trim; it gives up (WalFull) when ``full_timeout``
    has passed on the ring's clock, not before."""
    clock = ManualClock()
    log = DeviceLog.open(tmp_path / "ring", 256 * 1024, create=True, segment_bytes=1 << 40,
                         full_timeout=3600.0, clock=clock)
    body = bytes(3000)
    n = 0
    while log.end_lsn + 2 * 4096 <= 256 * 1024 - 2 * 4096:
        log.append([Record(RecordKind.UPDATES, relation_id=1, t_lo=n, t_hi=n, count=1, body=body)])
        n += 1
    log.finish_segment()
    errors: list[BaseException] = []
    waiting = threading.Event()

    def appender() -> None:
        waiting.set()
        try:
            log.append([Record(RecordKind.UPDATES, relation_id=1, t_lo=n, t_hi=n, count=1, body=body)])
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    t = threading.Thread(target=appender)
    t.start()
    assert waiting.wait(10)
    assert log.wait_for_full_waiters(1, timeout=10)  # the append is parked on the full ring
    assert log.full_waiters == 1
    clock.advance(3599.999)
    t.join(0.2)
    assert t.is_alive() and not errors, "gave up before full_timeout on its clock"
    clock.advance(0.001)
    t.join(10)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], WalFull)
    log.close()
