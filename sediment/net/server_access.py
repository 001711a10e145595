"""Who may call a sediment server and where it listens: the shared token (no anonymous mode),
checked on every call before its handler runs, and the listen address checked against the TLS
setting. Kept apart from :mod:`sediment.server`, whose calls it guards."""

from __future__ import annotations

import hmac
import os
from typing import Any
from urllib.parse import urlparse

import pyarrow.flight as flight

from sediment import errors
from sediment.engine.args import check_str
from sediment.net.protocol import AUTH_HEADER, TOKEN_ENV


def resolve_token(token: str | None) -> str:
    """The shared secret: the argument, else ``$SEDIMENT_TOKEN``. There is no anonymous mode:
    a coordinator that accepts writes from anyone who can reach the port is a foot-gun."""
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    if not token:
        raise errors.InvalidArgument(f"no token for the sediment server: pass token=... (or --token), or set "
                                     f"${TOKEN_ENV}")
    return check_str(token, "token (the server's shared secret)", allow_none=False)


class BearerTokenMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Checks ``authorization: Bearer <token>`` on every call before its handler runs, so no
    RPC kind (including ones sediment does not implement) is reachable without the token."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[Any]]) -> None:
        for value in headers.get(AUTH_HEADER, []):
            given = value if isinstance(value, bytes) else str(value).encode()
            if hmac.compare_digest(given, self._expected):
                return None
        what = "a wrong" if headers.get(AUTH_HEADER) else "no"
        raise flight.FlightUnauthenticatedError(
            f"sediment server: {info.method} call with {what} token; send the server's token "
            f"(sediment.connect(uri, token=...) or ${TOKEN_ENV})")


def listen_location(location: str, tls: tuple[bytes, bytes] | None) -> tuple[str, Any]:
    """The location to listen on, checked (``grpc+tls://`` exactly when ``tls`` is given)."""
    check_str(location, "location (grpc://HOST:PORT to listen on)", allow_none=False)
    parsed = urlparse(location)
    if tls is not None and parsed.scheme == "grpc":  # the same address, served with TLS
        location = "grpc+tls" + location[len("grpc"):]
        parsed = urlparse(location)
    if parsed.scheme not in ("grpc", "grpc+tcp", "grpc+tls") or not parsed.hostname or parsed.port is None:
        raise errors.InvalidArgument(f"cannot serve on {location!r}: give grpc://HOST:PORT (PORT 0 picks a free port)")
    if (parsed.scheme == "grpc+tls") != (tls is not None):
        raise errors.InvalidArgument(f"cannot serve on {location!r}: grpc+tls:// needs tls=(cert, key), and TLS "
                                     "needs grpc+tls://")
    return location, parsed
