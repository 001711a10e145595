"""The tables an ``append_many`` stages on the server before the call that appends them.

A client streams each relation's table in a ``stage`` put, then names the stage in one
``append_many`` action, so the engine's one atomic append gets every table. Until then the
tables sit in the server's memory, keyed by the client's stage id. A client that goes away
between the puts and the action (killed, cut off) must not leave them there until the
server stops: a stage no call has named for ``idle_timeout`` seconds is dropped, and its id
remembered (a bounded number), so that a late put to it is refused and no part of it can
ever be appended. A stage the server does not hold (dropped, or staged before a restart) is
refused with StageMissing: nothing written, whereas appending nothing would answer success.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

import pyarrow as pa

from sediment.clock import Clock
from sediment.errors import StageMissing

DROPPED_STAGES = 4096  # how many dropped stage ids are remembered (their later puts are refused)

log = logging.getLogger("sediment.server")


class StagedTables:
    """Staged tables by stage id, then relation; ``where()`` names the server in errors."""

    def __init__(self, idle_timeout: float | None, clock: Clock, where: Callable[[], str]) -> None:
        self._idle_timeout = idle_timeout
        self._clock = clock
        self._where = where
        self._lock = threading.Lock()
        self._tables: dict[str, dict[str, list[pa.Table]]] = {}
        self._used: dict[str, float] = {}  # stage -> clock time of its last put
        self._dropped: OrderedDict[str, None] = OrderedDict()

    def put(self, stage: str, name: str, table: pa.Table) -> None:
        with self._lock:
            if stage in self._dropped:
                raise StageMissing(f"stage: the server on {self._where()} dropped the tables staged as {stage!r} after "
                                   f"{self._idle_timeout:g} s without a call; nothing was written: send the whole "
                                   "append_many again")
            self._tables.setdefault(stage, {}).setdefault(name, []).append(table)
            self._used[stage] = self._clock.current_time()

    def take(self, stage: str) -> dict[str, pa.Table]:
        """The stage's tables, one per relation, no longer held; StageMissing when none are."""
        with self._lock:
            staged = self._tables.pop(stage, None)
            self._used.pop(stage, None)
        if staged is None:
            raise StageMissing(
                f"append_many: the server on {self._where()} holds no tables staged as {stage!r} (it restarted or "
                "stopped since they were staged, dropped them after its txn_idle_timeout, or they were appended "
                "or discarded already); nothing was written: send the whole append_many again")
        return {name: pa.concat_tables(parts) if len(parts) > 1 else parts[0] for name, parts in staged.items()}

    def discard(self, stage: str) -> None:
        with self._lock:
            self._tables.pop(stage, None)
            self._used.pop(stage, None)

    def reap_idle(self) -> list[str]:
        """Drop the stages no call named for longer than ``idle_timeout``; their ids."""
        if self._idle_timeout is None:
            return []
        now = self._clock.current_time()
        with self._lock:
            idle = [stage for stage, used in self._used.items() if now - used > self._idle_timeout]
            for stage in idle:
                self._tables.pop(stage, None)
                del self._used[stage]
                self._dropped[stage] = None
            while len(self._dropped) > DROPPED_STAGES:
                self._dropped.popitem(last=False)
        for stage in idle:
            log.warning("dropped the tables staged as %r: no call for more than %g s", stage, self._idle_timeout)
        return idle

    @property
    def rows(self) -> int:
        with self._lock:
            return sum(t.num_rows for parts in self._tables.values() for ts in parts.values() for t in ts)

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self._used.clear()
