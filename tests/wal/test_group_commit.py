"""Leader/follower group commit in the file log (wal/group_commit.py): the waiting caller
writes and syncs, acknowledgements and callbacks follow LSN order, a failed sync fails its
group and the log, and a ticket nobody waits on is still written."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time

import pytest
from support.waiting import Progress, poll_until

from sediment.errors import EngineClosed, WalError
from sediment.wal.file_log import FileLog
from sediment.wal.group_commit import GroupAppend, GroupCommit
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
        poll_until(lambda: len(shared.wake) == 3, 60, "three followers on the shared ticket")
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

    poll_until(closing, 60, "close to ask for the lead")
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
        poll_until(lambda: sum(len(t.wake) for t in tickets) == 47, 60, "47 followers queued")
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
        poll_until(lambda: all(t.wake for t in tickets), 60, "five followers queued")
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


class _Registered(list):
    """A ticket's list of follower locks that tells ``progress`` when a follower registers
    (GroupCommit.wait appends its lock under the log's lock), so a test waits on the event."""

    def __init__(self, progress: Progress) -> None:
        super().__init__()
        self.progress = progress

    def append(self, lock) -> None:
        super().append(lock)
        self.progress.changed()


def _watched(gc, progress: Progress):
    pending = GroupAppend(gc, [upd(0)], [0])
    pending.wake = _Registered(progress)
    return gc.submit(pending)


def _blocked_in_wait(ticket) -> bool:
    """The main thread waits on ``ticket`` and is blocked in the kernel (state S in /proc)."""
    main = threading.main_thread()
    with open(f"/proc/self/task/{main.native_id}/stat") as f:
        return bool(ticket.wake) and f.read().rsplit(")", 1)[1].split()[0] == "S"


def _interrupt_main_once(ready) -> None:
    # the main thread's state in the kernel has no event to wait on: read it until it sleeps
    poll_until(ready, 30, "the main thread to block in its wait")
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def _gated_commit(gates: dict[int, threading.Event]):
    """A GroupCommit whose n-th write sets entered[n] and then waits for gates[n] (when
    given); LSNs count records."""
    calls = [0]
    lsn = [0]
    entered = {n: threading.Event() for n in gates}

    def write(group) -> None:
        calls[0] += 1
        if calls[0] in gates:
            entered[calls[0]].set()
            assert gates[calls[0]].wait(30)
        for p in group:
            lsn[0] += len(p.records)
            p.last_lsn = lsn[0] - 1

    return GroupCommit("test", write, lambda requested: None, lambda: False, "test-gc"), entered


def test_ctrl_c_in_a_waiting_follower_strands_no_other_waiter_of_its_group():
    gate = threading.Event()
    gc, entered = _gated_commit({1: gate})
    progress = Progress()
    ticket = lambda: _watched(gc, progress)  # noqa: E731
    first = ticket()
    leader = threading.Thread(target=first.wait, daemon=True)
    leader.start()
    assert entered[1].wait(10)  # the leader holds the lead inside write 1
    others = [ticket()]
    mine = ticket()
    others += [ticket() for _ in range(5)]
    done = [threading.Event() for _ in others]
    for p, ev in zip(others, done, strict=True):
        threading.Thread(target=lambda p=p, ev=ev: (p.wait(), ev.set()), daemon=True).start()
    progress.wait_for(lambda: all(p.wake for p in others), 10, "every other follower to wait")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=_interrupt_main_once, args=(lambda: _blocked_in_wait(mine),), daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            mine.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    gate.set()
    leader.join(10)
    stranded = [i for i, ev in enumerate(done) if not ev.wait(10)]
    assert stranded == [], f"followers {stranded} never returned although their group is durable"
    assert mine.wait() >= 0  # written with its group all the same
    gc.close()


def test_ctrl_c_in_a_follower_the_lead_is_passed_to_does_not_stall_the_log():
    gates = {1: threading.Event(), 2: threading.Event()}
    gc, entered = _gated_commit(gates)
    progress = Progress()
    ticket = lambda: _watched(gc, progress)  # noqa: E731
    first = ticket()
    threading.Thread(target=first.wait, daemon=True).start()
    assert entered[1].wait(10)
    kept = ticket()  # queued during write 1: the leader keeps it as write 2
    kept_done = threading.Event()
    threading.Thread(target=lambda: (kept.wait(), kept_done.set()), daemon=True).start()
    progress.wait_for(lambda: bool(kept.wake), 10, "the kept append's follower to wait")
    gates[1].set()
    assert entered[2].wait(10)
    mine = ticket()  # queued during write 2: the lead is passed to its waiter after
    behind = ticket()
    behind_done = threading.Event()
    threading.Thread(target=lambda: (behind.wait(), behind_done.set()), daemon=True).start()
    progress.wait_for(lambda: bool(behind.wake), 10, "the follower behind to wait")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        def interrupt_then_pass() -> None:
            _interrupt_main_once(lambda: _blocked_in_wait(mine))
            gates[2].set()  # the lead is handed on while (or after) the main thread gives up
        threading.Thread(target=interrupt_then_pass, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            mine.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert kept_done.wait(10)
    assert behind_done.wait(10), "the lead went to a waiter that had left: the log stalled"
    assert mine.wait() >= 0
    gc.close()
