"""The relay: sleeping reader threads woken a few at a time, each waking the next.

Why: with 100 or 1,000 threads each reading a feed, waking all of them at an event has
every one wait for the interpreter lock together, each polling for it: the turn takes
longer and costs more CPU than waking them in turn (docs/benchmarks.md, "Feed latency").
A writer appends the sleepers an event is for to :attr:`Relay.pending` (without a lock),
then :meth:`Relay.start` wakes up to ``chains`` of them; each one woken calls
:meth:`Relay.settle` once, which wakes the next sleeper in its place, so every wake-up
the relay starts carries on until no sleeper is left, whatever ended the woken one's
wait. A woken reader near the head settles after taking what it came for: the next one
then finds the event decoded and the interpreter lock about to be let go.

A sleeper has a ``sleeping`` flag and a ``wake`` lock (held while it sleeps). It sets the
flag, joins ``pending`` or makes sure its writer will add it, looks again for something
to read (an event added meanwhile is seen by that look or wakes it), then waits on the
lock. Whoever wakes it through the relay clears the flag; a direct wake (a close, an
error) only releases the lock, so the sleeper's :meth:`Relay.settle` tells the two apart.

A sleeper on the main thread joins :attr:`Relay.direct` instead: :meth:`Relay.start` wakes
it on its own, and it never wakes another. Why: Ctrl-C raises KeyboardInterrupt in the
main thread between any two of its bytecodes, so a hand-on run there could stop half way
(a sleeper's flag cleared and its lock never released) and leave readers asleep for good.

Used by the engine's feed log (engine/feed.py), where every sleeper is due at each event,
and by a client's shared feed stream (:class:`RelayQueue`, sediment/net), where an event
is for the subscriptions it names.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any, Protocol

CHAINS = 2  # sleepers woken at once; each wakes the next when it settles


class Sleeper(Protocol):
    sleeping: bool
    direct: bool  # asleep in Relay.direct (the main thread), not in a chain
    wake: threading.Lock


def on_main_thread() -> bool:
    """Whether a sleeper here must be woken directly (see the module's docstring)."""
    return threading.current_thread() is threading.main_thread()


def release(lock: threading.Lock) -> None:
    """Release a sleeper's wake lock, once: a second wake of the same sleep is a no-op."""
    try:
        lock.release()
    except RuntimeError:  # already released: the sleeper was woken twice
        pass


class Relay:
    """The sleepers due a wake-up and the wake-ups under way."""

    __slots__ = ("pending", "direct", "_queue", "_lock", "_running")

    def __init__(self) -> None:
        self.pending: list[Any] = []  # sleepers due a wake-up, appended without a lock
        self.direct: list[Any] = []  # main-thread sleepers, woken one by one at the next start
        self._queue: deque[Any] = deque()
        self._lock = threading.Lock()
        self._running = 0  # woken sleepers that have yet to settle

    def start(self, chains: int = CHAINS) -> None:
        """Wake the direct sleepers, move the pending ones to the relay and start up to
        ``chains`` wake-ups."""
        if self.direct:
            direct, self.direct = self.direct, []
            for sleeper in direct:
                if sleeper.sleeping:
                    sleeper.sleeping = False
                    release(sleeper.wake)
        pending, self.pending = self.pending, []
        with self._lock:
            self._queue.extend(pending)
            while self._running < chains and self._hand_on():
                self._running += 1

    def _hand_on(self) -> bool:
        """Wake the next sleeper that still sleeps (lock held); False if none."""
        waiting = self._queue
        while waiting:
            sleeper = waiting.popleft()
            if sleeper.sleeping:
                sleeper.sleeping = False
                release(sleeper.wake)
                return True
        return False

    def settle(self, sleeper: Sleeper, forget: bool = False) -> None:
        """``sleeper`` stopped waiting. Woken by the relay (its flag cleared), it wakes the
        next sleeper in its place. ``forget``: it slept and nothing woke it (a timeout,
        Ctrl-C): it leaves ``pending``, lest an idle feed's readers with timeouts pile up
        there until the next event. A direct sleeper takes no lock and wakes no one."""
        if sleeper.direct:
            sleeper.sleeping = False
            if forget:
                try:
                    self.direct.remove(sleeper)
                except ValueError:  # woken meanwhile
                    pass
            return
        with self._lock:
            if sleeper.sleeping:
                sleeper.sleeping = False
                if forget:
                    try:
                        self.pending.remove(sleeper)
                    except ValueError:  # started meanwhile: the relay skips it, not asleep
                        pass
            elif not self._hand_on():
                self._running -= 1

    def everyone(self) -> list[Any]:
        """The sleepers pending or in the relay (to wake them all at a close)."""
        with self._lock:
            return [*self.direct, *self.pending, *self._queue]


_EMPTY = object()


class RelayQueue:
    """One reader's queue whose writer wakes the reader through a :class:`Relay`.

    :meth:`put_quiet` queues an item and, if the reader sleeps, makes it pending in the
    relay, which the writer starts once it has queued an event for every reader it is for
    (a client's shared feed stream: one event for many subscriptions, read by a thread
    each). :meth:`put` queues and wakes the reader at once (a close, an error). The read
    side is :class:`queue.SimpleQueue`'s (``get``, ``get_nowait``, ``empty``) for one
    reader, so the waits that read a queue read this one too."""

    __slots__ = ("_items", "_relay", "sleeping", "direct", "wake")

    def __init__(self, relay: Relay) -> None:
        self._items: deque[Any] = deque()
        self._relay = relay
        self.sleeping = False
        self.direct = False
        self.wake = threading.Lock()
        self.wake.acquire()

    def put_quiet(self, item: Any) -> None:
        self._items.append(item)
        if self.sleeping:
            (self._relay.direct if self.direct else self._relay.pending).append(self)

    def put(self, item: Any) -> None:
        self._items.append(item)
        if self.sleeping:
            release(self.wake)

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> Any:
        try:
            return self._items.popleft()
        except IndexError:
            raise queue.Empty from None

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next item, waiting up to ``timeout`` seconds (None: no limit); raises
        queue.Empty at the timeout. Woken by the relay, the reader takes its item and then
        wakes the next sleeper."""
        items, relay = self._items, self._relay
        if items or not block:
            return self.get_nowait()
        deadline = None if timeout is None else time.monotonic() + timeout
        self.direct = on_main_thread()
        while True:
            self.sleeping = True
            if items:  # queued since the look: the writer may have made it pending too
                relay.settle(self)
                return items.popleft()
            left = -1 if deadline is None else deadline - time.monotonic()
            woken = carry = False
            try:
                if deadline is None or left > 0:
                    woken = self.wake.acquire(timeout=left)
                carry = woken
            finally:
                if not carry:
                    relay.settle(self, forget=not woken)
            if carry:
                try:
                    got = items.popleft() if items else _EMPTY
                finally:
                    relay.settle(self)
                if got is not _EMPTY:
                    return got
            elif items:
                return items.popleft()
            elif not woken:
                raise queue.Empty
