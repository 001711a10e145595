"""A lease on one metadata key, for stores without sessions (S3; issue 25's membership).

ZooKeeper has ephemeral nodes; a metadata store on S3 has only compare-and-set. So the
holder renews the lease by a compare-and-set that moves the key's version on, and another
member takes the lease over only after it has seen the *same write* unchanged for
``lease_time`` seconds of *its own* clock: no clocks are compared across machines, so clock
skew cannot hand the lease to two members at once beyond what pauses allow. A write is told
by its version *and* a random token in its value: a release deletes the key, and the next
holder's first write is version 0 again, which must not pass for the version 0 of a lease
seen (or held) before it.

A lease is advisory. A holder that stalls past the lease time may still believe it holds
it; safety comes from epochs (the log on S3 fences a stale writer by its claim), never from
the lease: use the lease to decide who *should* serve, and the log's claim to make it so.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from typing import Protocol

from sediment.errors import InvalidMetadataRequest, MetadataConflict
from sediment.metadata.protocol import MetadataStore


class Clock(Protocol):
    """What a lease needs of sediment.clock's clocks (metadata/ stays a leaf: no import of them)."""

    def current_time(self) -> float: ...


class Lease:
    """The lease at ``key`` as seen by the member ``holder``.

    Call :meth:`try_acquire` every so often (say a third of ``lease_time``): it renews the
    lease while this member holds it, and takes it over once the holder has not renewed
    for ``lease_time`` seconds of ``clock``.
    """

    def __init__(self, store: MetadataStore, key: str, holder: str, lease_time: float, clock: Clock,
                 info: dict[str, object] | None = None) -> None:
        if not holder or not lease_time > 0:
            raise InvalidMetadataRequest(f"a lease needs a holder name and a lease time > 0, not {holder!r}, "
                                         f"{lease_time!r}")
        self.store, self.key, self.holder, self.lease_time, self._clock = store, key, holder, lease_time, clock
        self._version: int | None = None  # the version we wrote, while we hold the lease
        self._value = b""  # what we wrote at _version (its token tells it from a later write's)
        self._seen: tuple[int, bytes, float] | None = None  # (another's write: version, value; when first seen)
        self._info = dict(info or {})  # more fields of the value (a member's advertised address)
        self._pending: tuple[int, bytes] | None = None  # a write whose answer did not come back

    @property
    def held(self) -> bool:
        """Whether this member's last write is the lease's newest version (as far as it knows)."""
        return self._version is not None

    def current_holder(self) -> str | None:
        got = self.store.get(self.key)
        return json.loads(got.value)["holder"] if got is not None else None

    def try_acquire(self) -> bool:
        """Renew the lease if held, take it if free or expired on this member's clock; whether
        this member holds it now."""
        got = self.store.get(self.key)
        if got is None:
            return self._write(None)
        if self._version is not None and (got.version, got.value) == (self._version, self._value):
            return self._write(got.version)
        self._version = None
        now = self._clock.current_time()
        if self._seen is None or self._seen[:2] != (got.version, got.value):
            self._seen = (got.version, got.value, now)  # the holder moved on (or first look): it is alive
            return False
        if now - self._seen[2] < self.lease_time:
            return False
        return self._write(got.version)

    def renew(self) -> bool:
        """Renew the lease only if this member holds it: never take it, nor create it again once
        another deleted it (a holder declared dead must know it); whether it still holds it.
        A store that does not answer raises, and the lease stays as it was known."""
        if self._version is None:
            return False
        got = self.store.get(self.key)
        if got is not None and self._pending is not None and (got.version, got.value) == self._pending:
            self._version, self._value = self._pending  # the write whose answer was lost landed
        self._pending = None
        if got is None or (got.version, got.value) != (self._version, self._value):
            self._version = None
            return False
        return self._write(got.version)

    def _write(self, expected: int | None) -> bool:
        renewals = 0 if expected is None else expected + 1
        value = json.dumps({**self._info, "holder": self.holder, "renewals": renewals,
                            "token": secrets.token_hex(8)}).encode()
        self._pending = (renewals, value)
        try:
            self._version = self.store.compare_and_set(self.key, value, expected)
        except MetadataConflict:
            self._version = self._pending = None
            return False
        self._value, self._seen, self._pending = value, None, None
        return True

    def release(self) -> None:
        """Give the lease up now (others need not wait out the lease time)."""
        if self._version is not None:
            with contextlib.suppress(MetadataConflict):
                self.store.delete(self.key, self._version)
            self._version = None


class LeaseWatch:
    """Others' leases as this member sees them: one has expired once this member has seen the
    same write at its key for ``lease_time`` seconds of its own clock (as :class:`Lease` takes
    one over). A key seen for the first time counts from that moment."""

    def __init__(self, lease_time: float, clock: Clock) -> None:
        self.lease_time, self._clock = lease_time, clock
        self._seen: dict[str, tuple[int, bytes, float]] = {}
        self._since = float("-inf")  # no lease counts as unchanged from before this (restart)

    def expired(self, key: str, version: int, value: bytes) -> bool:
        now = self._clock.current_time()
        seen = self._seen.get(key)
        if seen is None or seen[:2] != (version, value):
            self._seen[key] = (version, value, now)
            return False
        return now - max(seen[2], self._since) >= self.lease_time

    def restart(self) -> None:
        """Count every lease as unchanged only from now on: called after this member could not
        reach the store for a while, when its holders may not have reached it either."""
        self._since = self._clock.current_time()

    def keep_only(self, keys: set[str]) -> None:
        """Forget the keys no longer there."""
        for key in set(self._seen) - keys:
            del self._seen[key]
