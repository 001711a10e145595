"""Leader/follower group commit in the file log (wal/group_commit.py): the waiting caller
writes and syncs, acknowledgements and callbacks follow LSN order, a failed sync fails its
group and the log, and a ticket nobody waits on is still written."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from sediment.errors import EngineClosed, WalError
from sediment.wal.file_log import FileLog
from sediment.wal.record import Record, RecordKind


def upd(i: int, size: int = 40) -> Record:
    return Record(RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, count=1, body=i.to_bytes(4, "little") * (size // 4))


def syncs_by_thread(monkeypatch) -> list[int]:
    """Record the thread of every fdatasync (then sync for real)."""
    seen: list[int] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        seen.append(threading.get_ident())
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    return seen


def test_a_lone_appender_writes_syncs_and_calls_back_on_its_own_thread(tmp_path, monkeypatch):
    log = FileLog.open(str(tmp_path), create=True, index_interval=10_000)
    try:
        log.append([upd(0)])
        syncs = syncs_by_thread(monkeypatch)
        called: list[int] = []
        for i in range(1, 50):
            log.submit([upd(i)], lambda rs: called.append(threading.get_ident())).wait()
        me = threading.get_ident()
        assert len(syncs) == 49 and set(syncs) == {me}, "each append is synced by its caller, not handed off"
        assert called == [me] * 49
        assert [r.lsn for r in log.scan()] == list(range(50))
    finally:
        log.close()


def test_concurrent_appends_are_acknowledged_after_every_earlier_record_is_durable(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    seen: list[int] = []  # LSNs in on_durable order: after their sync
    lock = threading.Lock()
    problems: list[str] = []

    def on_durable(records) -> None:
        with lock:
            seen.extend(r.lsn for r in records)

    def writer(w: int) -> None:
        for i in range(60):
            last = log.submit([upd(w * 1000 + i), upd(w * 1000 + i)], on_durable).wait()
            with lock:
                if not seen or seen[-1] < last:
                    problems.append(f"LSN {last} acknowledged before every record up to it was called back")

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert problems == []
        assert seen == list(range(seen[0], seen[0] + 24 * 120)), "every record called back once, in LSN order"
        bodies = [r.body for r in log.scan() if r.kind == RecordKind.UPDATES]
        for w in range(24):  # each writer's appends in its order, its two records side by side
            mine = [int.from_bytes(b[:4], "little") for b in bodies if int.from_bytes(b[:4], "little") // 1000 == w]
            assert mine == [w * 1000 + i for i in range(60) for _ in (0, 1)]
    finally:
        log.close()


def test_a_failed_sync_fails_its_group_everything_queued_and_the_log(tmp_path, monkeypatch):
    root = str(tmp_path)
    log = FileLog.open(root, create=True)
    acked = [upd(i) for i in range(5)]
    for r in acked:
        log.append([r])
    real = os.fdatasync
    broken = threading.Event()

    def failing(fd: int) -> None:
        if broken.is_set():
            raise OSError(errno.EIO, "Input/output error (injected)")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", failing)
    broken.set()
    tickets = [log.submit([upd(100 + i)]) for i in range(8)]
    errors: list[BaseException] = []

    def waiter(t) -> None:
        try:
            t.wait()
        except WalError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=waiter, args=(t,)) for t in tickets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 8 and all("not acknowledged" in str(e) for e in errors)
    with pytest.raises(WalError, match="failed earlier"):
        log.append([upd(200)])
    with pytest.raises(WalError, match="failed earlier"):
        log.finish_segment()
    log.close()
    monkeypatch.setattr(os, "fdatasync", real)
    log = FileLog.open(root)
    try:
        kept = [r.body for r in log.scan() if r.kind == RecordKind.UPDATES]
        assert kept[:5] == [r.body for r in acked]
    finally:
        log.close()


def test_a_ticket_nobody_waits_on_is_written_with_the_next_group_or_at_close(tmp_path):
    root = str(tmp_path)
    log = FileLog.open(root, create=True)
    called: list[int] = []
    early = log.submit([upd(1)], lambda rs: called.extend(r.lsn for r in rs))
    last = log.append([upd(2)])
    assert early.wait() == last - 1 and called == [last - 1]
    log.submit([upd(3)])
    log.finish_segment()  # writes what is queued, then finishes the segment
    log.submit([upd(4)])
    log.close()
    with pytest.raises(EngineClosed):
        log.submit([upd(5)])
    log = FileLog.open(root)
    try:
        got = [int.from_bytes(r.body[:4], "little") for r in log.scan() if r.kind == RecordKind.UPDATES]
        assert got == [1, 2, 3, 4]
    finally:
        log.close()


def test_segments_are_finished_off_the_appenders_threads(tmp_path):
    log = FileLog.open(str(tmp_path), create=True, segment_bytes=8192)
    finishers: list[str] = []
    log.set_finish_listener(lambda lsn: finishers.append(threading.current_thread().name))
    try:
        def writer(w: int) -> None:
            for i in range(100):
                log.append([upd(w * 1000 + i, 200)])

        threads = [threading.Thread(target=writer, args=(w,), name=f"appender-{w}") for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(finishers) >= 5 and all(n.startswith("wal-finisher") for n in finishers)
        got = sorted(int.from_bytes(r.body[:4], "little") for r in log.scan() if r.kind == RecordKind.UPDATES)
        assert got == sorted(w * 1000 + i for w in range(4) for i in range(100))
    finally:
        log.close()


def poll(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


def held_leader(log: FileLog, first: Record, release: threading.Event):
    """Submit ``first`` and lead its group on a thread held inside the group's callback until
    ``release`` is set; (its ticket, the thread) once it is held there."""
    inside = threading.Event()
    ticket = log.submit([first], lambda rs: (inside.set(), release.wait(60)))
    leader = threading.Thread(target=ticket.wait)
    leader.start()
    assert inside.wait(60)
    return ticket, leader


def test_many_threads_may_wait_on_one_ticket(tmp_path):
    """A leader held inside its group's callback while three threads wait on one queued
    ticket: one of them leads next and all three return."""
    log = FileLog.open(str(tmp_path), create=True)
    release = threading.Event()
    try:
        first, leader = held_leader(log, upd(1), release)
        shared = log.submit([upd(2)])
        got: list[int] = []
        waiters = [threading.Thread(target=lambda: got.append(shared.wait())) for _ in range(3)]
        for t in waiters:
            t.start()
        poll(lambda: len(shared.wake) == 3, "three followers on the shared ticket")
        release.set()
        for t in [leader, *waiters]:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in [leader, *waiters]), "a waiter of a shared ticket was never woken"
        assert got == [first.wait() + 1] * 3
    finally:
        release.set()
        log.close()


def test_a_close_asked_during_a_segment_finish_still_gets_its_turn(tmp_path):
    """close() arriving while the background thread holds the lead to finish a segment must
    not be forgotten when that turn ends (the lead would be lost and close would hang)."""
    log = FileLog.open(str(tmp_path), create=True)
    log.append([upd(1)])
    inside, release = threading.Event(), threading.Event()
    log.set_finish_listener(lambda lsn: (inside.set(), release.wait(60)))
    finisher = threading.Thread(target=log.finish_segment)
    finisher.start()
    assert inside.wait(60)
    closer = threading.Thread(target=log.close)
    closer.start()

    def closing() -> bool:
        try:
            log.submit([upd(2)])
        except EngineClosed:
            return True
        return False

    poll(closing, "close to ask for the lead")
    release.set()
    closer.join(timeout=60)
    finisher.join(timeout=60)
    assert not closer.is_alive() and not finisher.is_alive(), "close hung after a segment finish"


def test_every_waiter_of_a_big_group_is_woken_once_the_group_is_durable(tmp_path):
    """The waiters of a finished group are woken as a tree (each woken waiter wakes two
    more): with 45 tickets queued behind a held leader (three threads on one of them), every
    thread returns, each with its own ticket's LSN, in submit order."""
    log = FileLog.open(str(tmp_path), create=True)
    release = threading.Event()
    try:
        first, leader = held_leader(log, upd(0), release)
        tickets = [log.submit([upd(i)]) for i in range(1, 46)]
        got: dict[int, list[int]] = {}
        lock = threading.Lock()

        def wait(i: int) -> None:
            lsn = tickets[i].wait()
            with lock:
                got.setdefault(i, []).append(lsn)

        waiters = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(45)]
        waiters += [threading.Thread(target=wait, args=(7,), daemon=True) for _ in range(2)]
        for t in waiters:
            t.start()
        poll(lambda: sum(len(t.wake) for t in tickets) == 47, "47 followers queued")
        release.set()
        deadline = time.monotonic() + 60
        for t in [leader, *waiters]:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in [leader, *waiters]), "a follower of the group was never woken"
        base = first.wait()
        assert got == {i: [base + 1 + i] * (3 if i == 7 else 1) for i in range(45)}
        assert [r.t_lo for r in log.scan()] == list(range(46))
    finally:
        release.set()
        log.close()


def test_a_leader_also_writes_the_group_queued_during_its_own(tmp_path, monkeypatch):
    """Followers that queued while the leader wrote its group are written by that leader
    too, on its thread (no hand-off of the lead between the two syncs), and each returns
    its own LSN once that second group is durable."""
    log = FileLog.open(str(tmp_path), create=True, index_interval=10_000)
    release = threading.Event()
    try:
        syncs = syncs_by_thread(monkeypatch)
        first, leader = held_leader(log, upd(0), release)
        tickets = [log.submit([upd(i)]) for i in range(1, 6)]
        got: dict[int, int] = {}
        waiters = [threading.Thread(target=lambda i=i: got.__setitem__(i, tickets[i].wait()), daemon=True)
                   for i in range(5)]
        for t in waiters:
            t.start()
        poll(lambda: all(t.wake for t in tickets), "five followers queued")
        release.set()
        deadline = time.monotonic() + 60
        for t in [leader, *waiters]:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in [leader, *waiters])
        assert got == {i: first.wait() + 1 + i for i in range(5)}
        assert len(syncs) == 2 and set(syncs) == {leader.ident}
    finally:
        release.set()
        log.close()
