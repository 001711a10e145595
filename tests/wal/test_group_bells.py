"""The bells of the group commit (wal/group_commit.py): followers other than the main thread
sleep on one eventfd per group, woken by one write of their count; a signal handled on a
sleeping follower does not end its wait; each bell's descriptor is closed once its group
and its sleepers are done with it."""

from __future__ import annotations

import os
import signal
import threading
import time

from support.waiting import poll_until

from sediment.wal.file_log import FileLog
from sediment.wal.group_commit import GroupAppend, GroupCommit
from sediment.wal.record import Record, RecordKind


def upd(i: int) -> Record:
    return Record(RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, count=1, body=i.to_bytes(4, "little") * 10)


def held_leader(log: FileLog, release: threading.Event):
    """A leader held inside its group's callback until ``release``: (its ticket, its thread)."""
    inside = threading.Event()
    ticket = log.submit([upd(0)], lambda rs: (inside.set(), release.wait(60)))
    leader = threading.Thread(target=ticket.wait)
    leader.start()
    assert inside.wait(60)
    return ticket, leader


def asleep(thread: threading.Thread) -> bool:
    with open(f"/proc/self/task/{thread.native_id}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def test_a_group_of_sleeping_followers_is_woken_by_one_write_of_their_count(tmp_path, monkeypatch):
    rings: list[int] = []
    real = os.eventfd_write

    def recording(fd: int, value: int) -> None:
        rings.append(value)
        real(fd, value)

    monkeypatch.setattr(os, "eventfd_write", recording)
    log = FileLog.open(str(tmp_path), create=True)
    release = threading.Event()
    try:
        first, leader = held_leader(log, release)
        tickets = [log.submit([upd(i)]) for i in range(1, 41)]
        got: dict[int, int] = {}
        waiters = [threading.Thread(target=lambda i=i: got.__setitem__(i, tickets[i].wait()), daemon=True)
                   for i in range(40)]
        for t in waiters:
            t.start()
        poll_until(lambda: sum(t.waiting for t in tickets) == 40, 60, "40 followers asleep")
        release.set()
        deadline = time.monotonic() + 60
        for t in [leader, *waiters]:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in [leader, *waiters]), "a follower was never woken"
        assert got == {i: first.wait() + 1 + i for i in range(40)}
        assert rings == [39], "the leader keeps the queued group and wakes its sleepers (all but the first "\
            "follower, which waits on a lock to be passed the lead) with one write"
    finally:
        release.set()
        log.close()


def test_a_signal_handled_while_a_follower_sleeps_does_not_end_its_wait(tmp_path):
    """Python's handlers are installed without SA_RESTART, so a signal delivered to a
    follower's thread ends its read of the bell with EINTR: the read is made again."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    log = FileLog.open(str(tmp_path), create=True)
    release = threading.Event()
    try:
        first, leader = held_leader(log, release)
        ticket = log.submit([upd(1)])
        got: list[object] = []

        def follow() -> None:
            try:
                got.append(ticket.wait())
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                got.append(exc)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        poll_until(lambda: ticket.waiting and asleep(follower), 60, "the follower asleep on its bell")
        signal.pthread_kill(follower.ident, signal.SIGUSR1)
        poll_until(lambda: seen, 60, "the signal's handler to run")
        release.set()
        follower.join(60)
        leader.join(60)
        assert got == [first.wait() + 1]
    finally:
        release.set()
        signal.signal(signal.SIGUSR1, previous)
        log.close()


def test_each_bell_s_descriptor_is_closed_once_its_group_is_done(tmp_path, monkeypatch):
    made: list[int] = []
    real = os.eventfd

    def counting(initval: int, flags: int = 0) -> int:
        fd = real(initval, flags)
        made.append(fd)
        return fd

    monkeypatch.setattr(os, "eventfd", counting)
    log = FileLog.open(str(tmp_path), create=True)
    try:
        log.append([upd(0)])
        before = len(os.listdir("/proc/self/fd"))

        def writer(w: int) -> None:
            for i in range(60):
                log.append([upd(w * 1000 + i)])

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert made, "no follower slept on a bell"
        assert len(os.listdir("/proc/self/fd")) <= before + 1, f"of {len(made)} bells' eventfds, some were left open"
        assert len([r for r in log.scan() if r.kind == RecordKind.UPDATES]) == 481
    finally:
        log.close()


def test_the_lead_is_passed_to_the_queue_s_first_follower_on_its_lock_not_through_the_bell(monkeypatch):
    """A leader done with its two groups passes the lead to the queue's first follower, which
    waits on a lock: a write of 1 to the bell would wake every sleeper on it for one to lead."""

    gates = {1: threading.Event(), 2: threading.Event(), 3: threading.Event()}
    entered = {n: threading.Event() for n in gates}
    calls, lsn = [0], [0]

    def write(group) -> None:
        calls[0] += 1
        if calls[0] in gates:
            entered[calls[0]].set()
            assert gates[calls[0]].wait(30)
        for p in group:
            lsn[0] += 1
            p.last_lsn = lsn[0] - 1

    rings: list[int] = []
    real = os.eventfd_write
    monkeypatch.setattr(os, "eventfd_write", lambda fd, value: (rings.append(value), real(fd, value))[1])
    gc = GroupCommit("test", write, lambda requested: None, lambda: False, "test-gc")
    try:
        leader_ticket = gc.submit(GroupAppend(gc, [upd(0)], [0]))
        leader = threading.Thread(target=leader_ticket.wait, daemon=True)
        leader.start()
        assert entered[1].wait(10)
        threads: list[threading.Thread] = []

        def followers(n: int) -> list:
            tickets = [gc.submit(GroupAppend(gc, [upd(0)], [0])) for _ in range(n)]
            for t in tickets:
                threads.append(threading.Thread(target=t.wait, daemon=True))
                threads[-1].start()
            poll_until(lambda: all(t.waiting for t in tickets), 10, f"{n} followers waiting")
            return tickets

        kept = followers(5)  # queued during write 1: the leader writes them as write 2
        gates[1].set()
        assert entered[2].wait(10)
        queued = followers(5)  # queued during write 2: the lead goes to one of their threads
        gates[2].set()
        assert entered[3].wait(10)
        assert leader_ticket.settled() and all(t.settled() for t in kept)
        gates[3].set()
        for t in [leader, *threads]:
            t.join(10)
        assert not any(t.is_alive() for t in [leader, *threads])
        assert all(t.settled() for t in queued)
        assert rings == [4, 4], "each group's four sleepers woken by one write; the lead passed on a lock"
    finally:
        for g in gates.values():
            g.set()
        gc.close()
