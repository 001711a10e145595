"""Remote subscriptions read from asyncio: the client's reading thread wakes each event loop
once per event, whatever the number of subscriptions asleep in it.

Why: a client process reading 100 or 1,000 subscriptions from one thread each pays a thread
wake-up (a futex hand-off, then a wait for the interpreter lock) per subscription and event,
which bounds a feed over the network as it bounds one in process. Read with ``async for`` or
``await sub.next_async(timeout)``, a subscription with nothing queued sleeps as a future of
its loop, among the sleepers of that loop (:mod:`sediment.engine.feed_async`, the engine's
own). The thread that reads the Flight stream queues each event for its subscriptions as
before, then pokes every loop with sleepers once (one ``call_soon_threadsafe``, none while a
resume is still pending), and the loop resumes them all in its own thread. That is one
wake-up per event for a client's shared subscriptions to a relation (one stream); an
unshared one (``shared=False``, or an older server) has a stream and a reading thread of
its own, woken per event as before. A loop that closes without closing its subscriptions
is forgotten at the next poke; its subscriptions stay readable from a thread or another
loop.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from typing import Any

from sediment.engine.feed_async import Seat, doze

NOTHING = object()  # what a wait returns on a timeout or a close


def _queued(events: queue.SimpleQueue[Any] | queue.Queue[Any]) -> Any:
    """The next queued item, or NOTHING (one reader: what ``empty()`` denies is there)."""
    return NOTHING if events.empty() else events.get_nowait()


async def wait_item_async(events: queue.SimpleQueue[Any] | queue.Queue[Any], seat: Seat,
                          timeout: float | None, closed: Callable[[], bool]) -> Any:
    """The next item of ``events`` within ``timeout`` seconds (None: no limit), or NOTHING on
    timeout or once ``closed()``, sleeping in the running loop. The sleeper registers, then
    looks at the queue again, so an item queued meanwhile is either seen by that look or
    followed by a poke. A cancelled wait takes nothing from the queue."""
    item = _queued(events)
    if item is not NOTHING or timeout is not None and timeout <= 0:
        return item
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while not closed():
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            break
        fut = seat.waiters_in(loop).sleep()
        item = _queued(events)
        if item is not NOTHING or closed():
            return item
        await doze(fut, left)
        item = _queued(events)
        if item is not NOTHING:
            return item
    return NOTHING
