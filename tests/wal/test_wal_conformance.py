"""One suite for the WriteAheadLog protocol (wal/protocol.py), run over every backend: the
file log, the device ring, the replicated log and the log on S3 (tests/support/wal_backends.py). A test that passes
on one backend and fails on another is a bug in that backend. LSNs are only compared, never
computed: the file and replicated logs number records, the ring uses byte offsets."""

from __future__ import annotations

import threading
import time

import pytest
from support.protocols import assert_takes_protocol_calls
from support.wal_backends import BACKENDS

from sediment.engine.frontiers import fold
from sediment.errors import EngineClosed, InvalidArgument, WalError
from sediment.wal import record as rec
from sediment.wal.protocol import WriteAheadLog

pytestmark = pytest.mark.timeout(120)

K = rec.RecordKind


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.s3) if name == "s3" else name for name in sorted(BACKENDS)])
def backend(request, tmp_path):
    extra = {"endpoint": request.getfixturevalue("moto_server").endpoint} if request.param == "s3" else {}
    b = BACKENDS[request.param](tmp_path, **extra)
    yield b
    b.stop()


@pytest.fixture
def log(backend):
    log = backend.open()
    yield log
    log.close()


def upd(i: int, rel: int = 1, n: int = 40) -> rec.Record:
    return rec.Record(K.UPDATES, relation_id=rel, txn_id=i % 3, t_lo=i, t_hi=i + 1, count=1 + i % 4,
                      body=(f"row-{i}-".encode() * n)[: n + i % 17])


def close_t(rel: int, t: int) -> rec.Record:
    return rec.Record(K.PROGRESS, relation_id=rel, t_lo=t, t_hi=t)


def fields(r: rec.Record) -> tuple:
    return (r.lsn, r.kind, r.relation_id, r.txn_id, r.t_lo, r.t_hi, r.count, bytes(r.body))


def sealed(log) -> dict[int, int]:
    """Each relation's sealed frontier as an engine reopening ``log`` finds it: from the
    PROGRESS records kept and the FRONTIERS records the trimmed ones left."""
    out: dict[int, int] = {}
    fold(out, log.scan())
    return out


def ours(records) -> list[tuple]:
    """What the caller appended: the log's own FRONTIERS (and PADDING) records left out."""
    return [fields(r) for r in records if r.kind not in (K.FRONTIERS, K.PADDING)]


def test_every_backend_takes_the_protocols_calls(log):
    """Each protocol method is called as the protocol declares it (a runtime Protocol checks
    method names only): the same parameters and defaults, and scan() with no start reads
    from the oldest kept record."""
    assert_takes_protocol_calls(log, WriteAheadLog)
    appended = [upd(i) for i in range(4)]
    log.append(appended)
    assert ours(log.scan()) == ours(log.scan(log.start_lsn)) == [fields(r) for r in appended]


def test_append_sets_lsns_and_reads_back_every_field(log):
    batches = [[upd(0)], [upd(1), upd(2), close_t(1, 5)], [rec.Record(K.BEGIN, txn_id=7)],
               [upd(3, rel=2), rec.Record(K.COMMIT, txn_id=7, body=rec.encode_txn_ids([8, 9]))]]
    for batch in batches:
        last = log.append(batch)
        assert last == batch[-1].lsn
    appended = [r for b in batches for r in b]
    lsns = [r.lsn for r in appended]
    assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns) and lsns[0] >= log.start_lsn
    assert log.end_lsn > lsns[-1]
    for r in appended:
        assert fields(log.read(r.lsn)) == fields(r)
    assert ours(log.scan()) == [fields(r) for r in appended]
    assert ours(log.scan(appended[3].lsn)) == [fields(r) for r in appended[3:]]
    assert sealed(log) == {1: 5}


def test_records_of_one_append_are_contiguous_under_concurrent_appends(log):
    """Appends from many threads: each call's records stay together, in call order, and
    every record's LSN orders the scan."""
    per_thread, threads = 15, 6
    results: dict[int, list[rec.Record]] = {}
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            for i in range(per_thread):
                batch = [upd(1000 * w + 10 * i + j, rel=w + 1) for j in range(3)]
                assert log.append(batch) == batch[-1].lsn
                results.setdefault(w, []).extend(batch)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    ts = [threading.Thread(target=writer, args=(w,)) for w in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    scanned = [r for r in log.scan() if r.kind == K.UPDATES]
    assert [r.lsn for r in scanned] == sorted(r.lsn for rs in results.values() for r in rs)
    by_lsn = {r.lsn: fields(r) for r in scanned}
    for rs in results.values():
        assert [by_lsn[r.lsn] for r in rs] == [fields(r) for r in rs]
        for i in range(0, len(rs), 3):  # one call's three records: nothing between them
            pos = [j for j, s in enumerate(scanned) if s.lsn == rs[i].lsn][0]
            assert [s.lsn for s in scanned[pos:pos + 3]] == [r.lsn for r in rs[i:i + 3]]


def test_submit_runs_on_durable_in_log_order_before_waiters_wake(log):
    """Every submitted record reaches an ``on_durable`` call, in log order, before its ticket
    returns (a backend may hand several submissions' records to one call)."""
    seen: list[int] = []
    lock = threading.Lock()

    def on_durable(records) -> None:
        with lock:
            seen.extend(r.lsn for r in records)

    batches = [[upd(i), upd(i + 100)] for i in range(20)]
    tickets = [log.submit(b, on_durable) for b in batches]
    for b, t in zip(batches, tickets, strict=True):
        last = t.wait()
        assert last == b[-1].lsn
        with lock:
            assert last in seen
    assert seen == [r.lsn for b in batches for r in b] == sorted(seen)


def test_a_ticket_is_settled_once_durable_and_stays_so(log):
    """``settled()`` is True exactly when ``wait()`` would return at once: after the ticket's
    wait (or any later one's) returned, for every ticket up to it."""
    tickets = [log.submit([upd(i)]) for i in range(5)]
    tickets[-1].wait()
    assert all(t.settled() for t in tickets)
    assert [t.wait() for t in tickets] == sorted(t.wait() for t in tickets)


def test_records_survive_close_and_reopen(backend):
    log = backend.open()
    appended = []
    for i in range(40):
        batch = [upd(i, rel=1 + i % 2)] + ([close_t(1 + i % 2, i)] if i % 5 == 4 else [])
        log.append(batch)
        appended += batch
    end = log.end_lsn
    log.close()
    with pytest.raises(EngineClosed):
        log.append([upd(99)])
    log = backend.open()
    try:
        assert ours(log.scan()) == [fields(r) for r in appended]
        assert sealed(log) == {1: 34, 2: 39}
        assert log.end_lsn >= end
        more = [upd(500)]
        log.append(more)
        assert more[0].lsn >= end and fields(log.read(more[0].lsn)) == fields(more[0])
    finally:
        log.close()


def test_finish_segment_moves_finished_lsn_and_tells_the_listener(log):
    heard: list[int] = []
    told = threading.Event()

    def listener(lsn: int) -> None:
        heard.append(lsn)
        told.set()

    log.set_finish_listener(listener)
    appended = [upd(i) for i in range(5)]
    for r in appended:
        log.append([r])
    before = log.finished_lsn
    log.finish_segment()
    assert log.finished_lsn > appended[-1].lsn >= before
    assert told.wait(10), "the finish listener was not called"
    assert heard[-1] == log.finished_lsn
    assert ours(log.scan()) == [fields(r) for r in appended]  # finishing adds no caller-visible record


def test_finished_lsn_never_passes_a_record_whose_callback_has_not_returned(log):
    """The compacter takes the records below ``finished_lsn`` from what the ``on_durable``
    callbacks applied (and skips them when the log is replayed), so while a callback is held
    a segment finished from another thread must not count its record as finished. The device
    ring once did: its finishing record became durable in a later block and moved
    ``finished_lsn`` before the earlier block's callback ran, and a compaction pass in that
    window dropped an acknowledged append."""
    entered, release = threading.Event(), threading.Event()
    held = upd(1)

    def on_durable(records) -> None:
        entered.set()
        release.wait(30)

    ticket = log.submit([held], on_durable)
    waiter = threading.Thread(target=ticket.wait)  # a waiter makes a queued group be written
    waiter.start()
    try:
        assert entered.wait(10), "the callback was not called"
        finisher = threading.Thread(target=log.finish_segment)
        finisher.start()
        deadline = time.monotonic() + 1.0  # the ring writes the finishing record in milliseconds
        while time.monotonic() < deadline:
            assert log.finished_lsn <= held.lsn, "a segment finished past a record whose callback is running"
            if not finisher.is_alive():
                break
            finisher.join(0.01)
    finally:
        release.set()
        waiter.join(10)
    finisher.join(10)
    assert not finisher.is_alive()
    log.finish_segment()
    assert log.finished_lsn > held.lsn


class _Recorder:
    """A segment preamble that only records what the log tells it: the log must hand it
    every record it writes, in log order, and write its boundary record byte for byte."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []
        self.lock = threading.Lock()

    def observe(self, records) -> None:
        with self.lock:
            self.seen.extend(fields(r) for r in records)

    def record(self, pending=()) -> rec.Record:
        return rec.Record(K.FRONTIERS, count=1, body=b"owner's own body")


def test_segment_boundaries_carry_the_owners_record_and_the_owner_sees_every_record(log):
    """The log knows frames only: its boundary records are the owner's (not decoded, not
    composed by the log), and the owner observes each record the log writes, in order."""
    owner = _Recorder()
    log.set_preamble(owner)
    appended = [upd(1), close_t(1, 3), upd(2)]
    for r in appended:
        log.append([r])
    log.finish_segment()
    log.append([upd(9)])
    boundaries = [r for r in log.scan() if r.kind == K.FRONTIERS and r.lsn > appended[-1].lsn]
    assert boundaries and all(bytes(r.body) == b"owner's own body" and r.count == 1 for r in boundaries)
    with owner.lock:
        seen = [f for f in owner.seen if f[1] not in (K.FRONTIERS, K.PADDING)]
    assert seen[:3] == [fields(r) for r in appended]
    log.set_preamble(None)  # none set: an empty FRONTIERS record
    log.finish_segment()
    last = [r for r in log.scan() if r.kind == K.FRONTIERS][-1]
    assert last.lsn > boundaries[-1].lsn and bytes(last.body) == b"" and last.count == 0


def test_finishing_with_nothing_new_changes_nothing(log):
    empty = (log.end_lsn, log.finished_lsn)
    log.finish_segment()  # an empty log: nothing to finish
    assert (log.end_lsn, log.finished_lsn) == empty
    log.append([upd(1)])
    log.finish_segment()
    once = (log.end_lsn, log.finished_lsn, len(list(log.scan())))
    log.finish_segment()
    assert (log.end_lsn, log.finished_lsn, len(list(log.scan()))) == once


def test_segments_finish_by_size(log):
    """Enough records finish segments by themselves, each announced to the listener."""
    heard: list[int] = []
    done = threading.Event()

    def listener(lsn: int) -> None:
        heard.append(lsn)
        done.set()

    log.set_finish_listener(listener)
    appended = [upd(i, n=200) for i in range(120)]
    for r in appended:
        log.append([r])
    assert done.wait(10), "no segment finished by size"
    assert 0 < heard[-1] <= log.finished_lsn <= log.end_lsn
    assert ours(log.scan()) == [fields(r) for r in appended]


def _trimmed_log(backend):
    log = backend.open()
    appended = []
    log.append([close_t(7, 3)])  # relation 7 is sealed only here: its frontier must outlive the trim
    for i in range(150):
        r = upd(i, n=200)
        log.append([r])
        appended.append(r)
    log.finish_segment()
    for i in range(150, 160):
        r = upd(i)
        log.append([r])
        appended.append(r)
    return log, appended


@pytest.mark.parametrize("at", [0.5, 1.0])
def test_trim_keeps_everything_at_or_above_the_point_and_every_frontier(backend, at):
    """trim(lsn) never discards a record at or above ``lsn`` (``at`` 1.0: past the last
    finished segment, into unfinished records), nor a relation's sealed frontier."""
    log, appended = _trimmed_log(backend)
    cut = int(len(appended) * at) - (1 if at == 1.0 else 0)
    point = appended[cut].lsn
    log.trim(point)
    for current in range(2):
        assert log.start_lsn <= point
        assert log.start_lsn <= log.finished_lsn
        kept = [fields(r) for r in appended[cut:]]
        assert ours(log.scan(point)) == kept
        assert [fields(log.read(r.lsn)) for r in appended[cut:]] == kept
        assert sealed(log)[7] == 3
        assert ours(log.scan(log.start_lsn))[-len(kept):] == kept
        first = next(iter(log.scan()))
        assert first.lsn >= log.start_lsn and fields(log.read(first.lsn)) == fields(first)
        log.close()
        if current == 0:
            log = backend.open()
    log = backend.open()
    try:
        more = [upd(1000)]
        log.append(more)
        assert more[0].lsn > appended[-1].lsn
    finally:
        log.close()


def test_trimmed_records_are_gone_below_the_start(backend):
    log, appended = _trimmed_log(backend)
    try:
        log.trim(appended[120].lsn)
        below = [r for r in appended if r.lsn < log.start_lsn]
        assert below, "a trim past a finished segment discards something"
        with pytest.raises(WalError):
            log.read(below[0].lsn)
    finally:
        log.close()


def test_trimming_past_the_end_is_refused_and_changes_nothing(backend):
    log, appended = _trimmed_log(backend)
    try:
        start, before = log.start_lsn, ours(log.scan())
        with pytest.raises(WalError, match="cannot trim"):
            log.trim(log.end_lsn + 1)
        assert log.start_lsn == start and ours(log.scan()) == before
        log.trim(appended[-1].lsn + 1)  # past the last record is fine: everything appended may be trimmed
        assert log.start_lsn <= log.finished_lsn
        assert fields(log.read(appended[-1].lsn)) == fields(appended[-1])
    finally:
        log.close()


def test_a_torn_tail_is_cut_and_appends_continue(backend):
    log = backend.open()
    appended = []
    for i in range(30):
        r = upd(i)
        log.append([r])
        appended.append(r)
    backend.crash_and_tear(log)
    log = backend.open()
    try:
        if backend.reports_torn_tails:
            assert log.report.torn_tails, "the cut is reported"
        assert ours(log.scan()) == [fields(r) for r in appended]
        more = [upd(100), upd(101)]
        log.append(more)
        assert more[0].lsn > appended[-1].lsn
        assert ours(log.scan()) == [fields(r) for r in appended + more]
    finally:
        log.close()
    log = backend.open()
    try:
        assert ours(log.scan()) == [fields(r) for r in appended + more]
    finally:
        log.close()


def test_read_many_gives_each_record_asked_for_in_the_order_asked_across_segments(log):
    appended = []
    for i in range(60):  # 200-byte bodies: several segments, some finished
        r = upd(i, n=200)
        log.append([r])
        appended.append(r)
    log.finish_segment()
    more = [upd(i) for i in range(60, 70)]
    log.append(more)  # several in one append, in the active segment
    appended += more
    lsns = [r.lsn for r in appended]
    assert [fields(r) for r in log.read_many(lsns)] == [fields(r) for r in appended]
    picked = lsns[65:3:-7] + lsns[10:12] + [lsns[0], lsns[-1], lsns[10]]  # descending, neighbours, repeats
    assert [fields(r) for r in log.read_many(picked)] == [fields(log.read(lsn)) for lsn in picked]
    assert log.read_many([]) == []


def test_read_many_refuses_what_was_never_written_or_was_trimmed(backend):
    log, appended = _trimmed_log(backend)
    try:
        with pytest.raises(WalError):
            log.read_many([appended[-1].lsn, log.end_lsn])
        with pytest.raises(WalError):
            log.read_many([-1, appended[0].lsn])
        log.trim(appended[120].lsn)
        below = [r.lsn for r in appended if r.lsn < log.start_lsn]
        with pytest.raises(WalError):
            log.read_many([below[-1], appended[-1].lsn])
        kept = [r for r in appended if r.lsn >= log.start_lsn]
        assert [fields(r) for r in log.read_many([r.lsn for r in kept])] == [fields(r) for r in kept]
    finally:
        log.close()


def test_reading_what_was_never_written_is_a_wal_error(log):
    r = [upd(1)]
    log.append(r)
    with pytest.raises(WalError):
        log.read(log.end_lsn)
    with pytest.raises(WalError):
        log.read(log.end_lsn + 10_000)
    with pytest.raises(WalError):
        log.read(-1)
    assert list(log.scan(log.end_lsn)) == []


BAD_RECORDS = [
    rec.Record(K.UPDATES, relation_id=-1),
    rec.Record(K.UPDATES, relation_id=1 << 64),
    rec.Record(K.UPDATES, txn_id=-5),
    rec.Record(K.UPDATES, t_lo=1 << 63),
    rec.Record(K.UPDATES, count=1 << 32),
    rec.Record(K.PADDING, body=bytes(8)),
    rec.Record(99),
    rec.Record(K.UPDATES, t_lo=1.5),
    rec.Record(K.UPDATES, relation_id="7"),
    rec.Record(K.UPDATES, schema_version=1 << 32),
]
BAD_IDS = ["negative-relation", "relation-over-u64", "negative-txn", "time-over-i64", "count-over-u32",
           "padding", "unknown-kind", "float-time", "text-relation", "schema-over-u32"]


@pytest.mark.parametrize("bad", BAD_RECORDS, ids=BAD_IDS)
def test_a_bad_record_is_refused_with_a_typed_error_and_the_log_goes_on(log, bad):
    good = [upd(1)]
    log.append(good)
    with pytest.raises(InvalidArgument):
        log.append([upd(2), bad])
    after = [upd(3)]
    log.append(after)
    assert ours(log.scan()) == [fields(r) for r in good + after]


@pytest.mark.parametrize("bad", BAD_RECORDS, ids=BAD_IDS)
def test_a_bad_lone_record_is_refused_with_a_typed_error_and_the_log_goes_on(log, bad):
    """An append of the one bad record alone: the device ring checks a lone record's
    integer fields with the pack of its header, before anything is placed."""
    good = [upd(1)]
    log.append(good)
    end = log.end_lsn
    with pytest.raises(InvalidArgument):
        log.append([bad])
    assert log.end_lsn == end
    after = [upd(3)]
    log.append(after)
    assert ours(log.scan()) == [fields(r) for r in good + after]


def test_an_empty_append_is_refused(log):
    with pytest.raises(InvalidArgument):
        log.append([])
    r = [upd(1)]
    log.append(r)
    assert ours(log.scan()) == [fields(r[0])]


def test_calls_after_close_raise_engine_closed(backend):
    log = backend.open()
    log.append([upd(1)])
    log.close()
    log.close()  # idempotent
    with pytest.raises(EngineClosed):
        log.append([upd(2)])
    with pytest.raises(EngineClosed):
        log.submit([upd(2)])


def test_a_record_larger_than_a_segment_round_trips(backend):
    big = rec.Record(K.UPDATES, relation_id=3, t_lo=1, t_hi=1, count=1, body=bytes(range(256)) * 256)  # 64 KiB
    log = backend.open()
    try:
        log.append([upd(1)])
        log.append([big])
        log.append([upd(2)])
        assert fields(log.read(big.lsn)) == fields(big)
    finally:
        log.close()
    log = backend.open()
    try:
        assert [f for f in ours(log.scan()) if f[2] == 3] == [fields(big)]
    finally:
        log.close()


def test_close_with_appends_in_flight_answers_every_ticket(backend):
    """close() while submissions are queued: each ticket returns its LSN or raises a typed
    error (never hangs), and every acknowledged record is there after a reopen."""
    from sediment.errors import SedimentError

    log = backend.open()
    batches = [[upd(i)] for i in range(200)]
    tickets = [log.submit(b) for b in batches]
    log.close()
    acked = []
    for b, t in zip(batches, tickets, strict=True):
        try:
            t.wait()
            acked.append(b[0])
        except SedimentError:
            pass
    log = backend.open()
    try:
        present = {f[0]: f for f in ours(log.scan())}
        assert all(present.get(r.lsn) == fields(r) for r in acked)
    finally:
        log.close()
