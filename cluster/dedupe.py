"""Appends applied once: a partition owner's bookkeeping of clients' idempotency keys.

A client numbers its appends to one partition 1, 2, 3, ... under its client id and retries
an append whose outcome it does not know (the connection dropped, the owner failed over)
with the same number. The owner asks :meth:`Dedupe.check` before writing, marks the append
in flight with :meth:`Dedupe.begin`, and records it with :meth:`Dedupe.applied` once durable
(in log order). The applied keys travel in the log with the appends, so a new owner rebuilds
the same table with :meth:`Dedupe.from_log` and answers a retry of an append the old owner
wrote with success, never with an error that claims nothing was written.

Numbers must be applied in order: a number past the next expected one is refused
(nothing written) until the ones before it are settled, which is what lets one integer per
client stand for every append the client ever made. The module is pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sediment.errors import InvalidIdempotencyKey

DEFAULT_KEEP = 8


class Verdict(Enum):
    """What the owner does with an incoming append."""

    APPLY = "apply"  # the next number: write it
    DUPLICATE = "duplicate"  # already applied: answer success (with its result if still kept)
    IN_FLIGHT = "in_flight"  # being written now: wait for that write's outcome, do not write again
    OUT_OF_ORDER = "out_of_order"  # a number before it is not settled: refuse, nothing written


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    expected: int  # the number this client's next new append must carry
    result: Any = None  # for DUPLICATE: the applied append's result, None when no longer kept


@dataclass
class _Client:
    last: int = 0  # every number <= last is applied
    pending: int = 0  # numbers last+1 .. last+pending are being written, in this order
    results: deque[tuple[int, Any]] = field(default_factory=deque)  # the newest applied (number, result)


def _check_key(client: str, seq: int) -> None:
    if not isinstance(client, str) or not client:
        raise InvalidIdempotencyKey(f"idempotency key: client id {client!r} must be a non-empty str")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise InvalidIdempotencyKey(f"idempotency key: sequence number {seq!r} of client {client!r} must be an "
                                    "int >= 1")


class Dedupe:
    """Per client id of one partition: the last applied number, the appends in flight, and
    the results of the newest ``keep`` applied appends (what a retry gets back)."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise InvalidIdempotencyKey(f"Dedupe: keep={keep!r}; pass how many results to keep per client, "
                                        "an int >= 0")
        self.keep = keep
        self._clients: dict[str, _Client] = {}

    def last(self, client: str) -> int:
        """The highest applied number of ``client`` (0: none)."""
        c = self._clients.get(client)
        return c.last if c is not None else 0

    def check(self, client: str, seq: int) -> Decision:
        """What to do with append ``seq`` of ``client``; changes nothing."""
        _check_key(client, seq)
        c = self._clients.get(client) or _Client()
        expected = c.last + c.pending + 1
        if seq <= c.last:
            return Decision(Verdict.DUPLICATE, expected, dict(c.results).get(seq))
        if seq < expected:
            return Decision(Verdict.IN_FLIGHT, expected)
        return Decision(Verdict.APPLY if seq == expected else Verdict.OUT_OF_ORDER, expected)

    def begin(self, client: str, seq: int) -> None:
        """``seq`` goes to the log now; it must be the number :meth:`check` said to apply."""
        d = self.check(client, seq)
        if d.verdict is not Verdict.APPLY:
            raise InvalidIdempotencyKey(f"append {seq} of client {client!r} is {d.verdict.value}, not the next "
                                        f"({d.expected}); begin only what check() said to apply")
        self._clients.setdefault(client, _Client()).pending += 1

    def applied(self, client: str, seq: int, result: Any = None) -> None:
        """The oldest append in flight of ``client`` is durable (appends become durable in log order)."""
        _check_key(client, seq)
        c = self._clients.get(client)
        if c is None or c.pending == 0 or seq != c.last + 1:
            raise InvalidIdempotencyKey(f"append {seq} of client {client!r} is not its oldest in flight; record "
                                        "appends as applied in log order")
        c.pending -= 1
        self._record(c, seq, result)

    def abandoned(self, client: str, seq: int) -> None:
        """The newest append in flight of ``client`` was refused with nothing written."""
        _check_key(client, seq)
        c = self._clients.get(client)
        if c is None or c.pending == 0 or seq != c.last + c.pending:
            raise InvalidIdempotencyKey(f"append {seq} of client {client!r} is not its newest in flight; only the "
                                        "last append begun can be refused with nothing written")
        c.pending -= 1

    def _record(self, c: _Client, seq: int, result: Any) -> None:
        c.last = seq
        c.results.append((seq, result))
        while len(c.results) > self.keep:
            c.results.popleft()

    @classmethod
    def from_log(cls, applied: Iterable[tuple[str, int, Any]], keep: int = DEFAULT_KEEP) -> Dedupe:
        """The table a new owner rebuilds from the (client, number, result) keys the log holds,
        in log order. Nothing is in flight after a recovery: what the old owner had in flight
        is either in the log (applied) or was never written."""
        table = cls(keep)
        for client, seq, result in applied:
            _check_key(client, seq)
            c = table._clients.setdefault(client, _Client())
            if seq != c.last + 1:
                raise InvalidIdempotencyKey(f"the log holds append {seq} of client {client!r} after {c.last}: "
                                            "numbers must follow one another; check the log with sediment verify")
            table._record(c, seq, result)
        return table
