"""The server's open transactions, by id, between calls.

A client begins a transaction in one call and names it in later ones, so the server
keeps it; a group (a Spark job) lets ``commit_all`` abort the losing attempts. One left
idle (no call naming it) for longer than ``idle_timeout`` is aborted, and so is every one
still open when the server stops: an open transaction holds back the compacter's WAL
cut, so a client that vanished must not keep one open for ever. Finished transactions'
states are remembered (a bounded number) so that a late ``txn_state`` or a repeated
``abort`` gets the right answer. So are ended groups (``commit_all`` with a group, or
``abort_group``): a task attempt that outlives its Spark job, whose end Spark does not wait
for, cannot begin a transaction in the job's group afterwards and leave it open.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sediment import errors
from sediment.clock import Clock
from sediment.errors import TransactionError
from sediment.txn_state import OPEN

FINISHED_TXN_STATES = 4096  # how many finished transactions' states are remembered
ENDED_GROUPS = 4096  # how many ended groups are remembered

log = logging.getLogger("sediment.server")


def group_name(group: object) -> str | None:
    """A transaction group as sent (None: no group); InvalidArgument unless it is text."""
    if group is not None and not isinstance(group, str):
        raise errors.InvalidArgument(f"a transaction group is a name (text), not {group!r}; nothing was begun, "
                                     "committed or aborted")
    return group


def txn_id_of(value: object) -> int:
    """A transaction id as sent; InvalidArgument unless it is an integer (a list or an object
    would otherwise reach the registry's dicts as a builtin TypeError)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidArgument(f"a transaction id is an integer, not {value!r}; nothing was appended, "
                                     "committed or aborted")
    return value


class TxnRegistry:
    """Open transactions of one server; ``begin`` makes them through ``new_txn``."""

    def __init__(self, new_txn: Callable[[], Any], idle_timeout: float | None, clock: Clock) -> None:
        self._new_txn = new_txn
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._txns: dict[int, Any] = {}
        self._used: dict[int, float] = {}  # transaction id -> clock time of the last call naming it
        self._groups: dict[str, set[int]] = {}  # group -> its open transactions
        self._group_of: dict[int, str] = {}
        self._idle_aborted: OrderedDict[int, None] = OrderedDict()
        self._finished: OrderedDict[int, str] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._closed_reason: str | None = None

    # --- lookups -------------------------------------------------------------------------------

    def begin(self, group: object = None) -> int:
        group = group_name(group)
        with self._lock:
            if self._closed_reason is not None:
                raise errors.EngineClosed(self._closed_reason)
            if group is not None and str(group) in self._ended:
                raise TransactionError(f"transaction group {str(group)!r} has ended (its job committed or aborted): "
                                       "this attempt outlived its job, so nothing was begun; no retry can help")
            tx = self._new_txn()
            self._txns[tx.id] = tx
            self._used[tx.id] = self._clock.current_time()
            if group is not None:
                self._groups.setdefault(str(group), set()).add(tx.id)
                self._group_of[tx.id] = str(group)
        return tx.id

    def get(self, txn_id: object) -> Any:
        """The open transaction ``txn_id`` (its idle clock restarts), or TransactionError
        (InvalidArgument when ``txn_id`` is not an integer)."""
        txn_id = txn_id_of(txn_id)
        with self._lock:
            tx = self._txns.get(txn_id)
            state = self._finished.get(txn_id)
            if tx is not None:
                self._used[tx.id] = self._clock.current_time()
            idle = txn_id in self._idle_aborted
        if tx is None:
            shown = f"{txn_id:#x}"
            if idle:
                state = (f"{state}: the server aborted it after {self.idle_timeout:g} s without a call "
                         "(txn_idle_timeout)")
            raise TransactionError(f"transaction {shown} is " + (
                f"already {state}" if state else "not open on this server (it was never begun here, or the "
                "server restarted and aborted it); begin a new transaction"))
        return tx

    def state(self, txn_id: object) -> str:
        txn_id = txn_id_of(txn_id)
        with self._lock:
            tx = self._txns.get(txn_id)
            return tx.state if tx is not None else self._finished.get(txn_id, "unknown")

    def finished_state(self, txn_id: object) -> str | None:
        txn_id = txn_id_of(txn_id)
        with self._lock:
            return self._finished.get(txn_id)

    @property
    def open_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._txns)

    # --- settling ------------------------------------------------------------------------------

    def _forget(self, txn_id: int) -> None:
        """Drop an open transaction's bookkeeping (with ``_lock`` held)."""
        self._txns.pop(txn_id, None)
        self._used.pop(txn_id, None)
        group = self._group_of.pop(txn_id, None)
        if group is not None:
            members = self._groups.get(group)
            if members is not None:
                members.discard(txn_id)
                if not members:
                    del self._groups[group]

    def _remember(self, txn_id: int, state: str) -> None:
        self._finished[txn_id] = state
        while len(self._finished) > FINISHED_TXN_STATES:
            self._finished.popitem(last=False)

    def settle(self, tx: Any) -> str:
        """Forget a finished transaction, remembering its final state for ``state``."""
        state = tx.state
        if state != OPEN:
            with self._lock:
                self._forget(tx.id)
                self._remember(tx.id, state)
        return state

    def group_members(self, group: str) -> list[Any]:
        """End the group: take its open transactions out of it (for aborting them); a later
        ``begin`` in it is refused."""
        with self._lock:
            self._ended[group] = None
            while len(self._ended) > ENDED_GROUPS:
                self._ended.popitem(last=False)
            ids = self._groups.pop(group, set())
            return [self._txns[i] for i in ids if i in self._txns]

    def reap_idle(self) -> list[int]:
        """Abort the transactions idle for longer than ``idle_timeout``; their ids."""
        if self.idle_timeout is None:
            return []
        now = self._clock.current_time()
        with self._lock:
            idle = [self._txns[i] for i, used in self._used.items()
                    if now - used > self.idle_timeout and i in self._txns]
            for tx in idle:  # no call can pick them up any more
                self._forget(tx.id)
        reaped = []
        for tx in idle:
            try:
                tx.abort()
            except Exception as exc:  # noqa: BLE001 - replay discards it at the next open anyway
                log.warning("could not abort idle transaction %#x: %s", tx.id, exc)
                continue
            log.warning("aborted transaction %#x: no call for more than %g s", tx.id, self.idle_timeout)
            with self._lock:
                self._idle_aborted[tx.id] = None
                while len(self._idle_aborted) > FINISHED_TXN_STATES:
                    self._idle_aborted.popitem(last=False)
                self._remember(tx.id, tx.state)
            reaped.append(tx.id)
        return reaped

    def close(self, reason: str) -> list[Any]:
        """Refuse new transactions (EngineClosed: ``reason``) and hand back the open ones."""
        with self._lock:
            self._closed_reason = reason
            open_txns, self._txns = list(self._txns.values()), {}
        return open_txns

    def refuse_new(self, reason: str) -> None:
        with self._lock:
            self._closed_reason = reason
