"""Leader/follower group commit: the caller that finds the log idle writes and syncs the group.

Why: with a writer thread, every durable append crossed from the caller's thread to the
writer's and back, about ten futex calls for one pwrite and one fdatasync, which made a
one-row append cost more in hand-offs than on the disk. Here (as in RocksDB's WriteThread
and LevelDB's ``DBImpl::Write``) the caller that waits on its ticket while no one leads
becomes the leader: it takes every queued append as one group, has the log write and sync
it in its own thread, marks the group done and wakes it. If followers queued meanwhile,
it writes their group too, once (its caller waits at most two groups): a lead handed to
another thread between two syncs costs a wake and that thread's wait for the interpreter
lock behind the followers just woken. Then it passes the lead to the first follower still
queued and waiting. Followers only wait. One writer appending alone never blocks on a lock
nobody else holds, nor wakes another thread; when it finds the log idle it need not queue
at all (:meth:`GroupCommit.lead_idle`: it leads with its one append, then ``end_lead``).

The contract stays the log's: a group's appends are acknowledged (``done``) only after the
write and its sync return, groups are written one at a time in queue order (so LSN order is
acknowledgement order and the ``write`` callback, which runs the ``on_durable`` callbacks,
sees groups in log order), and a failed write fails its group, every append queued behind
it and the log. ``submit`` only queues: a group is written when someone waits, so a ticket
nobody waits on is written with the next group, by ``run_background`` or at ``close``.

A wait ended by an exception (Ctrl-C on the main thread) leaves its append queued and
strands no one: the main thread is never a node of the wake-up relay, and a lead passed to
a waiter that has left goes on to the next.

Work that must not land on a caller (finishing a segment: truncate, fsyncs, creating the
next file) runs on one background thread that takes the lead like a follower does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from sediment.errors import WalError
from sediment.wal.protocol import check_usable
from sediment.wal.record import Record

log = logging.getLogger(__name__)

_QUEUED, _LEAD, _DONE = 0, 1, 2
_MAIN = threading.main_thread().ident


class GroupAppend:
    """One submission: queued, then written with its group, then durable. The caller's
    ticket; ``wake`` holds one lock per thread waiting on it as a follower (any number of
    threads may wait on one ticket), and is empty while none does; ``main`` is the main
    thread's lock among them, which is woken directly, never as a node of the relay: Ctrl-C
    may end the main thread's wait, and a node that never runs would strand the waiters
    below it."""

    __slots__ = ("records", "crcs", "on_durable", "joinable", "table", "size", "last_lsn", "error", "state", "wake",
                 "main", "relay", "_group")

    def __init__(self, group: GroupCommit | None, records: Sequence[Record], crcs: list[int],
                 on_durable: Callable[[Sequence[Record]], None] | None = None, joinable: int = 0) -> None:
        self._group = group
        self.records = records
        self.joinable = joinable  # > 0: a plain UPDATES record the log may join, up to this many body bytes
        self.table = None  # a joinable record's rows, when its body is left for the leader to encode
        self.size = 0  # ... and then a bound on that body's size
        self.crcs = crcs
        self.on_durable = on_durable
        self.last_lsn = -1
        self.error: BaseException | None = None
        self.state = _QUEUED
        self.wake: list[threading.Lock] = []
        self.main: threading.Lock | None = None
        self.relay: _Relay | None = None  # set when done: the waiters this one's waiter wakes in turn

    def wait(self) -> int:
        """Block until the records are durable (leading the group if no one leads); their
        last LSN. Raises the write's error."""
        if self.state != _DONE:
            self._group.wait(self)
        if self.error is not None:
            raise self.error
        return self.last_lsn

    def settled(self) -> bool:
        return self.state == _DONE


class GroupCommit:
    """The queue and the lead of one log. ``write(group)`` writes and syncs a group in queue
    order, sets each append's LSNs and runs its callbacks; ``background(requested)`` is the
    work run on the background thread with the lead: when ``wants_background()`` says so
    after a group, at close, or (``requested``) for :meth:`run_background`."""

    def __init__(self, where: str, write: Callable[[list[GroupAppend]], None],
                 background: Callable[[bool], None], wants_background: Callable[[], bool], name: str) -> None:
        self.where = where
        self._write = write
        self._background = background
        self._wants_background = wants_background
        self._lock = threading.Lock()
        self._queue: list[GroupAppend] = []
        self._leading = False
        self._lone = 0  # the thread id holding a lead from lead_idle, 0 for none
        self._closing = False
        self.failed: BaseException | None = None
        self._bg_turn = threading.Condition(self._lock)
        self._bg_wanted = False  # the background thread asked for the lead
        self._bg_leads = False  # ... and has it
        self._bg_waiters: list[GroupAppend] = []
        self._thread = threading.Thread(target=self._background_loop, name=name, daemon=True)
        self._thread.start()

    # --- callers ---------------------------------------------------------------------------------

    def submit(self, pending: GroupAppend) -> GroupAppend:
        """Queue ``pending`` (queue order is log order) unless the log is closed or failed."""
        with self._lock:
            if self._closing or self.failed is not None:
                check_usable(self.where, self._closing, self.failed)
            self._queue.append(pending)
        return pending

    def wait(self, pending: GroupAppend) -> None:
        """Return once ``pending`` is done: lead a group if no one leads, else wait as a
        follower until a leader finishes it or passes the lead to it."""
        with self._lock:
            if pending.state == _DONE:
                return
            if self._leading:
                wake = threading.Lock()
                wake.acquire()
                pending.wake.append(wake)
                if threading.get_ident() == _MAIN:
                    pending.main = wake
            else:
                self._leading = True
                wake = None
                group, self._queue = self._queue, []  # taken with the lead: one lock round fewer
        if wake is not None:
            try:
                wake.acquire()  # released by the leader: done, or the lead is ours
            except BaseException:
                self._abandon(pending, wake)
                raise
            if pending.state == _DONE:
                pending.relay.woken(wake)
                return
            with self._lock:
                group, self._queue = self._queue, []
        # the lead, here rather than in a method of its own (one frame fewer on a lone append's
        # path: FileLog._write_group says why): write the group taken with it and, once, the
        # group queued meanwhile, then pass the lead on
        if not group:
            self._pass_lead([])
            return
        try:
            self._write(group)
        except BaseException as exc:  # noqa: BLE001 - every waiter must learn of the failure
            self._fail(group, exc)
            return
        if len(group) == 1 and self._release_lone(group[0]):
            return
        nxt = self._pass_lead(group, self._wants_background(), keep=True)
        if nxt is not None and self._written(nxt):
            self._pass_lead(nxt, self._wants_background())

    def lead_idle(self) -> bool:
        """Take the lead when no one leads, nothing is queued, the background thread wants
        nothing and the log is open: the caller then writes its one append itself, with no
        queue entry or ticket, and must end with :meth:`end_lead` (or :meth:`fail_lead`).
        False, with nothing changed, otherwise (the caller then submits and waits).

        Why: a lone writer's append went through a ``GroupAppend``, the queue, and the
        ticket's wait only to find itself the whole group (three rounds of this lock, a
        frame per step, each costing twice its hot cost after the last fdatasync's sleep).
        Taken under the caller's own lock (the one its submits are made under), the lead
        keeps queue order: whatever is submitted later queues behind it and is written by
        this leader (once, as :meth:`wait` does) or the next."""
        with self._lock:
            if self._leading or self._queue or self._bg_wanted or self._closing or self.failed is not None:
                return False
            self._leading = True
            self._lone = threading.get_ident()
            return True

    def end_lead(self, background: bool) -> None:
        """After a lead from :meth:`lead_idle` wrote its append: drop the lead when nothing
        was queued meanwhile and the background thread wants nothing (``background``: what
        ``wants_background()`` says, passed by the log that knows it without a call), else
        do what a leader does after its group (write the group queued meanwhile once, then
        pass the lead on)."""
        self._lone = 0
        if not background:
            with self._lock:
                if not self._queue and not self._bg_wanted:
                    self._leading = False
                    return
        nxt = self._pass_lead([], background, keep=True)
        if nxt is not None and self._written(nxt):
            self._pass_lead(nxt, self._wants_background())

    def drop_lead(self) -> None:
        """Give up a lead from :meth:`lead_idle` that wrote nothing: to a follower that waits
        meanwhile, else no one. Nothing when the calling thread holds no such lead (it ended,
        failed or was given back already), so a caller interrupted anywhere between taking the
        lead and ending it can always call this, and never hands on a lead it does not hold."""
        if self._lone != threading.get_ident():
            return
        self._lone = 0
        self._pass_lead([])

    def fail_lead(self, exc: BaseException) -> WalError:
        """After a lead from :meth:`lead_idle` failed to write its append: fail what is
        queued and the log, as a failed group does; the error to raise to the caller."""
        self._lone = 0
        return self._fail([], exc)

    def run_background(self) -> None:
        """Have the background thread take the lead, write what is queued and run
        ``background()``; return when it has (raises the log's failure)."""
        waiter = GroupAppend(None, (), [])
        wake = threading.Lock()
        wake.acquire()
        waiter.wake.append(wake)
        if threading.get_ident() == _MAIN:
            waiter.main = wake
        with self._lock:
            check_usable(self.where, self._closing, self.failed)
            self._bg_waiters.append(waiter)
            self._ask_background()
        wake.acquire()  # released once the turn is over
        waiter.relay.woken(wake)
        if waiter.error is not None:
            raise waiter.error

    def _abandon(self, pending: GroupAppend, wake: threading.Lock) -> None:
        """A follower's wait ended by an exception (Ctrl-C on the main thread): forget its lock,
        or, if the lead was passed to it, leave the append queued for the next group (it is
        written like a ticket nobody waits on) and pass the lead on."""
        with self._lock:
            if wake in pending.wake:  # a new list: _wake_all may be reading the old one
                pending.wake = [w for w in pending.wake if w is not wake]
                if pending.main is wake:
                    pending.main = None
                return
            if pending.state != _LEAD:
                return  # done: the main thread's lock is woken directly, so no one waits on it
            pending.state = _QUEUED
        self._pass_lead([])

    def close(self) -> None:
        """Write what is queued, stop the background thread; later submissions raise EngineClosed."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._ask_background()
        self._thread.join()

    # --- the lead --------------------------------------------------------------------------------

    def _release_lone(self, p: GroupAppend) -> bool:
        """A lone leader's own append, written: mark it done and drop the lead when no other
        thread waits on it, nothing is queued and the background thread wants nothing (what
        :meth:`_pass_lead` would do then, without its loops and wakes). False, with nothing
        changed, otherwise."""
        if p.wake or self._wants_background():
            return False
        with self._lock:
            if p.wake or self._queue or self._bg_wanted:
                return False
            p.state = _DONE
            self._leading = False
        return True

    def _written(self, group: list[GroupAppend]) -> bool:
        """Write ``group``; on failure fail it, everything queued and the log, and say False."""
        try:
            self._write(group)
        except BaseException as exc:  # noqa: BLE001 - every waiter must learn of the failure
            self._fail(group, exc)
            return False
        return True

    def _pass_lead(self, group: list[GroupAppend], background: bool = False,
                   keep: bool = False) -> list[GroupAppend] | None:
        """Mark ``group`` done (acknowledged, in LSN order); with ``keep``, when followers
        wait in the queue and the background thread does not want the lead, take the queue
        as the next group to write and return it; else hand the lead to the background
        thread if it wants it, else to the first queued follower that waits, else drop it.
        Then wake the group's followers."""
        nxt = None
        kept = None
        with self._lock:
            for p in group:
                p.state = _DONE
            if background:
                self._bg_wanted = True
            if self._bg_wanted:
                self._bg_leads = True
                self._bg_turn.notify()
            elif keep and any(p.wake for p in self._queue):
                kept, self._queue = self._queue, []
            else:
                for p in self._queue:
                    if p.wake:
                        p.state = _LEAD
                        nxt = p.wake.pop(0)  # one of its waiters leads; any others wait for done
                        if p.main is nxt:
                            p.main = None
                        break
                else:
                    self._leading = False
        if nxt is not None:
            nxt.release()
        _wake_all(group)
        return kept

    def _fail(self, group: list[GroupAppend], exc: BaseException) -> WalError:
        log.error("write-ahead log %s failed: %s", self.where, exc)
        err = WalError(f"write to the log at {self.where} failed: {exc}; not acknowledged")
        with self._lock:
            if self.failed is None:
                self.failed = exc
            rest, self._queue = self._queue, []
            waiters, self._bg_waiters = self._bg_waiters, []
            every = group + rest + waiters
            for p in every:
                p.error = err
                p.state = _DONE
            if self._bg_wanted:  # the background thread keeps or takes the lead (close waits on it)
                self._leading = self._bg_leads = True
                self._bg_turn.notify()
            else:
                self._leading = False
        _wake_all(every)
        return err

    def _ask_background(self) -> None:
        """Under the lock: the background thread wants the lead; take it now if no one leads."""
        self._bg_wanted = True
        if not self._leading:
            self._leading = self._bg_leads = True
        self._bg_turn.notify()

    def _background_loop(self) -> None:
        while True:
            with self._lock:
                while not self._bg_leads:
                    self._bg_turn.wait()
                closing = self._closing
                waiters, self._bg_waiters = self._bg_waiters, []
                group, self._queue = self._queue, []
            error = self._background_turn(group, bool(waiters))
            with self._lock:
                for w in waiters:
                    w.error = w.error or error
                    w.state = _DONE
                if not closing:  # requests made during the turn keep it wanted
                    self._bg_leads = False
                    self._bg_wanted = bool(self._bg_waiters) or self._closing
            _wake_all(waiters)
            if closing:
                return  # the lead stays here: nothing is written after close
            self._pass_lead([])  # back to the background thread, to a waiting follower, or dropped

    def _background_turn(self, group: list[GroupAppend], requested: bool) -> BaseException | None:
        """With the lead on the background thread: write the queued group, then the background
        work. The error to give ``run_background``'s callers, if any."""
        try:
            if group:
                self._write(group)
            if self.failed is None:
                self._background(requested)
        except BaseException as exc:  # noqa: BLE001 - every waiter must learn of the failure
            self._fail(group, exc)
            return WalError(f"write to the log at {self.where} failed: {exc}; not acknowledged")
        with self._lock:
            for p in group:
                p.state = _DONE
        _wake_all(group)
        if self.failed is not None:
            return WalError(f"the write-ahead log at {self.where} failed earlier ({self.failed})")
        return None


class _Relay:
    """The waiters of a finished group, woken as a binary tree: the leader releases the first
    two, and each woken waiter releases two more before it returns.

    Why: a leader that released every waiter itself (one futex wake each, with the
    interpreter lock held) spent about a tenth of the 64-writer run doing it, between one
    group's fdatasync and the next group's write. Now it wakes two and moves on, and the
    wakes spread over the threads that were waiting anyway (depth log2 of the group)."""

    __slots__ = ("locks", "at")

    def __init__(self, locks: list[threading.Lock]) -> None:
        self.locks = locks
        self.at = {id(w): i for i, w in enumerate(locks)}

    def start(self) -> None:
        self._release(0)

    def woken(self, wake: threading.Lock) -> None:
        """Called by the thread ``wake`` woke: wake its two children (none when ``wake`` is
        not in the tree: a lock that passed the lead)."""
        i = self.at.get(id(wake))
        if i is not None:
            self._release(2 * i + 2)

    def _release(self, i: int) -> None:
        locks = self.locks
        for w in locks[i:i + 2]:
            w.release()


def _wake_all(pendings: list[GroupAppend]) -> None:
    """Wake every thread waiting on ``pendings`` (their state is already done): set each
    pending's relay before releasing any waiter, wake the main thread's locks directly, then
    start the relay."""
    locks: list[threading.Lock] = []
    direct: list[threading.Lock] = []
    for p in pendings:
        if p.wake:
            main = p.main  # read once: an abandoning main thread may clear it meanwhile
            if main is not None:
                direct.append(main)
                locks += [w for w in p.wake if w is not main]
                p.main = None
            else:
                locks += p.wake
            p.wake = []
    if locks or direct:  # else no one waits (a lone writer led its own group)
        relay = _Relay(locks)
        for p in pendings:
            p.relay = relay
        for w in direct:
            w.release()
        relay.start()
