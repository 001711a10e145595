"""The client of an S3-only deployment in the nemesis campaign (bench/nemesis_s3.py): several
``sediment serve`` coordinators may serve it, one at a time (each open takes the deployment
over and fences the one before), and the product names none to its clients. So the client
knows every coordinator's address and sends each call to the one that last answered; when
that one is gone, fenced or failed, it tries the next, until a deadline, as
sediment/cluster_client.py follows a cluster's owners.

A call is tried again elsewhere when the coordinator could not have carried it out (fenced:
``WalFenced``, ``CoordinatorSuperseded``; closed or failed: ``EngineClosed``,
``EngineFailed``) or when its outcome is unknown (``OutcomeUnknown``, a broken connection,
a timeout at a paused process); only idempotent calls are routed here (keyed appends, seals,
reads). Past the deadline a write that met an unknown outcome raises ``OutcomeUnknown``,
anything else ``CoordinatorUnavailable``, as the cluster client does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

DEADLINE = 30.0  # seconds a call keeps trying coordinators
CALL_TIMEOUT = 10.0  # seconds one try may take at one coordinator (a paused one never answers)
RETRY_PAUSE = 0.05  # seconds between two rounds over every address


def _moved() -> tuple[type[BaseException], ...]:
    import pyarrow.flight as flight

    from sediment import errors

    return (errors.CoordinatorUnavailable, errors.EngineClosed, errors.EngineFailed, errors.OutcomeUnknown,
            errors.CoordinatorSuperseded, errors.WalFenced, flight.FlightTimedOutError)


class Failover:
    """The calls the nemesis client makes (``route``, ``seal``, ``sealed``, ``snapshot``), each
    at whichever of ``addresses`` serves. Thread-safe."""

    def __init__(self, addresses: list[str], token: str, deadline: float = DEADLINE,
                 timeout: float = CALL_TIMEOUT) -> None:
        self.addresses, self.token, self.deadline, self.timeout = list(addresses), token, deadline, timeout
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}
        self._current = 0  # the index of the address that answered last
        self._moved = _moved()

    def _client(self, address: str) -> Any:
        from sediment.client import Client

        with self._lock:
            got = self._clients.get(address)
        if got is None:
            got = Client(address, self.token, timeout=self.timeout)
            with self._lock:
                got = self._clients.setdefault(address, got)
        return got

    def _drop(self, address: str) -> None:
        """Forget the client of ``address``: its streams end in the background, and it is closed
        once calls other threads make on it had their time (closing it under them fails them)."""
        with self._lock:
            got = self._clients.pop(address, None)
        if got is not None:
            threading.Thread(target=got.end_streams, daemon=True).start()
            closer = threading.Timer(self.timeout + 1.0, got.close)
            closer.daemon = True
            closer.start()

    def route(self, name: str | None, call: Callable[[Any], Any], *, retry_unknown: bool = True,
              unknown_outcome: bool = False) -> Any:
        """``call(client)`` at the serving coordinator (see the module doc)."""
        from sediment.errors import CoordinatorUnavailable, NothingWritten, OutcomeUnknown

        deadline = time.monotonic() + self.deadline
        uncertain: BaseException | None = None
        last: BaseException | None = None
        with self._lock:
            i = self._current
        tried = 0
        while True:
            address = self.addresses[i % len(self.addresses)]
            try:
                result = call(self._client(address))
                with self._lock:
                    self._current = i % len(self.addresses)
                return result
            except self._moved as err:
                last = err
                if not isinstance(err, NothingWritten):
                    if not retry_unknown:
                        raise
                    uncertain = err
                self._drop(address)
            i, tried = i + 1, tried + 1
            if time.monotonic() > deadline:
                break
            if tried % len(self.addresses) == 0:
                time.sleep(RETRY_PAUSE)
        if unknown_outcome and uncertain is not None:
            raise OutcomeUnknown(f"write to {name!r}: no coordinator of {self.addresses} acknowledged it within "
                                 f"{self.deadline:g} s (last: {type(uncertain).__name__}: {uncertain}); it may or may "
                                 "not have been applied") from None
        raise CoordinatorUnavailable(f"no coordinator of {self.addresses} answered for {name!r} within "
                                     f"{self.deadline:g} s (last: {type(last).__name__}: {last})") from None

    def seal(self, name: str, t: int) -> None:
        """``close t``, retried; after an attempt of unknown outcome, finding the relation sealed
        at or past ``t`` counts as done (FrontierRegression would claim nothing happened)."""
        from sediment.errors import FrontierRegression

        unknown: list[BaseException] = []

        def call(c: Any) -> None:
            try:
                c.seal(name, t)
            except FrontierRegression:
                if unknown and c.sealed(name) >= t:
                    return
                raise
            except self._moved as err:
                unknown.append(err)
                raise

        self.route(name, call, unknown_outcome=True)

    def sealed(self, name: str) -> int:
        return self.route(name, lambda c: c.sealed(name))

    def snapshot(self, name: str, as_of: int) -> Any:
        return self.route(name, lambda c: c.snapshot(name, as_of))

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()


def connect(uri: str, token: str) -> Failover:
    """``uri``: the coordinators' ``grpc://`` addresses, comma-separated."""
    return Failover(uri.split(","), token)
