"""A caller that finds the file log idle leads and writes its one record itself, with no
queue entry or ticket (wal/file_log.py ``lead_lone`` / ``write_lone``, wal/group_commit.py
``lead_idle``): what is submitted meanwhile queues behind it and is written by it or the
next leader, nothing is lost or reordered, a failed write fails the log for everyone
queued, and a record the frame cannot carry is refused with the lead given back."""

from __future__ import annotations

import errno
import os
import threading

import pytest
from support.waiting import poll_until

from sediment.errors import InvalidArgument, WalError
from sediment.wal.file_log import FileLog
from sediment.wal.record import Record, RecordKind


def upd(i: int, size: int = 40) -> Record:
    return Record(RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, count=1, body=i.to_bytes(4, "little") * (size // 4))


def ids(log: FileLog) -> list[int]:
    return [int.from_bytes(r.body[:4], "little") for r in log.scan() if r.kind == RecordKind.UPDATES]


def append_lone_or_queued(log: FileLog, lock: threading.Lock, r: Record, order: list[int], callback) -> bool:  # noqa: ANN001
    """What the engine's lone writer does: under its lock, lead if the log is idle, else
    submit; then write (leading) or wait. Whether it led."""
    with lock:
        header = log.lead_lone(r)
        order.append(int.from_bytes(r.body[:4], "little"))
        ticket = log.submit([r], callback) if header is None else None
    if ticket is None:
        log.write_lone(r, header, callback)
    else:
        ticket.wait()
    return ticket is None


def test_a_lone_lead_writes_on_the_caller_s_thread_without_a_ticket(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    try:
        me = threading.get_ident()
        seen: list[tuple[int, int]] = []
        for i in range(20):
            r = upd(i)
            header = log.lead_lone(r)
            assert header is not None and r.lsn == i
            log.write_lone(r, header, lambda rs: seen.append((rs[0].lsn, threading.get_ident())))
        assert seen == [(i, me) for i in range(20)]
        assert ids(log) == list(range(20)) and log.end_lsn == 20
    finally:
        log.close()


def test_a_submit_made_while_a_lone_leader_writes_is_written_and_woken(tmp_path):
    """The lone leader is held inside its callback (after its sync) while another thread
    submits and waits, and a third caller finds the log busy: once released, the leader
    writes or hands on the queued record, whose waiter wakes with the next LSN."""
    log = FileLog.open(str(tmp_path), create=True)
    try:
        inside, release = threading.Event(), threading.Event()
        first = upd(1)
        header = log.lead_lone(first)
        assert header is not None
        leader = threading.Thread(target=log.write_lone,
                                  args=(first, header, lambda rs: (inside.set(), release.wait(60))))
        leader.start()
        assert inside.wait(60)
        assert log.lead_lone(upd(9)) is None, "the log is led: a second caller must queue"
        ticket = log.submit([upd(2)])
        got: list[int] = []
        follower = threading.Thread(target=lambda: got.append(ticket.wait()))
        follower.start()
        poll_until(lambda: ticket.wake, 10, "the follower waiting on its ticket")
        release.set()
        leader.join(30)
        follower.join(30)
        assert not leader.is_alive() and not follower.is_alive(), "a waiter behind a lone lead was never woken"
        assert got == [first.lsn + 1]
        third = upd(3)
        header = log.lead_lone(third)
        assert header is not None, "the lead was not given back"
        log.write_lone(third, header, None)
        assert ids(log) == [1, 2, 3]
    finally:
        log.close()


@pytest.mark.parametrize("round_", range(3))
def test_lone_leads_racing_queued_submitters_keep_lock_order_and_lose_no_one(tmp_path, round_):
    """Four threads, each appending under one shared lock as the engine does (lead when the
    log is idle, else submit and wait), 300 records each: every call returns, the log holds
    the records in the order they were taken under the lock, and the callbacks see LSNs in
    ascending order. Both ways must have been taken, or the race was not run."""
    log = FileLog.open(str(tmp_path), create=True, segment_bytes=64 << 10)
    lock = threading.Lock()
    order: list[int] = []
    durable: list[int] = []
    led = [0, 0]

    def callback(rs) -> None:  # noqa: ANN001
        durable.extend(r.lsn for r in rs)

    def writer(w: int) -> None:
        for i in range(300):
            led[append_lone_or_queued(log, lock, upd(w * 10_000 + i), order, callback)] += 1

    try:
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "an appender was never woken"
        assert led[True] > 0 and led[False] > 0, f"led {led[True]}, queued {led[False]}: no race"
        assert durable == sorted(durable) and len(durable) == 1200
        assert ids(log) == order
    finally:
        log.close()
    log = FileLog.open(str(tmp_path))
    try:
        assert ids(log) == order
    finally:
        log.close()


def test_a_lone_leader_past_the_segment_s_end_hands_the_finish_to_the_background(tmp_path):
    log = FileLog.open(str(tmp_path), create=True, segment_bytes=8192)
    finishers: list[str] = []
    log.set_finish_listener(lambda lsn: finishers.append(threading.current_thread().name))
    try:
        for i in range(300):
            r = upd(i, 200)
            header = log.lead_lone(r)
            if header is None:  # the finisher leads right now: queue behind it
                log.submit([r]).wait()
            else:
                log.write_lone(r, header, None)
        log.submit([upd(999)]).wait()  # behind any finish still running
        assert len(finishers) >= 5 and all(n.startswith("wal-finisher") for n in finishers)
        assert ids(log) == [*range(300), 999]
    finally:
        log.close()


def test_a_failed_lone_write_fails_the_log_and_whoever_queued_behind_it(tmp_path, monkeypatch):
    root = str(tmp_path)
    log = FileLog.open(root, create=True)
    for i in range(3):
        log.append([upd(i)])
    real = os.fdatasync
    queued: list = []

    def failing(fd: int) -> None:
        queued.append(log.submit([upd(50)]))  # submitted while the lone leader syncs
        raise OSError(errno.EIO, "Input/output error (injected)")

    r = upd(10)
    header = log.lead_lone(r)
    assert header is not None
    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(WalError, match="not acknowledged"):
        log.write_lone(r, header, lambda rs: pytest.fail("a failed write was acknowledged"))
    monkeypatch.setattr(os, "fdatasync", real)
    with pytest.raises(WalError, match="not acknowledged"):
        queued[0].wait()
    assert log.lead_lone(upd(11)) is None, "a failed log must not be led"
    with pytest.raises(WalError, match="failed earlier"):
        log.append([upd(12)])
    log.close()
    log = FileLog.open(root)
    try:
        assert ids(log)[:3] == [0, 1, 2]
    finally:
        log.close()


@pytest.mark.parametrize("field", ["t_lo", "count", "relation_id", "schema_version"])
def test_a_record_the_frame_cannot_carry_gives_the_lead_back_and_submit_refuses_it(tmp_path, field):
    log = FileLog.open(str(tmp_path), create=True)
    try:
        log.append([upd(0)])
        bad = upd(1)
        setattr(bad, field, {"t_lo": 1 << 63, "count": 1 << 32, "relation_id": -1, "schema_version": 1 << 32}[field])
        assert log.lead_lone(bad) is None
        with pytest.raises(InvalidArgument, match="nothing was appended"):
            log.submit([bad])
        assert log.end_lsn == 1
        good = upd(2)
        header = log.lead_lone(good)
        assert header is not None, "the lead was not given back"
        log.write_lone(good, header, None)
        assert ids(log) == [0, 2]
    finally:
        log.close()


def test_a_ticket_queued_before_is_not_overtaken_by_a_lone_lead(tmp_path):
    """A ticket nobody waits on yet (a server's queued append) holds its place: the next
    caller finds the log not idle, queues behind it, and its wait writes both in order."""
    log = FileLog.open(str(tmp_path), create=True)
    try:
        early = log.submit([upd(1)])
        late = upd(2)
        assert log.lead_lone(late) is None
        last = log.submit([late]).wait()
        assert early.wait() == last - 1 and ids(log) == [1, 2]
    finally:
        log.close()


def test_a_lead_given_back_unwritten_lets_the_next_caller_lead_and_close_return(tmp_path):
    """A caller interrupted between taking the lead and writing gives it back with
    ``drop_lone``: a submit queued meanwhile is written by its own wait, the next caller
    leads, and close returns (a lead kept would leave the log's finisher waiting forever)."""
    log = FileLog.open(str(tmp_path), create=True)
    try:
        taken = upd(1)
        assert log.lead_lone(taken) is not None
        queued = log.submit([upd(2)])
        log.drop_lone()
        assert queued.wait() == 0  # the LSN the unwritten record had been given
        again = upd(3)
        header = log.lead_lone(again)
        assert header is not None
        log.write_lone(again, header, None)
        assert ids(log) == [2, 3]
    finally:
        done = threading.Event()
        closer = threading.Thread(target=lambda: (log.close(), done.set()), daemon=True)
        closer.start()
        assert done.wait(30), "close waited on a lead that was never given back"


def test_drop_lone_hands_on_no_lead_this_thread_does_not_hold(tmp_path):
    """After its lead ended (or failed), a late ``drop_lone`` of an interrupted caller does
    nothing: another thread's lone lead taken meanwhile is not handed on under it."""
    log = FileLog.open(str(tmp_path), create=True)
    try:
        mine = upd(1)
        log.write_lone(mine, log.lead_lone(mine), None)
        theirs_led = threading.Event()
        go_on = threading.Event()
        theirs = upd(2)

        def other() -> None:
            header = log.lead_lone(theirs)
            theirs_led.set()
            go_on.wait(30)
            log.write_lone(theirs, header, None)

        t = threading.Thread(target=other)
        t.start()
        assert theirs_led.wait(30)
        log.drop_lone()  # this thread's lead ended already: nothing to give back
        assert log.lead_lone(upd(3)) is None, "the other thread's lead was handed on"
        go_on.set()
        t.join(30)
        assert ids(log) == [1, 2]
    finally:
        log.close()
